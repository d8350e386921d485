"""`aitrain eval --use-vllm` builds its engine as TRL builds a training run's colocated engine, so that the
two play the same kernels: a run's held-back evaluation and `aitrain eval` on its weights then agree on any
CPU (on an AVX2 CPU an eager engine changed greedy tokens where TRL's compiled one did not). A TRL release
that builds its engine otherwise (another batch token limit, log-probability mode, or eager graphs) fails
here, before the two quietly part; the behaviour itself is tests/test_held_back_vllm.py's (extras)."""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

from aitrain_grpo.evaluation.evaluate import TRL_ENGINE_SETTINGS


def trl_engine_keywords() -> dict[str, ast.expr]:
    """The keyword arguments of the `LLM(...)` call in TRL's colocated generation, read from its source."""
    source = Path(importlib.util.find_spec("trl.generation.vllm_generation").origin).read_text()
    calls = [node for node in ast.walk(ast.parse(source))
             if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "LLM"]
    assert len(calls) == 1, f"TRL builds {len(calls)} vLLM engines; expected the colocated one"
    return {keyword.arg: keyword.value for keyword in calls[0].keywords}


def test_eval_builds_its_vllm_engine_with_the_settings_of_trls_colocated_engine():
    keywords = trl_engine_keywords()
    for name, value in TRL_ENGINE_SETTINGS.items():
        assert isinstance(keywords.get(name), ast.Constant) and keywords[name].value == value, (
            f"TRL's engine has {name}={ast.unparse(keywords[name]) if name in keywords else 'unset'}, eval {value!r}")
    assert "enforce_eager" not in keywords  # TRL's graphs are compiled: eval's must be too
