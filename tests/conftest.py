"""Shared fixtures: one torch thread (two cores here; two threads make steps 10x slower), the tiny
local model built once per session, and helpers to run the `aitrain` CLI as a user would."""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import subprocess
import sys
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
