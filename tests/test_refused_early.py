"""Inputs refused before a model loads, with nothing written (issue 50): one seed rule for every command
(0 <= seed < 2**32; `eval --seed -1` was a numpy traceback, env check and tiny-model took it silently); an
`--rl-context-window` that cannot hold the prompts (it played 0 turns and exited 0) or that is past the
model's context; `--rl-context compact` on an environment without `compact()` and `--rl-async-steps` with
one that scores with the policy (both refused only after the model loaded); curriculum thresholds no
reward can reach; and a `note:` for options that do nothing in the combination given. Everything here
runs without loading a model's weights: `train` is replaced by a stand-in that stops the run if reached."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from aitrain_grpo import RunConfig
from aitrain_grpo.commands.cli import app
from aitrain_grpo.env.loading import load_environment
from aitrain_grpo.errors import ConfigError
from aitrain_grpo.option_effects import unused_option_notes
from aitrain_grpo.option_rules import check_seed
from aitrain_grpo.training.preflight.run_checks import check_run
from helpers import REPO
from helpers.cli import refused

LETTERS = ["--rl-env-module", "envs.letters", "--rl-env-class", "LetterEnv"]
SEED_RANGE = "--seed must be in [0, 4294967295] (numpy takes seeds in that range)"


@pytest.fixture
def no_training(monkeypatch):
    """`aitrain grpo` from the repository root, where `train` (which loads the model and writes
    run_config.json) fails the test if it is ever called."""
    import aitrain_grpo.training.trainer as trainer

    def reached(*args, **kwargs):  # a user error, so that the run's lock is released as after a refusal
        raise ConfigError("train() was reached: a refusal here would come after the model loaded")

    monkeypatch.setattr(trainer, "train", reached)
    monkeypatch.chdir(REPO)  # envs.letters resolves from the current folder


# ------------------------------------------------------------------------------------------ seeds


@pytest.mark.parametrize("seed", ["-1", "4294967296"])
@pytest.mark.parametrize("command", ["grpo", "sft", "eval", "env check", "tiny-model"])
def test_every_command_holds_its_seed_to_one_range(tmp_path, monkeypatch, command, seed):
    monkeypatch.chdir(tmp_path)  # where default output folders would go
    args = {
        "grpo": ["grpo", *LETTERS, "--output-dir", "run"],
        "sft": ["sft", *LETTERS, "--output-dir", "run"],
        "eval": ["eval", "--model", "tiny", *LETTERS, "--episodes", "2"],
        "env check": ["env", "check", *LETTERS],
        "tiny-model": ["tiny-model", "run"],
    }[command]
    line = refused([*args, "--seed", seed], tmp_path, f"{SEED_RANGE}, got {seed}")
    assert "Traceback" not in line
    assert list(tmp_path.iterdir()) == []


def test_the_seed_rule_takes_both_ends_of_its_range():
    check_seed(0)
    check_seed(2**32 - 1)
    RunConfig(rl_env_module="envs.letters", rl_env_class="LetterEnv", seed=2**32 - 1).validate()
    with pytest.raises(ConfigError, match=r"^--seed must be in \[0, 4294967295\]"):
        check_seed(2**32)


# ------------------------------------------------------------------------------- the context window


def test_a_window_that_cannot_hold_the_prompts_is_refused_before_the_model_loads(tmp_path, no_training):
    out = tmp_path / "run"
    line = refused(["grpo", *LETTERS, "--max-steps", "2", "--rl-context-window", "10", "--output-dir", str(out)],
                   tmp_path, "--rl-context-window 10 cannot hold 64 of 64 dataset prompts",
                   "with room for a 128-token reply", "give a window of at least")
    needed = int(line.split("at least ")[1].split()[0])
    assert needed > 128  # the longest prompt plus the reply
    assert not out.exists()


def test_a_window_past_the_models_context_is_refused_before_the_model_loads(tmp_path, no_training):
    out = tmp_path / "run"
    refused(["grpo", *LETTERS, "--rl-context-window", "100000000", "--output-dir", str(out)], tmp_path,
            "--rl-context-window 100000000 is past tiny's context of 4096 tokens", "give at most 4096")
    assert not out.exists()


def test_a_window_that_holds_the_prompts_and_fits_the_model_is_taken(monkeypatch):
    monkeypatch.chdir(REPO)
    env = load_environment("envs.letters", "LetterEnv", None)
    for window in (4096, 200):
        config = RunConfig(rl_env_module="envs.letters", rl_env_class="LetterEnv", rl_context_window=window).validate()
        assert check_run(config, env) == []


# ------------------------------------------------------------------- what the environment rules out


def test_compact_on_an_environment_without_compact_is_refused_before_the_model_loads(tmp_path, no_training):
    out = tmp_path / "run"
    refused(["grpo", *LETTERS, "--rl-context", "compact", "--output-dir", str(out)], tmp_path,
            "--rl-context compact needs LetterEnv.compact(self, episode)")
    assert not out.exists()  # run_config.json used to be written before this refusal


def test_async_steps_with_an_environment_that_scores_with_the_policy_is_refused_before_loading(monkeypatch):
    # The CLI reaches this check only with a vLLM server (--rl-async-steps needs one); check_run is what
    # `aitrain grpo` calls right after the environment loads, before `train`.
    env = load_environment("envs_fixtures.aitraining_style", "GreetingEnv", None)
    config = RunConfig(rl_env_module="envs_fixtures.aitraining_style", rl_env_class="GreetingEnv", rl_async_steps=1)
    with pytest.raises(ConfigError, match=r"^GreetingEnv scores with the policy model \(needs_policy\), which "
                                          r"--rl-async-steps trains while episodes are scored; use --rl-async-steps 0$"):
        check_run(config, env)
    assert check_run(RunConfig(rl_env_module="envs_fixtures.aitraining_style", rl_env_class="GreetingEnv"), env) == []


# ------------------------------------------------------------------- options that cannot act


@pytest.mark.parametrize("flags, fragment", [
    (["--rl-curriculum", "pools", "--rl-curriculum-easy", "2"],
     "--rl-curriculum-easy 2 can never be reached, so no prompt would ever be easy: a group's mean reward is 0 to 1"),
    (["--rl-curriculum", "pools", "--rl-curriculum-hard", "-1"],
     "--rl-curriculum-hard -1 can never be reached, so no prompt would ever be hard"),
    (["--rl-curriculum", "pools", "--rl-curriculum-easy", "1.5", "--rl-reward-weights", "1.2"],
     "a group's mean reward is 0 to 1.2"),
])
def test_a_curriculum_threshold_no_reward_can_reach_is_refused(tmp_path, monkeypatch, flags, fragment):
    monkeypatch.chdir(tmp_path)
    refused(["grpo", *LETTERS, "--output-dir", "run", *flags], tmp_path, fragment)
    assert list(tmp_path.iterdir()) == []


def test_a_threshold_a_weighted_or_open_ended_reward_can_reach_is_taken():
    pools = dict(rl_env_module="envs.letters", rl_env_class="LetterEnv", rl_curriculum="pools")
    RunConfig(**pools, rl_curriculum_easy=2.0, rl_reward_weights="2").validate()
    RunConfig(**pools, rl_curriculum_easy=2.0, rl_reward_funcs="aitrain_grpo.rewards:length_penalty").validate()
    RunConfig(**pools, rl_curriculum_easy=0.0, rl_curriculum_hard=-1.0, rl_reward_weights="-1").validate()


def test_options_that_do_nothing_in_the_run_get_a_note_on_stderr_before_the_model_loads(tmp_path, no_training):
    out = tmp_path / "run"
    result = CliRunner().invoke(app, ["grpo", *LETTERS, "--output-dir", str(out), "--rl-context-threshold", "100",
                                      "--rl-context-keep-last", "3", "--rl-curriculum-easy", "0.5",
                                      "--rl-curriculum-hard", "0.1"])
    notes = [line for line in result.stderr.splitlines() if line.startswith("note:")]
    assert notes == [
        "note: --rl-context-threshold does nothing under --rl-context keep (it sets when drop-tool-results and "
        "summarize rewrite the history); leave it out, or choose --rl-context drop-tool-results or summarize",
        "note: --rl-context-keep-last does nothing under --rl-context keep (it counts the tool results "
        "drop-tool-results keeps whole); leave it out, or choose --rl-context drop-tool-results",
        "note: --rl-curriculum-easy, --rl-curriculum-hard do nothing without --rl-curriculum pools (this run draws "
        "prompts with --rl-curriculum off); leave them out, or add --rl-curriculum pools",
    ], result.stderr
    assert result.exit_code == 2 and "error: train() was reached" in result.stderr  # the notes came first


def test_options_that_act_under_the_strategy_in_force_get_no_note():
    config = RunConfig(rl_context="summarize", rl_context_threshold=100, rl_context_summary_tokens=64,
                       rl_curriculum="pools", rl_curriculum_easy=0.8)
    assert unused_option_notes(config, ["summarize"]) == []
    assert len(unused_option_notes(config, ["keep"])) == 2  # threshold and summary tokens
    keep_last = RunConfig(rl_context_keep_last=5)
    assert unused_option_notes(keep_last, ["drop-tool-results", "keep"]) == []  # a mixture: one member uses it
    assert "under --rl-context summarize" in unused_option_notes(keep_last, ["summarize"])[0]


def test_a_warmup_under_a_constant_schedule_gets_a_note():
    assert unused_option_notes(RunConfig(warmup_steps=5, lr_scheduler="constant"), ["keep"]) == [
        "note: --warmup-steps does nothing under --lr-scheduler constant (it holds --lr from the first step); "
        "leave it out, or choose --lr-scheduler constant_with_warmup"]
    assert unused_option_notes(RunConfig(warmup_steps=5, lr_scheduler="constant_with_warmup"), ["keep"]) == []


@pytest.mark.parametrize("flags, fragment", [
    (["--rl-num-iterations", "2", "--rl-curriculum", "pools"],
     "--rl-num-iterations 2 trains each batch several times, which --rl-curriculum pools does not follow"),
    (["--rl-num-iterations", "2", "--rl-async-steps", "1", "--vllm-server-url", "http://127.0.0.1:9"],
     "which --rl-async-steps does not follow"),
    (["--rl-advantage", "turn", "--rl-scale-rewards", "none"],
     "--rl-advantage turn divides each turn's reward-to-go by its group's spread, so it takes --rl-scale-rewards group"),
    (["--rl-delta", "1.1"], "--rl-delta 1.1 is not above 1 + the upper clip range (1.2)"),
    (["--rl-delta", "1.25", "--rl-clip-range-high", "0.28"], "--rl-delta 1.25 is not above 1 + the upper clip range (1.28)"),
    (["--rl-delta", "4", "--rl-loss-type", "sapo"], "--rl-loss-type sapo has no such clip, so it would do nothing"),
])
def test_update_and_advantage_options_that_cannot_work_together_are_refused(tmp_path, monkeypatch, flags, fragment):
    monkeypatch.chdir(tmp_path)
    refused(["grpo", *LETTERS, "--output-dir", "run", *flags], tmp_path, fragment)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("options, said", [
    (dict(rl_loss_type="luspo"), "add --rl-importance-sampling sequence"),
    (dict(rl_loss_type="vespo", rl_importance_sampling="sequence"), "leave --rl-importance-sampling at token"),
    (dict(rl_loss_type="dapo", rl_importance_sampling="sequence"), "GSPO's setup is --rl-loss-type grpo"),
    (dict(rl_importance_sampling="sequence"), "the default loss type (TRL's dapo) sums per-token terms"),
    (dict(rl_loss_type="luspo", rl_importance_sampling="sequence"), None),
    (dict(rl_loss_type="grpo", rl_importance_sampling="sequence"), None),
])
def test_a_loss_away_from_its_papers_importance_level_gets_a_note(options, said):
    notes = unused_option_notes(RunConfig(**options, rl_num_iterations=2), ["keep"])
    assert (said in notes[0] if said else notes == []), notes


def test_the_default_loss_type_the_notes_name_is_trls():
    from trl import GRPOConfig

    from aitrain_grpo.option_effects import TRL_DEFAULT_LOSS

    assert GRPOConfig.__dataclass_fields__["loss_type"].default == TRL_DEFAULT_LOSS


def test_ratio_options_under_one_update_a_batch_get_a_note():
    """Every policy ratio is 1 on a batch's first update, so the clip ranges, --rl-delta and the
    importance-sampling level change nothing without --rl-num-iterations 2 (tests/test_num_iterations.py)."""
    once = unused_option_notes(RunConfig(rl_clip_range_high=0.28, rl_delta=4.0, rl_loss_type="grpo"), ["keep"])
    assert once == ["note: --rl-clip-range-high, --rl-delta do nothing with one update a batch (--rl-num-iterations 1): "
                    "the policy that trains is the one the batch was scored with, so every policy ratio is 1; add "
                    "--rl-num-iterations 2, or leave them out"]
    assert unused_option_notes(RunConfig(rl_clip_range_high=0.28, rl_delta=4.0, rl_num_iterations=2), ["keep"]) == []
    masked = dict(rl_off_policy_mask=0.5, use_vllm=False)
    assert "--rl-off-policy-mask does nothing here" in unused_option_notes(RunConfig(**masked), ["keep"])[0]
    assert unused_option_notes(RunConfig(**masked, rl_num_iterations=2), ["keep"]) == []
    sampler = dict(rl_importance_correction="token_truncate", rl_importance_cap=2.0)
    assert "do nothing with Hugging Face generation" in unused_option_notes(RunConfig(**sampler, use_vllm=False),
                                                                            ["keep"])[0]
    assert unused_option_notes(RunConfig(**sampler, use_vllm=True), ["keep"]) == []


@pytest.mark.parametrize("flag, value", [("--rl-reward-model", ""), ("--rl-judge-rubric", ""), ("--rl-reward-funcs", ""),
                                         ("--save-best", ""), ("--lora-modules-to-save", ", ,"), ("--optim", "")])
def test_an_empty_value_is_refused_rather_than_read_as_not_given(tmp_path, monkeypatch, flag, value):
    """`--rl-reward-model ''` trained without the reward model, silently; `--lora-modules-to-save ,,` saved none."""
    monkeypatch.chdir(tmp_path)
    refused(["grpo", *LETTERS, "--output-dir", "run", flag, value], tmp_path, f"{flag} needs a value")
