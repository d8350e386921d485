"""A `--config` file of options (YAML or JSON) read into a dict of RunConfig field names.

Why apart from config.py: reading a file (its form, its text, YAML or JSON, a list where a flag takes a
comma-separated one, the plural spelling of the server list, keys no option has) is one concern, and RunConfig's is what the options are. A key another
trainer uses for one of ours (TRL's `learning_rate`, axolotl's `base_model`) is refused with our name for
it (peer_options.py); any other unknown key with the closest option name.

Left out: the values' types and ranges (RunConfig.validate checks those, as for flags).
"""

from __future__ import annotations

import difflib
import json
from pathlib import Path
from typing import Any

from aitrain_grpo.errors import ConfigError, one_line
from aitrain_grpo.peer_options import peer_name_hint


# Options whose flag takes a comma-separated list, and an example of one; a file may give a list instead.
_EXAMPLES = {"vllm_server_url": ("http://127.0.0.1:8000", "http://127.0.0.1:8001"),
             "target_modules": ("q_proj", "v_proj"), "lora_modules_to_save": ("lm_head",),
             "rl_env_weights": ("0.7", "0.3")}
_COMMA_LISTS = tuple(_EXAMPLES)


def read_options_file(path: str | Path, field_names: list[str]) -> dict[str, Any]:
    """The options in the YAML or JSON file at `path`, keys with - or _ both taken; `field_names`: the
    options that exist."""
    path = Path(path)
    if path.is_dir():
        raise ConfigError(f"config file {path} is a folder; pass a YAML or JSON file to --config")
    if not path.is_file():
        raise ConfigError(f"config file {path} does not exist; pass an existing YAML or JSON file to --config")
    if path.suffix.lower() not in (".yaml", ".yml", ".json"):
        raise ConfigError(f"config file {path} has the extension {path.suffix or '(none)'!r}, which is not read; "
                          f"write the options as YAML (.yaml, .yml) or JSON (.json)")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise ConfigError(f"config file {path} is not UTF-8 text; pass a YAML or JSON file") from None
    try:
        if path.suffix.lower() in (".yaml", ".yml"):
            import yaml

            data = yaml.safe_load(text)
        else:
            data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"config file {path} is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None
    except RecursionError:
        raise ConfigError(f"config file {path} is nested too deeply; options are a flat mapping") from None
    except Exception as exc:  # yaml.YAMLError and friends
        detail = one_line(exc)
        raise ConfigError(f"config file {path} is not valid YAML: {detail}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must hold a mapping of option names to values, not {type(data).__name__}")
    options = {str(k).replace("-", "_"): v for k, v in data.items()}
    if "vllm_server_urls" in options:  # the plural spelling, for a list of servers
        if "vllm_server_url" in options:
            raise ConfigError(f"config file {path} gives both vllm_server_url and vllm_server_urls; keep one")
        options["vllm_server_url"] = options.pop("vllm_server_urls")
    for name in _COMMA_LISTS:  # a YAML/JSON list where the flag takes a comma-separated one: the flag's form
        value = options.get(name)
        if isinstance(value, list):
            if not all(isinstance(item, (str, int, float)) and not isinstance(item, bool) for item in value):
                raise ConfigError(f"config file {path}: {name} is a list of {value!r}; give names or numbers, "
                                  f"e.g. [{', '.join(_EXAMPLES[name])}] or \"{','.join(_EXAMPLES[name])}\"")
            options[name] = ",".join(str(item) for item in value)
    unknown = sorted(set(options) - set(field_names))
    if unknown:
        hints = []
        for key in unknown:
            close = difflib.get_close_matches(key, field_names, n=1)
            peer = peer_name_hint(key, as_flag=False)
            hints.append(f"{key} ({peer})" if peer else f"{key} (did you mean {close[0]}?)" if close else key)
        raise ConfigError(f"config file {path} has unknown option(s): {'; '.join(hints)}")
    return options
