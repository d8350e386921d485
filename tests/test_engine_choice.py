"""The engine a run generates with when it does not say (training/rollout/engine_choice.py): colocated vLLM
where it was measured faster per step (a CPU with AVX-512, vLLM installed, one process), a named server,
else Hugging Face generate; the run prints which and why and records it in run_config.json. The machine
kinds this suite cannot be (a GPU, an AVX2 CPU, several processes) are given to the choice as facts; the
run on this machine is checked end to end (tests/test_vllm_colocate.py with vLLM installed)."""

from __future__ import annotations

import importlib.util
import json

import pytest

from aitrain_grpo import RunConfig
from aitrain_grpo.training.rollout.engine_choice import Machine, choose_engine
from helpers import run_cli

LETTERS = ("--rl-env-module", "envs.letters", "--rl-env-class", "LetterEnv")
LETTERS_CONFIG = {"rl_env_module": "envs.letters", "rl_env_class": "LetterEnv"}
CPU_WITH_VLLM = Machine(vllm=True, cuda=False, cpu="AVX512", processes=1)


def chosen(machine: Machine, problem: str | None = None, **options):
    config, choice = choose_engine(RunConfig(**options), lambda: machine, lambda _config: problem)
    return config.use_vllm, config.vllm_mode, choice.reason


def test_an_avx512_cpu_with_vllm_colocates_it():
    use_vllm, mode, reason = chosen(CPU_WITH_VLLM)
    assert (use_vllm, mode) == (True, "colocate")
    assert "ENGINE_CHOICE.md" in reason and "--no-use-vllm" in reason


@pytest.mark.parametrize("machine, named", [
    (Machine(vllm=False, cuda=False, cpu="AVX512", processes=1), "vLLM is not installed"),
    (Machine(vllm=True, cuda=True, cpu="AVX512", processes=1), "GPU"),
    (Machine(vllm=True, cuda=False, cpu="AVX2", processes=1), "this one is AVX2"),
    (Machine(vllm=True, cuda=False, cpu="DEFAULT", processes=1), "this one is DEFAULT"),
    (Machine(vllm=True, cuda=False, cpu="AVX512", processes=2), "2 processes"),
])
def test_machines_where_vllm_was_not_measured_faster_keep_hugging_face(machine, named):
    use_vllm, _, reason = chosen(machine)
    assert use_vllm is False and named in reason


def test_what_the_installed_vllm_cannot_do_keeps_hugging_face_and_says_why():
    assert chosen(CPU_WITH_VLLM, problem="the installed vLLM does not serve FooForCausalLM")[::2] == (
        False, "the installed vLLM does not serve FooForCausalLM")
    assert chosen(CPU_WITH_VLLM, rl_async_steps=1)[0] is False  # the async check then asks for a server


def test_a_named_server_is_used_without_asking_the_machine():
    def never() -> Machine:
        raise AssertionError("a server URL decides before CUDA is asked about")

    config, choice = choose_engine(RunConfig(vllm_server_url="http://127.0.0.1:8000"), never)
    assert (config.use_vllm, config.vllm_mode) == (True, "server") and "--vllm-server-url" in choice.reason


def test_server_mode_without_a_url_is_refused_whether_or_not_vllm_is_named():
    # Not left to the default: it would otherwise colocate (or take Hugging Face) against the mode asked.
    from aitrain_grpo.errors import ConfigError

    for use_vllm in (None, True):
        with pytest.raises(ConfigError, match="--vllm-mode server needs --vllm-server-url"):
            RunConfig(use_vllm=use_vllm, vllm_mode="server", **LETTERS_CONFIG).validate()
    RunConfig(use_vllm=False, vllm_mode="server", **LETTERS_CONFIG).validate()  # Hugging Face named: the mode is moot


@pytest.mark.parametrize("asked", [True, False])
def test_an_engine_the_run_names_stands(asked):
    config = RunConfig(use_vllm=asked)
    assert choose_engine(config, lambda: CPU_WITH_VLLM) == (config, None)


def test_the_installed_vllm_must_serve_the_models_architecture(tmp_path):
    # A local folder's architectures are read from its config.json; no vLLM import is needed to read them.
    from aitrain_grpo.training.rollout.engine_choice import model_architectures

    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["FooForCausalLM"]}))
    assert model_architectures(str(tmp_path)) == ["FooForCausalLM"]
    assert model_architectures(str(tmp_path / "absent")) == []


@pytest.mark.integration
@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed here: the run may colocate it")
def test_a_run_without_vllm_installed_says_it_generates_with_hugging_face(tiny_model_dir, tmp_path):
    out = tmp_path / "run"
    result = run_cli("grpo", "--model", tiny_model_dir, *LETTERS, "--max-steps", "1", "--batch-size", "4",
                     "--rl-num-generations", "2", "--rl-max-new-tokens", "4", "--output-dir", str(out))
    assert result.returncode == 0, result.stderr[-2000:]
    assert "engine: Hugging Face generate, chosen by default: vLLM is not installed" in result.stderr
    assert json.loads((out / "run_config.json").read_text())["use_vllm"] is False
