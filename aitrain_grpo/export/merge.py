"""Training outputs -> standalone Hugging Face model folders (`aitrain export RUN_DIR --to DIR`).

A LoRA output (of `grpo` or `sft`) is loaded onto its base (the one its adapter names; when that folder
is gone, the model run_config.json names, resolved again, or `--base`), merged with PEFT's
`merge_and_unload()` in float32, cast once to the asked dtype and saved with its tokenizer (chat
template included), generation config, run_config.json (so `aitrain eval --model DIR` finds the
environment; a checkpoint-N's is its run's) and `export_info.json` (source, base, dtype, the check's numbers). A full fine-tune output
is re-saved the same way, so dtype conversion applies to it too. Everything is written into a hidden
sibling folder, checked there and only then renamed to DIR: a failed or interrupted export never leaves
a half-written DIR.

Before the rename, export_check.py compares the written folder, loaded with plain transformers, with
the trained model (log-probabilities of a few fixed conversations); a mismatch removes the folder.

Left out: quantized exports (GGUF, GPTQ), sharding choices beyond transformers' defaults, merging on a
GPU (the merge runs on the CPU: it needs memory for the float32 model, roughly 4 bytes a parameter),
and proving that a fallback base is the one the run trained (only shapes are checked by PEFT).
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from dataclasses import asdict, dataclass, replace
from datetime import datetime, timezone
from pathlib import Path

from aitrain_grpo.errors import ConfigError, UserError, one_line
from aitrain_grpo.models.loading import (
    MAX_ADAPTER_CHAIN, ModelSource, load_causal_lm, looks_local, resolve_model, resolve_source, run_config_file,
)
from aitrain_grpo.outputs import check_folder_output
from aitrain_grpo.export.check import TOLERANCES, CheckResult, check_sequences, max_diff, token_logprobs

DTYPES = ("auto", "float32", "bfloat16", "float16")
INFO_FILE = "export_info.json"


class ExportCheckFailed(UserError):
    """The written model does not reproduce the trained one; DIR is left as it was (exit 1)."""

    exit_code = 1


@dataclass(frozen=True)
class ExportResult:
    folder: str
    source: str
    base: str | None  # the base model the adapter was merged into (None: a full model)
    check: CheckResult
    notes: tuple[str, ...] = ()  # what a person should know (a base found another way)


def check_destination(to: str, overwrite: bool, protected: list[Path]) -> Path:
    """DIR as a Path, by the rule every output follows (outputs.py): new or empty; with
    `overwrite`, only a folder this tool wrote; never a file, '.', home, or a folder holding or inside
    the run or base being read."""
    return check_folder_output(to, flag="--to", overwrite=overwrite, kind="export", reads=protected)


def resolve_run(run_dir: str, base: str | None) -> ModelSource:
    """The run output as a ModelSource, its base replaced by `base` when given; refuses what cannot be
    exported before anything heavy is loaded."""
    path = Path(run_dir).expanduser()
    if not path.is_dir():
        raise ConfigError(f"{run_dir} is not a directory; pass a training output directory (the --output-dir of grpo or sft)")
    source = resolve_source(str(path))
    if base:
        if not source.adapter:
            raise ConfigError(f"--base applies to LoRA outputs; {run_dir} holds a full model, which is exported as it is")
        source = replace(source, weights=resolve_model(base))
    if source.adapter and looks_local(source.weights) and not Path(source.weights).expanduser().exists():
        named = source.run_config.get("model")
        raise ConfigError(
            f"the base model of {run_dir} is not found ({source.weights}"
            + (f"; run_config.json names {named!r}" if named else "")
            + "); pass --base MODEL naming the model it was trained from (a folder, a hub id, 'tiny' or 'smollm2')"
        )
    return source


def base_note(source: ModelSource, base: str | None) -> str | None:
    """A note when the adapter is merged into another base than the folder its adapter_config.json names
    (that folder is gone and run_config.json's model was resolved again): say which was used."""
    if not source.adapter or base:
        return None
    named = json.loads((Path(source.adapter) / "adapter_config.json").read_text()).get("base_model_name_or_path")
    if not named or resolve_model(named) == source.weights:
        return None
    return (f"note: the adapter's base {named} is gone; merged into {source.weights} (the model run_config.json "
            f"names, {source.run_config.get('model')!r}); pass --base to choose another")


def config_dtype(weights: str) -> str:
    """The dtype a model's config.json records (following adapters down to their base), else float32."""
    from transformers import AutoConfig

    source = resolve_source(weights) if Path(weights).expanduser().is_dir() else None
    for _ in range(MAX_ADAPTER_CHAIN):
        if source is None or not source.adapter:
            break
        source = resolve_source(source.weights) if Path(source.weights).expanduser().is_dir() else None
    try:
        recorded = getattr(AutoConfig.from_pretrained(source.weights if source else weights), "dtype", None)
    except (OSError, ValueError):
        return "float32"
    name = str(recorded).removeprefix("torch.") if recorded is not None else "float32"
    return name if name in TOLERANCES else "float32"


def export_model(run_dir: str, to: str, *, dtype: str = "auto", base: str | None = None,
                 overwrite: bool = False) -> ExportResult:
    """Write the run output at `run_dir` to `to` as a standalone model and check it (module docstring).
    Raises ConfigError for bad input, ExportCheckFailed when the written model does not match."""
    if dtype not in DTYPES:
        raise ConfigError(f"--dtype {dtype} is not supported; use one of {', '.join(DTYPES)}")
    source = resolve_run(run_dir, base)
    note = base_note(source, base)
    protected = [Path(run_dir)] + ([Path(source.weights)] if looks_local(source.weights) else [])
    folder = check_destination(to, overwrite, protected)
    chosen = config_dtype(source.weights) if dtype == "auto" else dtype
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    try:
        tokenizer = AutoTokenizer.from_pretrained(source.tokenizer)  # saved as it is (no padding changes)
    except (OSError, ValueError, KeyError) as exc:
        raise ConfigError(f"could not load the tokenizer of {run_dir}: {one_line(exc)}") from None
    sequences = check_sequences(tokenizer)
    model = _load(source, run_dir)
    trained = token_logprobs(model, sequences)
    effect = merge_diff = None
    if source.adapter:
        with model.disable_adapter():
            effect = max_diff(token_logprobs(model, sequences), trained)
        model = model.merge_and_unload()
    merged = token_logprobs(model, sequences)
    if source.adapter:
        merge_diff = max_diff(merged, trained)
    if chosen != "float32":  # the weights rounded to the dtype, scored in float32 as the reloaded folder will be
        merged = token_logprobs(_round_weights(model, getattr(torch, chosen)), sequences)
    model = model.to(getattr(torch, chosen))
    temp = folder.parent / f".{folder.name}.tmp-{uuid.uuid4().hex[:8]}"
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        model.save_pretrained(str(temp))
        tokenizer.save_pretrained(str(temp))
        del model
        recorded = run_config_file(Path(run_dir).expanduser())  # a checkpoint-N's is its run's
        if recorded is not None:  # `aitrain eval --model DIR` finds the environment
            shutil.copyfile(recorded, temp / "run_config.json")
        reloaded = token_logprobs(AutoModelForCausalLM.from_pretrained(str(temp), dtype=torch.float32), sequences)
        check = CheckResult(chosen, int(trained.numel()), max_diff(reloaded, trained), TOLERANCES[chosen],
                            merge_diff, max_diff(reloaded, merged), effect)
        problem = check.problem()
        if problem:
            raise ExportCheckFailed(f"the exported model does not reproduce {run_dir}: {problem}; "
                                    f"{folder} was not written")
        result = ExportResult(str(folder.resolve()), str(Path(run_dir).resolve()),
                              source.weights if source.adapter else None, check, (note,) if note else ())
        info = {**asdict(result), "passed": True, "created": datetime.now(timezone.utc).isoformat(timespec="seconds")}
        (temp / INFO_FILE).write_text(json.dumps(info, indent=2) + "\n")
        _move_into_place(temp, folder)
    finally:
        shutil.rmtree(temp, ignore_errors=True)
    return result


def _load(source: ModelSource, run_dir: str):
    """The run's model in float32 as trained: the adapter-wrapped base (a PeftModel), or the full model."""
    import torch

    try:
        model = load_causal_lm(source.weights, dtype=torch.float32)  # an adapter base (sft output) is merged here
    except (OSError, ValueError, KeyError) as exc:
        fix = "pass --base MODEL naming the model it was trained from" if source.adapter else "is the run finished?"
        raise ConfigError(f"could not load {'the base model ' if source.adapter else ''}{source.weights} of {run_dir}: "
                          f"{one_line(exc)}; {fix}") from None
    if not source.adapter:
        return model.eval()
    from peft import PeftModel

    try:
        return PeftModel.from_pretrained(model, source.adapter).eval()
    except (OSError, ValueError, KeyError, RuntimeError) as exc:  # RuntimeError: shapes that do not fit the base
        raise ConfigError(f"the adapter in {run_dir} does not fit the base model {source.weights}: {one_line(exc)}; "
                          f"pass --base MODEL naming the model it was trained from") from None


def _round_weights(model, dtype):
    """Round the parameters to `dtype` in place, kept in float32. Buffers are left alone: rotary
    frequencies are not saved, and a reloaded model computes them in float32 again."""
    import torch

    with torch.no_grad():
        for parameter in model.parameters():
            parameter.copy_(parameter.to(dtype).float())
    return model


def _move_into_place(temp: Path, folder: Path) -> None:
    """Rename `temp` to `folder`; an existing `folder` (empty, or --overwrite) is moved aside first and
    removed only once the new one is in place."""
    aside = folder.parent / f".{folder.name}.old-{uuid.uuid4().hex[:8]}"
    if folder.exists():
        os.replace(folder, aside)
    os.replace(temp, folder)
    shutil.rmtree(aside, ignore_errors=True)


def hub_token() -> str | None:
    """The Hugging Face token `huggingface_hub` would use (HF_TOKEN, or a saved login), or None."""
    from huggingface_hub import get_token

    return os.environ.get("HF_TOKEN") or get_token()


def check_hub_repo(repo: str) -> str:
    """The token to push to `repo` with; ConfigError when there is none or `repo` is not a repo id."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(repo)
    except HFValidationError as exc:
        raise ConfigError(f"--push-to-hub {repo} is not a repository id ({one_line(exc)}); use NAME or ORG/NAME") from None
    token = hub_token()
    if not token:
        raise ConfigError(f"--push-to-hub {repo} needs a Hugging Face token; run `hf auth login` or set HF_TOKEN")
    return token


def push_to_hub(folder: str, repo: str, token: str) -> str:
    """Upload the exported folder to the model repository `repo` (created if missing); its URL."""
    from huggingface_hub import HfApi

    api = HfApi(token=token)
    url = api.create_repo(repo_id=repo, repo_type="model", exist_ok=True)
    api.upload_folder(folder_path=folder, repo_id=repo, repo_type="model",
                      commit_message=f"aitrain export of {Path(folder).name}")
    return str(url)
