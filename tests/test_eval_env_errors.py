"""An evaluation whose environment raised is said, not shown as a model's zeros: `aitrain eval` names the
most common error when some episodes raised and exits 1 when every one did (it printed a table of 0.000
and exited 0); a run's held-back evaluation counts them (`eval/errors`), and when every episode of the
evaluation before step 1 raised, the run stops there in one line instead of training with a `--save-best`
that compares zeros.
"""

from __future__ import annotations

import json

from helpers import REPO, in_process_cli

WORKBENCH = ["--rl-env-module", "envs_fixtures.workbench"]


def test_eval_names_the_errors_and_fails_when_every_episode_raised(tiny_model_dir, tmp_path, monkeypatch):
    aitrain = in_process_cli(monkeypatch, REPO / "tests")
    records = tmp_path / "episodes.jsonl"
    failed = aitrain("eval", "--model", tiny_model_dir, *WORKBENCH, "--rl-env-class", "StepRaisesEnv", "--episodes", 2,
                     "--rl-max-new-tokens", 4, "--output", records)
    errors = [line for line in failed.output.splitlines() if line.startswith("error:")]
    assert failed.exit_code == 1 and len(errors) == 1, failed.output
    assert "all 2 episodes of" in errors[0] and "ended in an environment error" in errors[0], errors[0]
    assert "KeyError" in errors[0] and "aitrain env check" in errors[0]
    assert len(records.read_text().splitlines()) == 2  # the records, written first, show each error

    some = aitrain("eval", "--model", tiny_model_dir, *WORKBENCH, "--rl-env-class", "OddStepsRaiseEnv", "--episodes", 4,
                   "--rl-max-new-tokens", 4)
    assert some.exit_code == 0, some.output
    assert "note: 2 of 4 episodes of" in some.output and "(2x)" in some.output and "KeyError" in some.output


def test_held_back_errors_are_counted_and_an_evaluation_that_cannot_play_stops_the_run_before_training(
        tiny_model_dir, tmp_path, monkeypatch):
    aitrain = in_process_cli(monkeypatch, REPO / "tests")
    common = ["grpo", "--model", tiny_model_dir, "--rl-env-module", "envs.letters", "--rl-env-class", "LetterEnv",
              "--rl-env-config", '{"turns": 1, "num_tasks": 8}', "--max-steps", 1, "--batch-size", 4,
              "--rl-num-generations", 2, "--rl-max-new-tokens", 4, "--eval-every", 1, "--eval-episodes", 4]
    out = tmp_path / "counted"
    counted = aitrain(*common, "--eval-env-module", WORKBENCH[1],
                      "--eval-env-class", "OddStepsRaiseEnv", "--output-dir", out)
    assert counted.exit_code == 0, counted.output
    assert "environment errors 2 (4 tasks x 1" in counted.output and "note: 2 of 4 held-back episodes" in counted.output
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["eval/errors"] for r in records if "eval/errors" in r] == [2.0, 2.0]  # step 0, step 1

    out = tmp_path / "stopped"
    stopped = aitrain(*common, "--eval-env-module", WORKBENCH[1], "--eval-env-class", "StepRaisesEnv",
                      "--output-dir", out)
    errors = [line for line in stopped.output.splitlines() if line.startswith("error:")]
    assert stopped.exit_code == 1 and len(errors) == 1, stopped.output
    assert "all 4 held-back episodes ended in an environment error" in errors[0] and "--eval-env" in errors[0]
    assert not list(out.glob("checkpoint-*")) and "step 1/" not in stopped.output
