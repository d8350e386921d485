"""Which generation backend a run uses, and everything it needs from TRL and from a vLLM server.

- `hf` (default): the training model's own `generate`.
- `vllm colocate`: TRL builds the in-process vLLM engine (`use_vllm=True, vllm_mode="colocate"`). On
  CUDA TRL pushes the weights into it before each rollout; elsewhere its push cannot work (repacked
  CPU kernels) and `weight_sync.ColocateWeightSync` reloads them instead (sync "reload").
- `vllm server`: a server started by `aitrain vllm-serve`, reached over HTTP. With `--vllm-sync nccl`
  TRL's client moves the weights (GPU only; TRL is told `vllm_mode="server"`); with `lora` or `disk`
  this package does it through a shared folder (`rollout/weight_sync.py`) and TRL is not told about vLLM.

In every vLLM mode the importance-sampling correction compares the sampler's log-probabilities with
the trainer's (`sampling/importance_sampling_ratio`, step/scoring.py). Where this package moves the
weights, the trainer still turns TRL's correction on (`external_weight_sync`); where TRL can (CUDA), its
engine pushes them when the step asks (rollout/weight_sync.py `TRLWeightPush`).

`check_server` runs before any model is loaded: a server that is down (its wait printed every few
seconds), serves another model, or a colocated vLLM that cannot take weights on this platform is a
one-line `ConfigError` rather than a failure minutes into the run. With several servers
(`--vllm-server-url A,B`) each is checked, and named when wrong; they are then one `ServerPool`
(engine/backends/server_pool.py), and NCCL, which reaches one server, is refused (`auto` picks disk).

Left out: the backends themselves and building them (engine/backends/, `build_backend`, shared with
evaluation) and the sync mechanics (rollout/weight_sync.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from aitrain_grpo.config import RunConfig
from aitrain_grpo.engine.backends.choice import build_backend, require_vllm
from aitrain_grpo.engine.backends.vllm_server import GenerationServerError, VLLMServerClient, wait_for_server
from aitrain_grpo.errors import ConfigError


@dataclass(frozen=True)
class GenerationPlan:
    backend: str  # "hf", "vllm_colocate" or "vllm_server"
    sync: str | None  # vllm_colocate: "trl" or "reload"; vllm_server: "nccl", "lora" or "disk"

    @property
    def trl_uses_vllm(self) -> bool:
        """Whether TRL itself must own a vLLM engine or connection (GRPOConfig use_vllm)."""
        return self.backend == "vllm_colocate" or (self.backend == "vllm_server" and self.sync == "nccl")

    @property
    def external_weight_sync(self) -> bool:
        """Whether this package, not TRL, moves the weights into vLLM (TRL's push is then kept off)."""
        return self.backend != "hf" and self.sync not in ("trl", "nccl")


def plan_generation(config: RunConfig) -> GenerationPlan:
    from aitrain_grpo.training.rollout.weight_sync import choose_sync_method

    if not config.use_vllm:
        return GenerationPlan("hf", None)
    cuda = torch.cuda.is_available()
    if config.vllm_mode == "colocate":
        return GenerationPlan("vllm_colocate", "trl" if cuda else "reload")
    several = len(config.vllm_servers) > 1
    if several and config.vllm_sync == "nccl":
        raise ConfigError("--vllm-sync nccl reaches one server (TRL's NCCL client), and --vllm-server-url names "
                          "several; use --vllm-sync lora (with --peft) or disk, or one server")
    sync = choose_sync_method(config.vllm_sync, peft=config.peft, cuda=cuda,
                              adapter_for_vllm=config.adapter_for_vllm)
    if several and sync == "nccl":  # auto: NCCL reaches one server; a folder reaches them all
        sync = "disk"
    if sync == "nccl" and not cuda:
        raise ConfigError("--vllm-sync nccl needs CUDA on the trainer; on this machine use --vllm-sync lora (with --peft) or disk")
    if sync == "lora" and not config.peft:
        raise ConfigError("--vllm-sync lora needs a LoRA adapter to send; drop --no-peft or use --vllm-sync disk")
    return GenerationPlan("vllm_server", sync)


def grpo_kwargs(config: RunConfig, plan: GenerationPlan) -> dict[str, Any]:
    """The GRPOConfig options that depend on the generation backend."""
    if not plan.trl_uses_vllm:
        # For lora/disk the trainer turns use_vllm on after TRL built nothing (external_weight_sync).
        return {"use_vllm": False, "vllm_importance_sampling_correction": plan.backend == "vllm_server"}
    kwargs: dict[str, Any] = {
        "use_vllm": True,
        "vllm_mode": "colocate" if plan.backend == "vllm_colocate" else "server",
        "vllm_importance_sampling_correction": True,
    }
    if plan.backend == "vllm_colocate":
        kwargs.update(
            vllm_gpu_memory_utilization=config.vllm_gpu_memory_utilization,
            vllm_tensor_parallel_size=config.vllm_tensor_parallel_size,
        )
    else:
        kwargs.update(vllm_server_base_url=config.vllm_servers[0], vllm_server_timeout=config.vllm_server_timeout)
    return kwargs


def sampling_warning(config: RunConfig, plan: GenerationPlan) -> str | None:
    """vLLM reports log-probabilities of the filtered, renormalised distribution, while TRL scores the
    trainer's tokens without top-k/top-p; the importance-sampling ratio is then biased below 1
    (measured on the tiny model: mean 0.015 with top-k 50, 0.99 with top-k 0)."""
    altered = config.rl_top_k or config.rl_top_p < 1.0 or config.rl_min_p or config.rl_repetition_penalty != 1.0
    if plan.backend != "hf" and altered:  # the correction runs in every vLLM mode
        return (
            "warning: --rl-top-k/--rl-top-p/--rl-min-p filtering or --rl-repetition-penalty with vLLM biases TRL's "
            "importance-sampling correction; use --rl-top-k 0 --rl-top-p 1.0 --rl-min-p 0 --rl-repetition-penalty 1 "
            "unless you need them"
        )
    return None


def check_server(config: RunConfig, plan: GenerationPlan) -> None:
    """Before loading anything: the server answers and serves the model being trained."""
    if plan.backend == "vllm_colocate":
        require_vllm("--use-vllm --vllm-mode colocate")
        if plan.sync == "reload":
            from aitrain_grpo.training.rollout.weight_sync import colocate_reload_problem

            problem = colocate_reload_problem()
            if problem:
                raise ConfigError(problem)
    if plan.backend != "vllm_server":
        return
    expected = served_name(config.model)
    for url in config.vllm_servers:
        client = VLLMServerClient(url, retries=0)
        try:
            wait_for_server(client, config.vllm_server_timeout, timeout_flag="--vllm-server-timeout",
                            hint=f"start it with `aitrain vllm-serve --model {config.model}` or fix --vllm-server-url")
            served = client.served_models()
        except GenerationServerError as exc:
            raise ConfigError(str(exc)) from None
        if expected not in served:
            shown = ", ".join(served) or "nothing"
            raise ConfigError(
                f"the vLLM server at {client.base_url} serves {shown}, not {expected}; "
                f"start it with `aitrain vllm-serve --model {config.model}`"
            )


def served_name(model: str) -> str:
    """The name `aitrain vllm-serve --model M` serves M under (its resolved path or hub id)."""
    from aitrain_grpo.models.loading import resolve_model

    return resolve_model(model)


def make_backend(trainer, config: RunConfig, plan: GenerationPlan, stop_ids: list[int]):
    """Build the backend for a trainer; returns (backend, weight_sync or None). Where TRL moves the
    weights (colocate on CUDA, server with nccl) the sync asks TRL's engine to push them, once per
    optimizer step (TRL's own generation call, which used to push them, is not on the step's path)."""
    from aitrain_grpo.training.trl.access import generation_handles  # imports TRL

    served_model = served_name(config.model) if plan.backend == "vllm_server" else None
    backend = build_backend(plan.backend, stop_ids, **generation_handles(trainer, plan.backend),  # plain objects
                            server_urls=config.vllm_servers, served_model=served_model,
                            server_timeout=config.vllm_server_timeout)
    from aitrain_grpo.training.rollout.weight_sync import ColocateWeightSync, FolderWeightSync, TRLWeightPush

    if plan.backend == "hf":
        return backend, None
    if not plan.external_weight_sync:
        return backend, TRLWeightPush()

    if plan.backend == "vllm_colocate":
        return backend, ColocateWeightSync(backend.llm)
    sync_dir = Path(config.vllm_sync_dir) if config.vllm_sync_dir else config.resolved_output_dir() / "vllm-sync"
    return backend, FolderWeightSync(plan.sync, backend, sync_dir, base_model=served_model)


def training_devices(visible: list[str], server_gpus: int) -> list[str]:
    """The GPUs training keeps when a local vLLM server took the first `server_gpus` of `visible`
    (the recipe `aitrain vllm-serve` on GPUs 0..N-1, training on the rest). Never leaves training none."""
    if server_gpus <= 0 or len(visible) <= server_gpus:
        return visible
    return visible[server_gpus:]


def colocate_rendezvous_port(plan: GenerationPlan, environ: dict[str, str] | None = None) -> str | None:
    """For a colocated engine in a single process, set MASTER_PORT to a port the OS hands out, unless
    one is set. TRL sets it otherwise from a fixed list that starts at 29500, checked and then bound:
    two runs starting at once on one machine both find 29500 free and the second engine's start fails
    with EADDRINUSE (seen with two runs side by side). Under a launcher (WORLD_SIZE > 1) the launcher's
    port stands. Returns the port set, or None."""
    import os
    import socket

    environ = os.environ if environ is None else environ
    if plan.backend != "vllm_colocate" or environ.get("MASTER_PORT") or int(environ.get("WORLD_SIZE", "1") or 1) > 1:
        return None
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        environ["MASTER_PORT"] = str(sock.getsockname()[1])
    return environ["MASTER_PORT"]


def reserve_server_gpus(config: RunConfig, environ: dict[str, str] | None = None) -> str | None:
    """For a server on this machine, hide its GPUs from training by setting CUDA_VISIBLE_DEVICES (before
    CUDA starts). Skipped when the user set CUDA_VISIBLE_DEVICES or the server is on another machine.
    Under `accelerate launch` each process then counts its device from the first kept GPU. Returns the
    new value, or None when nothing changed."""
    import os
    import shutil
    import subprocess
    from urllib.parse import urlparse

    environ = os.environ if environ is None else environ
    if not (config.use_vllm and config.vllm_mode == "server" and config.vllm_server_url):
        return None
    local = [url for url in config.vllm_servers if urlparse(url).hostname in ("127.0.0.1", "localhost", "::1")]
    if "CUDA_VISIBLE_DEVICES" in environ or not local:
        return None
    if shutil.which("nvidia-smi") is None:
        return None
    listed = subprocess.run(["nvidia-smi", "--query-gpu=index", "--format=csv,noheader"], capture_output=True, text=True)
    visible = [line.strip() for line in listed.stdout.splitlines() if line.strip()]
    kept = training_devices(visible, config.vllm_server_gpus)
    if kept == visible:
        return None
    environ["CUDA_VISIBLE_DEVICES"] = ",".join(kept)
    return environ["CUDA_VISIBLE_DEVICES"]
