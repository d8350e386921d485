"""What an option's value may be, apart from which options exist (config.py): numeric ranges (`Bound`,
declared in a field's metadata and checked by `config.check_options` with one message shape) and the
options written as text that are parsed (`server_urls`, `reward_func_specs`, `reward_weights`,
`template_kwargs`;
`RunConfig` parses each once, and every user reads its parsed form), the judge's options
(`check_judge`, which reads no file beyond checking the rubric's exists), and the metrics a held-back
evaluation logs, which `--save-best` may name (`eval_metrics`, `check_save_best`), and each value's type
against its field's annotation (`typed_values`).

Left out: rules that relate options to each other (`RunConfig.validate`).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from aitrain_grpo.errors import ConfigError, parsed_json

REWARD_FUNC_EXAMPLE = "aitrain_grpo.rewards:length_penalty"


@dataclass(frozen=True)
class Bound:
    """A numeric option's range, checked by `check_options` with one message shape:
    "--flag must be <range> (<note>), got <value>". `integer` also checks the type (a run_config.json or
    a Python caller can hand in anything); `unit` names what the number counts ("positive seconds")."""

    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    integer: bool = False
    unit: str = ""
    note: str = ""

    def describe(self) -> str:
        if self.integer and self.high is None:
            return "a positive integer" if self.low == 1 else f"an integer >= {_number(self.low)}"
        if self.integer and self.low == 1:
            return f"a positive integer up to {_number(self.high)}"
        if self.high is None:
            if self.low == 0:
                word = "positive" if self.low_open else ">= 0"
            else:
                word = f"{'>' if self.low_open else '>='} {_number(self.low)}"
            return f"{word} {self.unit}".strip()
        low = "-inf" if self.low is None else _number(self.low)
        return f"in {'(' if self.low_open else '['}{low}, {_number(self.high)}{')' if self.high_open else ']'}"

    def holds(self, value: Any) -> bool:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return False
        if self.integer and not isinstance(value, int):
            return False
        if self.low is not None and (value <= self.low if self.low_open else value < self.low):
            return False
        return self.high is None or (value < self.high if self.high_open else value <= self.high)


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


def at_least(low: int) -> Bound:
    """An integer option's smallest value."""
    return Bound(low=low, integer=True)


def count(high: int, note: str) -> Bound:
    """A count (episodes, passes, a rank, a port) from 1 up to `high`: a value past it is a typo or a size
    no machine holds (`--batch-size 1000000000000` filled memory before saying anything), so it is
    refused in one line before anything loads."""
    return Bound(low=1, high=high, integer=True, note=note)


def check_bound(flag: str, bound: Bound, value: Any) -> None:
    """Raise `ConfigError` "--flag must be <range> (<note>), got <value>" when `value` is outside `bound`:
    the one message of every range check (`config.check_options`, `check_seed`)."""
    if not bound.holds(value):
        note = f" ({bound.note})" if bound.note else ""
        raise ConfigError(f"{flag} must be {bound.describe()}{note}, got {value!r}")


# Every command's --seed (grpo, sft, eval, env check, tiny-model): numpy's RandomState takes 0 <= seed < 2**32,
# and a seed outside it was a numpy traceback in eval, silently taken by env check and tiny-model.
SEED = Bound(low=0, high=2**32 - 1, integer=True, note="numpy takes seeds in that range")


def check_seed(seed: Any, flag: str = "--seed") -> None:
    """The seed rule of every command: an integer from 0 to 2**32 - 1, else one line naming --seed and the range."""
    check_bound(flag, SEED, seed)


POSITIVE = Bound(low=0, low_open=True)
NON_NEGATIVE = Bound(low=0)
POSITIVE_SECONDS = Bound(low=0, low_open=True, unit="seconds")


def reward_func_specs(text: str | None) -> list[tuple[str, str]]:
    """`--rl-reward-funcs module:func[,module:func...]` as (module, attribute) pairs, checked for form
    only (importing is training/rewards/functions.py's). The attribute's name is what TRL logs it under, so two
    with one name, or one named like the environment's score, are refused."""
    specs: list[tuple[str, str]] = []
    for entry in (text or "").split(",") if (text or "").strip() else []:
        module, colon, attr = entry.strip().partition(":")
        if not (colon and module.strip() and attr.strip().isidentifier()):
            raise ConfigError(f"--rl-reward-funcs entry {entry.strip()!r} is not module:function; write e.g. "
                              f"{REWARD_FUNC_EXAMPLE} (entries separated by commas)")
        name = attr.strip()
        if name == "episode_score" or name in [a for _, a in specs]:
            raise ConfigError(f"--rl-reward-funcs has two rewards named {name!r} (rewards are logged by name, and "
                              f"episode_score is the environment's); bind one to another name in your module, "
                              f"e.g. my_{name} = {name}")
        specs.append((module.strip(), name))
    return specs


