"""Health warnings fire on metric histories that show each problem, stay silent on a healthy run, and are
printed once each, with advice, during training."""

from __future__ import annotations

import io
import json
from types import SimpleNamespace

from rich.console import Console
from transformers import TrainerControl, TrainerState

from helpers import REPO, run_cli

from aitrain_grpo.runlog.health import (
    HealthCallback, check_health, entropy_collapse, first_warnings, low_score, no_learning_signal, rising_errors,
    unstable_gradients,
)


def healthy_run(steps: int = 40) -> list[dict]:
    """Reward climbing from 0.2 to 0.8 with spread in every batch, stable gradients, no errors."""
    return [
        {"step": s, "reward": 0.2 + 0.6 * s / steps, "reward_std": 0.2, "frac_reward_zero_std": 0.25,
         "env/score_mean": 0.2 + 0.6 * s / steps, "entropy": 1.5 - s / 100, "grad_norm": 0.8,
         "env/errors": 0.0, "env/episodes": 8.0}
        for s in range(1, steps + 1)
    ]


def with_changes(records: list[dict], start: int, **changes) -> list[dict]:
    return [dict(r, **changes) if r["step"] >= start else r for r in records]


def test_a_healthy_run_raises_no_warning_at_any_step():
    assert first_warnings(healthy_run()) == []


def test_no_learning_signal_when_most_recent_steps_have_zero_reward_std():
    records = with_changes(healthy_run(12), 8, reward_std=0.0, frac_reward_zero_std=1.0)
    warning = no_learning_signal(records)
    assert warning is not None and warning.step == 12
    assert "5 of the last 5 steps" in warning.message and "graded" in warning.advice
    # Three flat steps out of five are not "most".
    assert no_learning_signal(with_changes(healthy_run(12), 10, reward_std=0.0, frac_reward_zero_std=1.0)) is None


def test_no_learning_signal_is_silent_when_every_episode_scored_full_marks():
    # README's quick start on seed 42 (benchmarks/FIRST_RUN.md): steps 49-53 score 1.0 in every episode.
    solved = with_changes(healthy_run(12), 8, reward=1.0, reward_std=0.0, frac_reward_zero_std=1.0,
                          **{"env/score_mean": 1.0})
    assert no_learning_signal(solved) is None
    assert no_learning_signal(with_changes(solved, 8, **{"env/score_mean": 0.9})) is not None


def test_no_learning_signal_when_every_group_is_flat_even_if_the_batch_varies():
    # Different tasks score differently, but every group of attempts at one task scores the same.
    records = with_changes(healthy_run(10), 1, reward_std=0.3, frac_reward_zero_std=1.0)
    assert no_learning_signal(records) is not None


def test_low_score_only_after_twenty_steps():
    records = with_changes(healthy_run(30), 1, reward=0.05, **{"env/score_mean": 0.05})
    assert low_score(records[:19]) is None
    warning = low_score(records[:20])
    assert warning is not None and "0.050 after 20 steps" in warning.message
    assert "aitrain env check" in warning.advice
    assert [w.step for w in first_warnings(records) if w.key == "low_score"] == [20]
    assert low_score(with_changes(healthy_run(30), 1, **{"env/score_mean": 0.3})) is None


def test_a_low_score_that_is_climbing_is_not_a_low_score_warning():
    # README's quick start on seed 1 (benchmarks/FIRST_RUN.md): 0.08 over steps 1-5, 0.146 over steps 16-20 (here 0.09 and 0.145),
    # 0.87 by the end. Below 0.15 at step 20, but climbing: no advice to check the environment.
    climbing = [{"step": s, "reward": 0.08 + 0.0036 * s, "env/score_mean": 0.08 + 0.0036 * s} for s in range(1, 31)]
    assert low_score(climbing[:20]) is None
    assert "low_score" not in [w.key for w in first_warnings(climbing)]
    # Climbing by less than 0.05 over the window is still low: it warns, naming where it started.
    slow = [dict(r, **{"env/score_mean": 0.05 + 0.001 * r["step"]}) for r in climbing]
    warning = low_score(slow[:20])
    assert warning is not None and "0.068 after 20 steps (0.053 at steps 1-5)" in warning.message
    # A score that fell to zero (a collapsed run) warns as before.
    fallen = [dict(r, **{"env/score_mean": 0.0 if r["step"] > 10 else 0.06}) for r in climbing]
    assert low_score(fallen[:20]) is not None


def test_entropy_collapse():
    collapsed = with_changes(healthy_run(10), 8, entropy=0.004)
    warning = entropy_collapse(collapsed)
    assert warning is not None and "collapsed" in warning.message
    # One low step among normal ones is noise, not a collapse.
    assert entropy_collapse(with_changes(healthy_run(10), 10, entropy=0.004)) is None


def test_exploding_gradients_advise_a_lower_learning_rate():
    warning = unstable_gradients(with_changes(healthy_run(5), 5, grad_norm=37.5))
    assert warning is not None and "37.5" in warning.message and "--lr" in warning.advice
    assert unstable_gradients(with_changes(healthy_run(5), 5, grad_norm=9.0)) is None


def test_rising_environment_errors():
    records = with_changes(healthy_run(15), 11, **{"env/errors": 4.0})
    warning = rising_errors(records)
    assert warning is not None and "50% of episodes in the last 5 steps (earlier 0%)" in warning.message
    assert "episodes.jsonl" in warning.advice
    # A steady trickle of errors (1 in 50) is not a rise.
    assert rising_errors(with_changes(healthy_run(15), 1, **{"env/errors": 1.0, "env/episodes": 50.0})) is None


