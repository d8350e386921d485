"""`--rl-env KIND:NAME`: expanded into a module, a class and keyword arguments before anything loads;
malformed specs and double namings are one-line errors (exit 2)."""

from __future__ import annotations

import json

import pytest

from aitrain_grpo import RunConfig
from aitrain_grpo.env_spec import expand_env_spec
from aitrain_grpo.errors import ConfigError, EnvLoadError
from helpers import run_cli


def test_a_kind_becomes_its_adapter_with_the_name_as_its_argument():
    module, cls, config = expand_env_spec("reasoning_gym:basic_arithmetic", '{"size": 50}')
    assert (module, cls) == ("aitrain_grpo.env.adapters.reasoning_gym", "ReasoningGymEnv")
    assert json.loads(config) == {"size": 50, "task": "basic_arithmetic"}
    assert expand_env_spec("textarena:Wordle-v0")[2] == '{"game": "Wordle-v0"}'
    assert json.loads(expand_env_spec("trl:my_envs:Search", {"rows": []})[2]) == {"rows": [], "env_class": "my_envs:Search"}


def test_module_colon_class_is_an_ordinary_environment():
    assert expand_env_spec("envs.hotel:HotelEnv", '{"num_tasks": 4}') == ("envs.hotel", "HotelEnv", '{"num_tasks": 4}')


@pytest.mark.parametrize("spec, env_config, fragment", [
    ("hotel", None, "is not KIND:NAME or module:Class"),
    ("gym:a:b", None, "unknown kind 'gym'; the kinds are textarena, reasoning_gym, trl, skyrl"),
    ("trl:MyEnv", None, "trl takes module:Class after 'trl:'"),
    ("textarena:Wordle-v0", '{"game": "Chess-v0"}', "sets 'game', and --rl-env-config sets it too"),
    ("textarena:Wordle-v0", "[1]", "must be a JSON object"),
    ("textarena:Wordle-v0", "{bad", "is not valid JSON"),
])
def test_malformed_specs_are_named(spec, env_config, fragment):
    with pytest.raises(EnvLoadError, match=fragment.replace("(", r"\(")):
        expand_env_spec(spec, env_config)


def test_the_run_config_takes_one_naming_and_names_its_output_folder_after_the_spec():
    config = RunConfig(rl_env="reasoning_gym:basic_arithmetic")
    assert config.resolved_output_dir().as_posix() == "outputs/basic_arithmetic"
    assert config.environment()[1] == "ReasoningGymEnv"
    with pytest.raises(ConfigError, match="not both"):
        RunConfig(rl_env="textarena:Wordle-v0", rl_env_module="envs.hotel", rl_env_class="HotelEnv").validate()


def test_the_cli_trains_an_environment_named_by_module_and_class(tmp_path):
    # --rl-env module:Class runs like --rl-env-module/--rl-env-class; run_config.json records the spec.
    result = run_cli("grpo", "--rl-env", "envs.letters:LetterEnv", "--max-steps", "1", "--batch-size", "4",
                     "--rl-max-new-tokens", "4", "--output-dir", str(tmp_path / "run"))
    assert result.returncode == 0, result.stderr[-2000:]
    assert json.loads((tmp_path / "run" / "run_config.json").read_text())["rl_env"] == "envs.letters:LetterEnv"
    bad = run_cli("grpo", "--rl-env", "gym:x:y")
    # ":x:" is printed as written (rich would make it an emoji).
    assert bad.returncode == 2 and bad.stderr.strip().startswith("error: --rl-env 'gym:x:y': unknown kind")


TRL_STYLE_MODULE = '''
class Counter:
    """An environment written for TRL's environment_factory: tools are public methods, get_reward scores."""

    def reset(self, **kwargs):
        self.total = 0
        return " Add numbers until the total is " + str(kwargs["target"]) + "."

    def add(self, number: int) -> str:
        """Add a number to the total.

        Args:
            number: The number to add.
        """
        self.total += number
        return str(self.total)

    def get_reward(self) -> float:
        return 1.0 if self.total else 0.0


def rows():
    return [{"prompt": [{"role": "user", "content": "Count."}], "target": t} for t in (3, 5)]
'''


def test_env_check_runs_a_trl_environment_named_by_kind(tmp_path):
    # What a TRL user types: their own module, unchanged, named as trl:module:Class.
    (tmp_path / "my_trl_envs.py").write_text(TRL_STYLE_MODULE)
    result = run_cli("env", "check", "--rl-env", "trl:my_trl_envs:Counter", "--rl-env-config", '{"rows": "my_trl_envs:rows"}',
                     "--policies", "empty,model", "--episodes", "2", "--rl-max-new-tokens", "8", cwd=tmp_path)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert "interface: TRL environment_factory (Counter)" in result.stdout
    assert "add(number)" in result.stdout  # the public method is offered as a tool
