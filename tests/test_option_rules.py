"""Option rules as a user meets them: a value out of its declared range is refused in one line naming the
range and the value (config.py's `Bound` metadata, one message shape), the parsed forms of text options
are what the run reads, and a micro-batch that does not divide the batch is refused by the run plan
before the model is looked at. Everything here runs without a model."""

from __future__ import annotations

import pytest

from aitrain_grpo.config import RunConfig, check_options
from aitrain_grpo.errors import ConfigError
from aitrain_grpo.training.run.plan import plan_run

LETTERS = dict(rl_env_module="envs.letters", rl_env_class="LetterEnv")


@pytest.mark.parametrize("options, message", [
    (dict(seed=-1), "--seed must be in [0, 4294967295] (numpy takes seeds in that range), got -1"),
    (dict(rl_temperature=1e9), "--rl-temperature must be in [0, 10] (0 samples greedily; above 10 a sample is noise), got 1000000000.0"),
    (dict(rl_kl_coef=-0.5), "--rl-kl-coef must be >= 0, got -0.5"),
    (dict(rl_clip_range=0.0), "--rl-clip-range must be positive, got 0.0"),
    (dict(lora_dropout=1.0), "--lora-dropout must be in [0, 1), got 1.0"),
    (dict(vllm_gpu_memory_utilization=0.0), "--vllm-gpu-memory-utilization must be in (0, 1], got 0.0"),
    (dict(vllm_server_timeout=-1.0), "--vllm-server-timeout must be positive seconds, got -1.0"),
    (dict(rl_top_k=-2), "--rl-top-k must be an integer >= 0 (0 turns it off), got -2"),
    (dict(rl_rollout_schedule="sideways"), "--rl-rollout-schedule 'sideways' is not one of auto, continuous, lockstep"),
])
def test_a_value_out_of_its_range_is_refused_in_one_line(options, message):
    with pytest.raises(ConfigError) as caught:
        RunConfig(**LETTERS, **options).validate()
    assert str(caught.value) == message


def test_eval_and_env_check_apply_the_same_rules_to_the_options_they_take():
    with pytest.raises(ConfigError, match=r"^--rl-top-p must be in \(0, 1\], got 0$"):
        check_options({"rl_top_p": 0, "rl_max_new_tokens": 8})
    with pytest.raises(ConfigError, match="^--rl-max-new-tokens must be a positive integer, got 2.5$"):
        check_options({"rl_max_new_tokens": 2.5})
    check_options({"rl_temperature": 0, "rl_top_p": 1, "unknown_name": -1, "rl_max_turns": None})  # eval samples greedily


def test_text_options_are_read_once_into_their_parsed_form():
    config = RunConfig(**LETTERS, vllm_server_url=" http://a:1/ ,http://b:2", rl_reward_funcs="aitrain_grpo.rewards:length_penalty",
                       rl_reward_weights="1, 0.5").validate()
    assert config.vllm_servers == ["http://a:1", "http://b:2"]
    assert config.reward_specs == [("aitrain_grpo.rewards", "length_penalty")]
    assert config.reward_weight_list == [1.0, 0.5]
    assert RunConfig(**LETTERS).validate().reward_weight_list is None


def test_a_micro_batch_that_does_not_divide_the_batch_is_refused_before_the_model_is_looked_at(tmp_path):
    missing_model = tmp_path / "no-such-model"  # were the model checked first, its error would come instead
    config = RunConfig(**LETTERS, model=str(missing_model), batch_size=8, micro_batch_size=3, output_dir=str(tmp_path / "run"))
    with pytest.raises(ConfigError, match="--batch-size 8 is not a multiple of --micro-batch-size 3"):
        plan_run(config)
    assert not (tmp_path / "run").exists()


def test_the_plan_carries_the_batch_shape_that_trl_is_given(tmp_path):
    plan = plan_run(RunConfig(**LETTERS, batch_size=8, micro_batch_size=4, gradient_accumulation_steps=2,
                              output_dir=str(tmp_path / "run")))
    assert plan.batch.trl_arguments() == {"per_device_train_batch_size": 4, "gradient_accumulation_steps": 4}
