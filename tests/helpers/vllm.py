"""Real vLLM servers for tests: `aitrain vllm-serve` started on a free port (`start_vllm_serve`; the
`vllm_server` fixture in conftest.py shares one per module), and the log-probabilities a server and a
model give the same tokens, to tell whether a server holds the trainer's weights."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from aitrain_grpo.engine.backends.base import SamplingParams
from aitrain_grpo.engine.backends.vllm_server import VLLMServerClient
from helpers import PORT_CLASH_MARKERS, REPO, free_port


def _start_vllm_serve_once(model: str, log: Path) -> tuple[subprocess.Popen, str] | None:
    """`aitrain vllm-serve` on a free port, once healthy; None when another process took the port first
    (vLLM binds it before loading the model, so such a server exits at once)."""
    port = free_port()
    # Importing TRL (any earlier test does) sets VLLM_LOGGING_LEVEL=ERROR in this process; the server's
    # INFO lines are what tests read its adapter loads from.
    env = dict(os.environ, OMP_NUM_THREADS="1", VLLM_CPU_KVCACHE_SPACE="1", VLLM_LOGGING_LEVEL="INFO")
    with open(log, "wb") as sink:
        process = subprocess.Popen(
            [sys.executable, "-m", "aitrain_grpo", "vllm-serve", "--model", model, "--port", str(port), "--enable-lora", "--enforce-eager"],
            stdout=sink, stderr=subprocess.STDOUT, env=env, cwd=str(REPO),
        )
    url = f"http://127.0.0.1:{port}"
    client = VLLMServerClient(url, retries=0)
    deadline = time.monotonic() + 300
    while process.poll() is None and not client.is_healthy():
        if time.monotonic() > deadline:
            process.kill()
            pytest.fail(f"aitrain vllm-serve did not come up:\n{log.read_text()[-3000:]}")
        time.sleep(1)
    if process.poll() is None:
        return process, url
    if any(marker in log.read_text() for marker in PORT_CLASH_MARKERS):
        return None
    pytest.fail(f"aitrain vllm-serve exited with {process.returncode}:\n{log.read_text()[-3000:]}")


def start_vllm_serve(model: str, log: Path, attempts: int = 4) -> tuple[subprocess.Popen, str]:
    """A healthy `aitrain vllm-serve` (LoRA on, eager) and its URL, on a port no other process holds."""
    for _ in range(attempts):
        started = _start_vllm_serve_once(model, log)
        if started is not None:
            return started
    pytest.fail("every port picked for aitrain vllm-serve was taken by another process")


def server_logprobs(url: str, model: str, prompt_ids: list[int], tokens: int = 12) -> tuple[list[int], list[float]]:
    sample = VLLMServerClient(url).complete(model, [prompt_ids], tokens, SamplingParams(temperature=0), stop_ids=[])[0]
    return sample.token_ids, sample.logprobs


def model_logprobs(model, prompt_ids: list[int], token_ids: list[int]) -> list[float]:
    with torch.no_grad():
        logits = model(torch.tensor([prompt_ids + token_ids])).logits[0, len(prompt_ids) - 1:-1].float()
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(token_ids)[:, None])[:, 0].tolist()


def fixed_prompt(tokenizer) -> list[int]:
    text = tokenizer.apply_chat_template([{"role": "user", "content": "Task 3: write something with many as."}], tokenize=False, add_generation_prompt=True)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def in_sync(ratio: float) -> bool:
    """An importance-sampling ratio mean of a server that holds the trainer's weights. The server samples in
    bfloat16 on a CPU and the trainer scores in float32, so at lr 1e-2 the tiny model's ratio wanders, and
    the mean of exp(difference) more upward than down: 0.78-1.03 measured after syncs on an AVX-512 CPU,
    0.74-1.68 with vLLM's AVX2 kernels (bfloat16 without hardware support); a server left on stale weights
    gives 0.004-0.11 (the stale tests), a factor of 3 below the band."""
    return 1 / 3 <= ratio <= 3.0


def stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=120)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def kill_hard(process: subprocess.Popen) -> None:
    """SIGKILL the server `aitrain vllm-serve` started (its own process group) and the command itself: a
    server that dies without a goodbye (an OOM kill, a lost node)."""
    import psutil  # accelerate's dependency, not ours

    for child in psutil.Process(process.pid).children():
        try:
            os.killpg(child.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    process.kill()
    process.wait()