def reward_weights(text: str | None, num_funcs: int, judge: bool = False,
                   reward_model: bool = False) -> list[float] | None:
    """`--rl-reward-weights w_env,w1,...` as floats, one per reward (the environment's score first, then
    `num_funcs` functions', the judge's when `judge`, the reward model's last when `reward_model`); None
    when not given (every weight 1)."""
    if text is None or not str(text).strip():
        return None
    weights = []
    for entry in str(text).split(","):
        try:
            weight = float(entry)
        except ValueError:
            weight = math.nan
        if not math.isfinite(weight):
            raise ConfigError(f"--rl-reward-weights entry {entry.strip()!r} is not a number; write numbers separated "
                              f"by commas, the environment's score first, e.g. 1,0.5")
        weights.append(weight)
    expected = num_funcs + 1 + judge + reward_model
    if len(weights) != expected:
        then = (", then the judge's" if judge else "") + (", then the reward model's" if reward_model else "")
        raise ConfigError(f"--rl-reward-weights has {len(weights)} weight(s) for {expected} reward(s) "
                          f"(the environment's score, then {num_funcs} from --rl-reward-funcs{then}); give one "
                          f"per reward, the environment's score first")
    return weights


TEMPLATE_KWARGS_EXAMPLE = '\'{"enable_thinking": false}\''


def template_kwargs(value: Any) -> dict[str, Any]:
    """`--chat-template-kwargs` as the keyword arguments of the chat template: a JSON object (or a dict from a
    config file or a run_config.json); {} when not given."""
    if value is None or isinstance(value, str) and not value.strip():
        return {}
    if isinstance(value, str):
        value = parsed_json(value, "--chat-template-kwargs", f"write a JSON object, e.g. {TEMPLATE_KWARGS_EXAMPLE}")
    if not isinstance(value, dict) or not all(isinstance(key, str) for key in value):
        raise ConfigError(f"--chat-template-kwargs must be a JSON object of the template's variables, got "
                          f"{type(value).__name__}; write e.g. {TEMPLATE_KWARGS_EXAMPLE}")
    return dict(value)


def server_urls(text: str | None) -> list[str]:
    """`--vllm-server-url URL1,URL2,...` as a list of URLs, checked for form (http or https, each once)."""
    urls = [url.strip().rstrip("/") for url in (text or "").split(",") if url.strip()]
    for url in urls:
        if not url.startswith(("http://", "https://")):
            raise ConfigError(f"--vllm-server-url entry {url!r} is not an http:// or https:// URL; write e.g. "
                              f"http://127.0.0.1:8000 (several separated by commas)")
    if len(set(urls)) < len(urls):
        raise ConfigError(f"--vllm-server-url names a server twice ({text}); name each server once")
    return urls


JUDGE_OPTIONS = ("rl_judge_model", "rl_judge_url", "rl_judge_api_key_env")
JUDGE_DEFAULTS = (("rl_judge_mode", "group"), ("rl_judge_fallback", 0.0))  # set to another value: the judge is meant


