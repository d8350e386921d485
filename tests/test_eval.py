"""`aitrain eval`: a briefly trained tiny model beats its base on the letter environment, training output
directories (LoRA adapter or full model) load, and mistakes get one-line errors."""

from __future__ import annotations

import importlib.util
import json
import re
import statistics

import pytest
from typer.testing import CliRunner

from aitrain_grpo import RunConfig, train
from aitrain_grpo.commands.cli import app
from helpers import run_cli

LETTERS = ["--rl-env-module", "envs.letters", "--rl-env-class", "LetterEnv"]


@pytest.fixture(scope="module")
def trained_letters(tiny_model_dir, tmp_path_factory):
    """A LoRA run on LetterEnv with settings known to move the tiny model within a few dozen steps."""
    out = tmp_path_factory.mktemp("eval") / "letters"
    config = RunConfig(
        model=tiny_model_dir, output_dir=str(out), rl_env_module="envs.letters", rl_env_class="LetterEnv",
        rl_env_config={"letter": "a", "turns": 3}, max_steps=35, batch_size=8, rl_max_new_tokens=32,
        lr=1e-2, rl_kl_coef=0.0, rl_top_k=0, seed=0, log_episodes_every=0,
    )
    assert train(config)["global_step"] == 35
    return out


def aitrain(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


def test_the_trained_model_beats_its_base(trained_letters, tiny_model_dir, tmp_path):
    results = tmp_path / "results.jsonl"
    # The environment and sampling settings come from the run's run_config.json.
    run = run_cli("eval", "--model", str(trained_letters), "--baseline", tiny_model_dir, "--episodes", "12",
                  "--rl-num-generations", "2", "--output", str(results))
    assert run.returncode == 0, run.stderr[-3000:]
    assert "envs.letters.LetterEnv: temperature 1, top-k 0" in run.stdout
    for label in ("mean score", "success rate", "pass@2", "mean turns", "errors", "tokens per second", "difference"):
        assert label in run.stdout, label
    records = [json.loads(line) for line in results.read_text().splitlines()]
    by_model = {name: [r for r in records if r["model"] == name] for name in (str(trained_letters), tiny_model_dir)}
    assert [len(v) for v in by_model.values()] == [24, 24]  # 12 tasks x 2 episodes, for each model
    trained, base = (sum(r["score"] for r in v) / len(v) for v in by_model.values())
    assert trained > base + 0.05, f"trained {trained:.3f} vs base {base:.3f} (is the tiny model learning? see test_learning)"
    # The table's difference is the JSONL's difference.
    row = re.search(r"mean score\s*│\s*([\d.]+)\s*│\s*([\d.]+)\s*│\s*([+-][\d.]+)", run.stdout)
    assert row and abs(float(row.group(1)) - trained) < 1e-3 and abs(float(row.group(3)) - (trained - base)) < 2e-3
    # The difference with its interval, paired by task: each task's mean over its 2 episodes, trained - base.
    per_task = [sum(r["score"] for r in by_model[str(trained_letters)] if r["task"] == t) / 2
                - sum(r["score"] for r in by_model[tiny_model_dir] if r["task"] == t) / 2 for t in range(12)]
    mean, half = statistics.mean(per_task), 2.201 * statistics.stdev(per_task) / 12 ** 0.5  # t(0.975, 11 df)
    line = re.search(r"mean score, model - baseline: ([+-][\d.]+), 95% interval \[([+-][\d.]+), ([+-][\d.]+)\] "
                     r"over 12 tasks played by both: (.*)", run.stdout)
    assert line, run.stdout[-1500:]
    assert [float(v) for v in line.groups()[:3]] == pytest.approx([mean, mean - half, mean + half], abs=1e-3)
    assert line.group(4) == ("the model is ahead" if mean - half > 0 else "a tie (the interval holds 0; more "
                                                                           "--episodes narrow it)")
    assert "success rate, model - baseline: " in run.stdout
    first = by_model[str(trained_letters)][0]
    assert (first["task"], first["sample"]) == (0, 0) and by_model[str(trained_letters)][1]["sample"] == 1
    assert first["messages"][0]["role"] == "user" and first["messages"][1]["role"] == "assistant"
    assert {"score", "turns", "error", "truncated"} <= set(first)


def test_a_model_against_itself_is_a_tie_with_an_interval_of_zero(tiny_model_dir):
    result = aitrain("eval", "--model", tiny_model_dir, "--baseline", tiny_model_dir, *LETTERS, "--episodes", "4",
                     "--rl-max-new-tokens", "8", "--rl-env-config", '{"turns": 1}')
    assert result.exit_code == 0, result.output[-2000:]
    assert ("mean score, model - baseline: +0.000, 95% interval [+0.000, +0.000] over 4 tasks played by both: a tie "
            "(the interval holds 0; more --episodes narrow it)") in result.stdout


def test_pass_at_k_counts_tasks_with_any_success():
    from aitrain_grpo.env.base import Episode
    from aitrain_grpo.evaluation.evaluate import EvalResult

    def episode(score):
        return Episode(row={"prompt": "x"}, messages=[], score=score, turns=1)

    # Task 0: one of its two episodes solved; task 1: close but never solved.
    result = EvalResult("m", [episode(1.0), episode(0.0), episode(0.99), episode(0.5)], tasks=[0, 0, 1, 1], samples=2)
    summary = result.summary()
    assert summary["pass@2"] == 0.5 and summary["success_rate"] == 0.25
    assert summary["mean_score"] == pytest.approx(0.6225) and summary["tasks"] == 2


def test_a_full_model_output_directory_loads(tiny_model_dir, tmp_path):
    out = tmp_path / "full"
    config = RunConfig(
        model=tiny_model_dir, output_dir=str(out), rl_env_module="envs.letters", rl_env_class="LetterEnv",
        rl_env_config={"turns": 1}, max_steps=1, batch_size=4, rl_num_generations=2, rl_max_new_tokens=8,
        peft=False, log_episodes_every=0,
    )
    train(config)
    assert (out / "config.json").exists() and not (out / "adapter_config.json").exists()
    result = aitrain("eval", "--model", out, "--episodes", "4", "--rl-temperature", "0")
    assert result.exit_code == 0, result.output
    assert "temperature 0" in result.stdout and re.search(r"episodes\s*│\s*4", result.stdout)


@pytest.mark.parametrize(
    "args, fragment",
    [
        (["--model", "/no/such/model", *LETTERS], "does not exist"),
        (["--model", "{tiny}"], "no environment given; pass --rl-env-module and --rl-env-class"),
        (["--model", "{tiny}", *LETTERS, "--episodes", "0"], "--episodes must be a positive integer, got 0"),
        (["--model", "{tiny}", "--rl-env-module", "envs.letters", "--rl-env-class", "LetterEnvv"], "did you mean 'LetterEnv'"),
    ],
)
def test_bad_input_is_a_one_line_error(tiny_model_dir, args, fragment):
    result = aitrain("eval", *[a.replace("{tiny}", tiny_model_dir) for a in args])
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith("error: ") and len(result.stderr.strip().splitlines()) == 1 and fragment in result.stderr


def test_an_unfinished_run_points_at_its_checkpoint(tmp_path):
    for step in (5, 10):
        (tmp_path / f"checkpoint-{step}").mkdir()
    result = aitrain("eval", "--model", tmp_path, *LETTERS)
    assert result.exit_code == 2 and f"checkpoints instead, e.g. {tmp_path / 'checkpoint-10'}" in result.stderr


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed here")
def test_use_vllm_without_vllm_says_how_to_install_it(tiny_model_dir):
    result = aitrain("eval", "--model", tiny_model_dir, *LETTERS, "--use-vllm")
    assert result.exit_code == 2 and "--use-vllm needs vLLM" in result.stderr and "pip install" in result.stderr
