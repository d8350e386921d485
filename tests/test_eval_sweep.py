"""`aitrain eval --model RUN --checkpoints ...`: a run's checkpoints played on the same tasks against its
start, one row each, the best named; and a checkpoint folder evaluated on its own takes its run's
environment. The numbers printed are checked against the episodes written with `--output`."""

from __future__ import annotations

import json
import re
import shutil
import statistics

import pytest
from typer.testing import CliRunner

from aitrain_grpo import RunConfig, train
from aitrain_grpo.commands.cli import app
from aitrain_grpo.engine.stats import SUCCESS


@pytest.fixture(scope="module")
def letters_run(tiny_model_dir, tmp_path_factory):
    """A LoRA run on LetterEnv that learns within its 36 steps (test_eval's settings), a checkpoint every 12."""
    out = tmp_path_factory.mktemp("sweep") / "letters"
    config = RunConfig(
        model=tiny_model_dir, output_dir=str(out), rl_env_module="envs.letters", rl_env_class="LetterEnv",
        rl_env_config={"letter": "a", "turns": 3}, max_steps=36, save_steps=12, batch_size=8, rl_max_new_tokens=32,
        lr=1e-2, rl_kl_coef=0.0, rl_top_k=0, seed=0, log_episodes_every=0,
    )
    assert train(config)["global_step"] == 36
    return out