def test_missing_metrics_are_not_warnings():
    assert check_health([{"step": s, "reward": 0.5} for s in range(1, 30)]) == []


def test_the_callback_prints_each_warning_once_with_its_advice():
    buffer = io.StringIO()
    callback = HealthCallback(Console(file=buffer, highlight=False, width=300))
    state, control, args = TrainerState(), TrainerControl(), SimpleNamespace(output_dir="unused")
    for record in with_changes(healthy_run(12), 1, reward_std=0.0, frac_reward_zero_std=1.0, grad_norm=50.0):
        state.global_step = record["step"]
        callback.on_log(args, state, control, logs={k: v for k, v in record.items() if k != "step"})
    text = buffer.getvalue()
    assert text.count("no learning signal") == 1 and text.count("grad_norm is 50.0") == 1, text
    assert "warning: grad_norm is 50.0 (above 10): training is unstable. lower the learning rate" in text
    # The end-of-run summary TRL logs has no reward; it is not a training step.
    callback.on_log(args, state, control, logs={"train_runtime": 12.0})
    assert len(callback.history) == 12


# ------------------------------------------------------------------------------ the thresholds, at their edges


def test_four_flat_steps_of_five_are_no_learning_signal():
    records = with_changes(healthy_run(12), 9, reward_std=0.0, frac_reward_zero_std=1.0)  # steps 9..12 of 8..12
    warning = no_learning_signal(records)
    assert warning is not None and "4 of the last 5 steps" in warning.message


def test_two_low_entropy_steps_are_not_a_collapse_but_three_are():
    assert entropy_collapse(with_changes(healthy_run(10), 9, entropy=0.004)) is None
    assert entropy_collapse(with_changes(healthy_run(10), 8, entropy=0.004)) is not None


def test_a_grad_norm_of_exactly_ten_is_not_unstable_but_just_above_is():
    assert unstable_gradients(with_changes(healthy_run(5), 5, grad_norm=10.0)) is None
    assert unstable_gradients(with_changes(healthy_run(5), 5, grad_norm=10.01)) is not None


# ------------------------------------------------------------------------------ end to end


def test_a_constant_score_run_warns_no_learning_signal_once_and_the_report_shows_it(tmp_path, tiny_model_dir):
    """Every episode scores 0.5: from step 5 every group is flat. Eight steps, so the warning has three
    more chances to repeat itself."""
    out = tmp_path / "run"
    result = run_cli(
        "grpo", "--rl-env-module", "envs_fixtures.workbench", "--rl-env-class", "ConstantScoreEnv",
        "--model", tiny_model_dir, "--output-dir", str(out), "--max-steps", "8", "--rl-max-new-tokens", "8",
        "--log-episodes-every", "4", cwd=REPO / "tests",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.count("no learning signal") == 1, result.stdout
    (line,) = [line for line in result.stdout.splitlines() if "no learning signal" in line]
    assert line.startswith("warning: no learning signal: every episode of a group scored the same on 5 of the last 5")
    assert "make scoring graded" in line and "--rl-num-generations" in line
    # The page lists it too: in the data the page renders, and in the rendered page itself.
    page = (out / "report.html").read_text()
    data = json.loads(page.split('id="report-data" type="application/json">', 1)[1].split("</script>", 1)[0])
    assert [w["key"] for w in data["health"]] == ["no_learning_signal"] and data["health"][0]["step"] == 5
    from helpers.browser import rendered_dom

    dom = rendered_dom(out / "report.html", tmp_path)
    assert "no learning signal: every episode of a group scored the same" in dom and "(from step 5)" in dom


def test_a_run_whose_truncated_episodes_all_leave_the_loss_is_told():
    from aitrain_grpo.runlog.health import truncated_out_of_the_loss

    masked = with_changes(healthy_run(10), 8, **{"groups/masked_truncated_frac": 0.95})
    warning = truncated_out_of_the_loss(masked)
    assert warning is not None and "--rl-mask-truncated took 95% or more" in warning.message
    assert "raise --rl-max-new-tokens" in warning.advice
    assert truncated_out_of_the_loss(masked[:-1]) is None  # two steps are not yet a pattern
    assert truncated_out_of_the_loss(with_changes(masked, 9, **{"groups/masked_truncated_frac": 0.5})) is None
    assert truncated_out_of_the_loss(healthy_run(10)) is None  # the option off: nothing logged


def test_an_off_policy_mask_that_takes_most_tokens_is_told():
    """Measured with colocated vLLM-CPU: `--rl-off-policy-mask 0` dropped sequences for bfloat16 noise alone."""
    from aitrain_grpo.runlog.health import check_health, off_policy_mask_takes_most

    masked = with_changes(healthy_run(10), 8, **{"off_policy/masked_frac": 0.6})
    warning = off_policy_mask_takes_most(masked)
    assert warning is not None and "--rl-off-policy-mask took 60% or more of the model tokens" in warning.message
    assert "raise --rl-off-policy-mask above the sampler's noise" in warning.advice
    assert any(w.key == "off_policy_mask_takes_most" for w in check_health(masked))
    assert off_policy_mask_takes_most(masked[:-1]) is None  # two steps are not yet a pattern
    assert off_policy_mask_takes_most(with_changes(masked, 9, **{"off_policy/masked_frac": 0.1})) is None
    assert off_policy_mask_takes_most(healthy_run(10)) is None  # the option off: nothing logged