def check_judge(options: dict[str, Any], reward_names: list[str], environ: dict[str, str]) -> None:
    """The judge's options (training/rewards/judge.py) against each other: the rubric turns the judge on, it
    needs a model, a URL needs its form, and the API key's variable must be a name that is set. The
    key's value is never put in a message (a key pasted in place of the name is not echoed)."""
    rubric = options.get("rl_judge_rubric")
    given = [name for name in JUDGE_OPTIONS if options.get(name)]
    given += [name for name, default in JUDGE_DEFAULTS if options.get(name) not in (None, default)]
    if not rubric:
        if given:
            raise ConfigError(f"--{given[0].replace('_', '-')} needs --rl-judge-rubric (the judge's rubric: text, "
                              f"or @file)")
        return
    if isinstance(rubric, str) and rubric.startswith("@") and Path(rubric[1:]).expanduser().is_dir():
        raise ConfigError(f"--rl-judge-rubric {rubric}: that is a folder; name the rubric's file in it, "
                          f"@path/to/rubric.txt")
    if isinstance(rubric, str) and rubric.startswith("@") and not Path(rubric[1:]).expanduser().is_file():
        raise ConfigError(f"--rl-judge-rubric {rubric}: no such file; write the rubric as text or @path/to/rubric.txt")
    if not options.get("rl_judge_model"):
        raise ConfigError("--rl-judge-rubric needs --rl-judge-model: self (the run's base model), a model path, "
                          "or with --rl-judge-url the served model's name")
    url, key_env = options.get("rl_judge_url"), options.get("rl_judge_api_key_env")
    if url and not str(url).startswith(("http://", "https://")):
        raise ConfigError(f"--rl-judge-url {url!r} is not an http:// or https:// URL; write e.g. http://127.0.0.1:8000/v1")
    if key_env:
        if not url:
            raise ConfigError("--rl-judge-api-key-env needs --rl-judge-url (an in-process judge takes no key)")
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", str(key_env)):
            raise ConfigError("--rl-judge-api-key-env takes the name of an environment variable that holds the key "
                              "(e.g. OPENAI_API_KEY), not the key itself")
        if not environ.get(key_env):
            raise ConfigError(f"--rl-judge-api-key-env {key_env}: that environment variable is not set; export it "
                              f"before the run")
    if "judge" in reward_names:
        raise ConfigError("--rl-reward-funcs has a reward named 'judge', the name the judge is logged under; bind it "
                          "to another name in your module")


# The metrics a held-back evaluation logs (evaluation/held_back.py names its numbers from here), each with
# whether a higher value is better, which is how `--save-best` compares them: more score, success and
# pass@k is better; fewer turns, tool errors, truncated episodes and environment errors is (a cost, for the
# same success).
EVAL_METRICS = {"mean_score": True, "success": True, "pass@{k}": True, "turns": False, "tool_errors": False,
                "truncated": False, "errors": False}


def eval_metrics(samples: int) -> dict[str, bool]:
    """`eval/<name>` -> higher is better, for an evaluation of `samples` episodes a task (k of pass@k)."""
    return {f"eval/{name.format(k=samples)}": higher for name, higher in EVAL_METRICS.items()}


def check_save_best(metric: str | None, eval_every: int, samples: int) -> None:
    """`--save-best` must name a metric the run logs: one of `eval_metrics`, and only with `--eval-every`."""
    if metric is None:
        return
    allowed = ", ".join(eval_metrics(samples))
    if not eval_every:
        raise ConfigError(f"--save-best {metric}: the run logs no eval/* metric without --eval-every N (held-back "
                          f"evaluation every N steps); with it, --save-best takes one of {allowed}")
    if metric not in eval_metrics(samples):
        raise ConfigError(f"--save-best {metric} is not a metric the held-back evaluation logs; use one of {allowed}")


def typed_values(config: Any) -> dict[str, Any]:
    """Values from a config file (or a Python caller) arrive as YAML/JSON typed them; check each field of
    the dataclass `config` against its annotation, and return those read anew: numbers written as strings
    in float fields (YAML 1.1 reads `1e-5` as a string), and a repeated flag given once (`--rl-env A`) as
    the plain value."""
    typed: dict[str, Any] = {}
    for f in fields(config):
        value = getattr(config, f.name)
        kinds = {k.strip() for k in str(f.type).split("|")}
        if "Any" in kinds or (value is None and "None" in kinds):
            continue
        flag, shown = "--" + f.name.replace("_", "-"), repr(value)[:60]
        if "bool" in kinds:
            ok = isinstance(value, bool)
        elif "int" in kinds:
            ok = isinstance(value, int) and not isinstance(value, bool)
        elif "float" in kinds:
            if isinstance(value, str):
                try:
                    value = float(value)
                except ValueError:
                    pass
            ok = isinstance(value, (int, float)) and not isinstance(value, bool)
            if ok and not math.isfinite(value):
                raise ConfigError(f"{flag} must be a finite number, got {shown}")
            if ok:
                typed[f.name] = float(value)
        elif "list[str]" in kinds and isinstance(value, (list, tuple)):  # --rl-env repeated
            ok = all(isinstance(v, str) for v in value)
            if ok:  # one spec is the plain form; none is not given
                typed[f.name] = value[0] if len(value) == 1 else list(value) or None
        else:
            ok = isinstance(value, str)
        if not ok:
            wanted = next(k for k in ("bool", "int", "float", "str") if k in kinds)
            names = {"bool": "true or false", "int": "an integer", "float": "a number", "str": "a string"}
            raise ConfigError(f"{flag} must be {names[wanted]}, got {shown} ({type(value).__name__})")
    return typed