def aitrain(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


def by_model(path) -> dict[str, list[dict]]:
    records: dict[str, list[dict]] = {}
    for line in path.read_text().splitlines():
        record = json.loads(line)
        records.setdefault(record["model"], []).append(record)
    return records


def test_every_checkpoint_plays_the_same_tasks_against_the_start_and_the_best_is_named(letters_run, tmp_path):
    episodes = tmp_path / "sweep.jsonl"
    result = aitrain("eval", "--model", letters_run, "--checkpoints", "all", "--episodes", "12",
                     "--rl-num-generations", "2", "--output", episodes)
    assert result.exit_code == 0, result.output[-3000:]
    played = by_model(episodes)
    names = [f"{letters_run}/checkpoint-{s}" for s in (12, 24, 36)]
    start = json.loads((letters_run / "run_config.json").read_text())["model"]  # the run's base model
    assert list(played) == [start, *names]  # the start, then each checkpoint (36 holds the final weights: once)
    assert all([(r["task"], r["sample"]) for r in v] == [(t, k) for t in range(12) for k in range(2)] for v in played.values())
    success = {name: sum(r["score"] >= SUCCESS for r in v) / len(v) for name, v in played.items()}
    mean = {name: statistics.mean(r["score"] for r in v) for name, v in played.items()}
    rows = {m.group(1): m for m in re.finditer(r"^\s+(start|checkpoint-\d+)\s+([\d.]+)%\s+([+-][\d.]+)?\s*([\d.]+)\s",
                                               result.stdout, re.M)}
    assert list(rows) == ["start", "checkpoint-12", "checkpoint-24", "checkpoint-36"], result.stdout
    for label, name in zip(rows, played):
        assert float(rows[label].group(2)) == pytest.approx(100 * success[name], abs=0.06)
        assert float(rows[label].group(4)) == pytest.approx(mean[name], abs=1e-3)
    # Learning shows on the tasks: the last checkpoint scores above the start.
    assert mean[names[-1]] > mean[start] + 0.05, mean
    # Each checkpoint's success difference against the start, paired by task, with its interval.
    for name, label in zip(names, list(rows)[1:]):
        per_task = [statistics.mean(r["score"] >= SUCCESS for r in played[name] if r["task"] == t)
                    - statistics.mean(r["score"] >= SUCCESS for r in played[start] if r["task"] == t) for t in range(12)]
        line = re.search(rf"^{label}, success - start: ([+-][\d.]+) pts", result.stdout, re.M)
        assert line and float(line.group(1)) == pytest.approx(100 * statistics.mean(per_task), abs=0.06)
    best = max(names, key=lambda n: (success[n], mean[n], -names.index(n)))
    assert (f"best of the run on these tasks: {best.rsplit('/', 1)[1]} (success {success[best]:.1%}, mean score "
            f"{mean[best]:.3f}); make it a model of its own with: aitrain export {best} --to <folder>") in result.stdout


def test_last_plays_the_final_weights_when_the_run_trained_past_its_last_checkpoint(tiny_model_dir, tmp_path):
    out = tmp_path / "run"
    config = RunConfig(model=tiny_model_dir, output_dir=str(out), rl_env_module="envs.letters", rl_env_class="LetterEnv",
                       max_steps=3, save_steps=2, batch_size=4, rl_num_generations=2, rl_max_new_tokens=8,
                       log_episodes_every=0)
    assert train(config)["global_step"] == 3
    episodes = tmp_path / "last.jsonl"
    result = aitrain("eval", "--model", out, "--checkpoints", "last", "--episodes", "2", "--output", episodes)
    assert result.exit_code == 0, result.output[-3000:]
    assert list(by_model(episodes)) == [tiny_model_dir, f"{out}/checkpoint-3"]  # the final save holds the final weights
    shutil.rmtree(out / "checkpoint-3")  # as a run whose newest weights no checkpoint holds
    result = aitrain("eval", "--model", out, "--checkpoints", "last", "--episodes", "2", "--output", episodes)
    assert list(by_model(episodes)) == [tiny_model_dir, str(out)] and "final (step 3)" in result.stdout
    result = aitrain("eval", "--model", out, "--checkpoints", "all", "--episodes", "2", "--output", episodes)
    assert list(by_model(episodes)) == [tiny_model_dir, f"{out}/checkpoint-2", str(out)]
    # A baseline replaces the start as the reference.
    result = aitrain("eval", "--model", out, "--checkpoints", "2", "--baseline", out, "--episodes", "2", "--output", episodes)
    assert result.exit_code == 0 and list(by_model(episodes)) == [str(out), f"{out}/checkpoint-2"]
    assert "checkpoint-2, success - baseline: " in result.stdout
    # A checkpoint on its own: the environment and settings come from its run (no --rl-env-* given).
    result = aitrain("eval", "--model", out / "checkpoint-2", "--episodes", "2")
    assert result.exit_code == 0 and "envs.letters.LetterEnv: temperature" in result.stdout, result.output[-2000:]


@pytest.mark.parametrize("which, error", [
    ("5", "--checkpoints '5': the run has no checkpoint at step 5; its checkpoints are at steps 2"),
    ("two", "--checkpoints 'two' is not 'all', 'last' or comma-separated steps such as 10,20"),
    (",", "--checkpoints ',' names no step; pass all, last, or steps such as 10,20"),
])
def test_a_step_the_run_lacks_is_refused_with_its_steps(tiny_model_dir, tmp_path, which, error):
    out = tmp_path / "run"
    train(RunConfig(model=tiny_model_dir, output_dir=str(out), rl_env_module="envs.letters", rl_env_class="LetterEnv",
                    max_steps=2, save_steps=2, batch_size=4, rl_num_generations=2, rl_max_new_tokens=8,
                    log_episodes_every=0))
    result = aitrain("eval", "--model", out, "--checkpoints", which)
    assert result.exit_code == 2 and result.output.strip() == f"error: {error}"


def test_checkpoints_of_something_that_is_not_a_run_are_refused(tiny_model_dir, tmp_path):
    result = aitrain("eval", "--model", tiny_model_dir, "--checkpoints", "all")
    assert result.exit_code == 2 and "--checkpoints needs a training run's folder as --model" in result.output
    (tmp_path / "run_config.json").write_text(json.dumps({"model": "tiny", "rl_env_module": "envs.letters"}))
    result = aitrain("eval", "--model", tmp_path, "--checkpoints", "all")
    assert result.exit_code == 2 and "holds no complete checkpoint-N folder to sweep" in result.output


def test_the_episodes_never_replace_a_file_of_the_swept_run(letters_run):
    metrics = (letters_run / "metrics.jsonl").read_text()
    result = aitrain("eval", "--model", letters_run, "--checkpoints", "last", "--output", letters_run / "metrics.jsonl")
    assert result.exit_code == 2 and "which this command reads" in result.output
    assert (letters_run / "metrics.jsonl").read_text() == metrics


def test_a_run_that_trained_every_weight_is_swept_against_its_model(tiny_model_dir, tmp_path):
    out, episodes = tmp_path / "run", tmp_path / "full.jsonl"
    train(RunConfig(model=tiny_model_dir, output_dir=str(out), rl_env_module="envs.letters", rl_env_class="LetterEnv",
                    peft=False, max_steps=1, save_steps=1, batch_size=4, rl_num_generations=2, rl_max_new_tokens=8,
                    log_episodes_every=0))
    result = aitrain("eval", "--model", out, "--checkpoints", "last", "--episodes", "2", "--output", episodes)
    assert result.exit_code == 0, result.output[-3000:]
    assert list(by_model(episodes)) == [tiny_model_dir, f"{out}/checkpoint-1"]
