"""Rewards beside the environment's score (`--rl-reward-funcs`, `--rl-reward-weights`): a real 2-step run
logs each under its name, weights the total, hands the functions the finished episodes; a failing
function abstains with one warning; bad specs exit 2 with one line; the built-ins compute what their
docstrings say; and (slow, two 60-step runs) the weights decide what the model learns. About a minute
without the slow test (one tiny-model run in a subprocess), one more with it."""

from __future__ import annotations

import functools
import json
import math
import os
import re
import subprocess
import sys
from types import SimpleNamespace

import pytest
from typer.testing import CliRunner

from aitrain_grpo import RunConfig, train
from aitrain_grpo.commands.cli import app
from aitrain_grpo.engine.rollout import RolloutBatch, TokenTrace
from aitrain_grpo.env.base import Episode
from aitrain_grpo.rewards import length_penalty, turn_penalty
from aitrain_grpo.training.rewards.functions import RewardFunc, checked_values, episode_reward
from helpers import REPO

HOTEL = ["--rl-env-module", "envs.hotel", "--rl-env-class", "HotelEnv"]
PROBES = "envs_fixtures.reward_probes"


# ------------------------------------------------------------------------------------ a real run


@pytest.fixture(scope="module")
def run(tiny_model_dir, tmp_path_factory):
    folder = tmp_path_factory.mktemp("rewards")
    probe = folder / "probe.jsonl"
    funcs = f"aitrain_grpo.rewards:length_penalty,{PROBES}:recorded,{PROBES}:broken"
    result = subprocess.run(
        [sys.executable, "-m", "aitrain_grpo", "grpo", *HOTEL, "--model", tiny_model_dir,
         "--output-dir", str(folder / "out"), "--max-steps", "2", "--rl-env-config", '{"num_tasks": 8, "seed": 3}',
         "--rl-max-new-tokens", "32", "--rl-reward-funcs", funcs, "--rl-reward-weights", "1,0.5,2,1",
         # refill swaps flat groups for replayed ones: the episodes must still line up with TRL's completions
         "--rl-zero-std-groups", "refill"],
        cwd=REPO / "tests", env=dict(os.environ, OMP_NUM_THREADS="1", AITRAIN_REWARD_PROBE=str(probe)),
        capture_output=True, text=True, timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    records = [json.loads(line) for line in (folder / "out" / "metrics.jsonl").read_text().splitlines()]
    calls = [json.loads(line) for line in probe.read_text().splitlines()]
    return result, records, calls


def test_each_reward_is_logged_under_its_name_and_weighted_into_the_total(run):
    _, records, _ = run
    assert [r["step"] for r in records] == [1, 2]
    assert any(r["groups/refill_rollouts"] > 0 for r in records)  # the tiny model's groups are mostly flat
    for record in records:
        for name in ("episode_score", "length_penalty", "recorded"):
            assert f"rewards/{name}/mean" in record, name
        score, length, recorded = (record[f"rewards/{n}/mean"] for n in ("episode_score", "length_penalty", "recorded"))
        assert -1.0 <= length <= 0.0 and 0.0 < recorded <= 1.0
        # TRL sums the weighted rewards; the failing function abstained (NaN), so it adds nothing.
        assert record["reward"] == pytest.approx(1 * score + 0.5 * length + 2 * recorded, abs=1e-4)


def test_reward_functions_receive_the_finished_episodes(run):
    _, _, calls = run
    assert len(calls) >= 2  # at least one generation batch per step
    for call in calls:
        assert call["episode_type"] == "Episode"
        assert call["episodes"] == call["completions"] == 8
        assert all(roles[:2] == ["system", "user"] and "assistant" in roles for roles in call["roles"])
        assert all(isinstance(s, float) and 0.0 <= s <= 1.0 for s in call["scores"])  # scored before rewards
        assert all(n > 0 for n in call["model_tokens"])
        assert call["rows_match"] and len(call["city"]) == 8  # the row's columns, in the episodes' order
        assert call["in_order"]  # episode i is the one TRL's completion i came from
        for keyword in ("completion_ids", "episode_score", "model_tokens", "trainer_state", "log_metric", "city"):
            assert keyword in call["keywords"], keyword


def test_a_failing_reward_function_abstains_with_one_warning(run):
    result, records, _ = run
    warnings = [line for line in result.stderr.splitlines() if "reward function" in line]
    source = REPO / "tests" / "envs_fixtures" / "reward_probes.py"
    line = source.read_text().splitlines().index('    raise ValueError("probe failure")') + 1
    assert warnings == [f"warning: reward function {PROBES}:broken failed: ValueError: probe failure (at "
                        f"{source}:{line}); it abstains for this batch "
                        f"(and any other it fails on, counted in rewards/broken/error_frac; 3 in a row stop the "
                        f"run); fix the function"]
    assert [r["rewards/broken/error_frac"] for r in records] == [1.0, 1.0]
    assert [r["rewards/recorded/error_frac"] for r in records] == [0.0, 0.0]


def letters_run(model: str, output_dir, weights: str) -> tuple[tuple[float, float], tuple[float, float]]:
    """test_learning.py's recipe (envs.letters, 'a', seed 0) with `e_share` beside the score: the mean
    over the first and the last 10 steps of the 'a' score and of the 'e' reward."""
    config = RunConfig(
        model=model, output_dir=str(output_dir), rl_env_module="envs.letters", rl_env_class="LetterEnv",
        rl_env_config={"letter": "a", "turns": 3}, max_steps=60, batch_size=8, rl_num_generations=4,
        rl_max_new_tokens=16, lr=3e-3, rl_kl_coef=0.0, rl_top_k=0, rl_temperature=1.0, seed=0, rl_cut_turn="end",
        rl_reward_funcs=f"{PROBES}:e_share", rl_reward_weights=weights,
    )
    train(config)
    records = [json.loads(line) for line in (output_dir / "metrics.jsonl").read_text().splitlines()]

    def first_last(key):
        values = [r[key] for r in records]
        return sum(values[:10]) / 10, sum(values[-10:]) / 10

    return first_last("rewards/episode_score/mean"), first_last("rewards/e_share/mean")


@pytest.mark.slow
def test_the_weights_decide_what_is_learned(tiny_model_dir, tmp_path):
    """Measured (2-core CPU, ~25 s a run): weights 1,0: 'a' 0.094 -> 0.496, 'e' 0.085 -> 0.001; weights
    0,1: 'a' 0.072 -> 0.028, 'e' 0.097 -> 0.193 (seeds 1 and 2: 'e' +0.02 and +0.13, 'a' flat or down)."""
    (a_first, a_last), (_, e_last) = letters_run(tiny_model_dir, tmp_path / "score", "1,0")
    assert a_last - a_first >= 0.25 and a_last > e_last + 0.2
    (a_first, a_last), (e_first, e_last) = letters_run(tiny_model_dir, tmp_path / "extra", "0,1")
    assert e_last - e_first >= 0.05 and e_last > a_last + 0.1
    assert a_last <= a_first + 0.05  # the environment's score, weighted 0, is not what was learned


# ------------------------------------------------------------------------------------ bad input


@pytest.mark.parametrize("funcs, weights, fragments", [
    ("nomodule:f", None, ["module 'nomodule' not found", "(--rl-reward-funcs)"]),
    ("envs.hotel:nothing", None, ["module 'envs.hotel'", "has no reward function 'nothing'"]),
    (f"{PROBES}:recorde", None, [f"did you mean {PROBES}:recorded?"]),
    ("x", None, ["--rl-reward-funcs entry 'x' is not module:function", "aitrain_grpo.rewards:length_penalty"]),
    ("a:f,b:f", None, ["two rewards named 'f'"]),
    ("aitrain_grpo.rewards:length_penalty", "1", ["--rl-reward-weights has 1 weight(s) for 2 reward(s)"]),
    ("aitrain_grpo.rewards:length_penalty", "1,abc", ["--rl-reward-weights entry 'abc' is not a number"]),
    (None, "1,2", ["--rl-reward-weights has 2 weight(s) for 1 reward(s)"]),
    (f"{PROBES}:no_kwargs", None, ["does not take **kwargs", "def no_kwargs(completions, episodes, **kwargs)"]),
    (f"{PROBES}:not_a_function", None, ["is not a function (it is int '3')"]),
    (f"{PROBES}:needs_unknown", None, ["requires 'secret_sauce'", "dataset column (prompt, "]),
])
def test_bad_reward_specs_exit_2_with_one_line(tiny_model_dir, tmp_path, funcs, weights, fragments):
    args = ["grpo", *HOTEL, "--model", tiny_model_dir, "--output-dir", str(tmp_path / "out"), "--max-steps", "1"]
    args += ["--rl-reward-funcs", funcs] if funcs else []
    args += ["--rl-reward-weights", weights] if weights else []
    result = CliRunner().invoke(app, args)
    lines = result.stderr.strip().splitlines()
    assert result.exit_code == 2, result.output
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    for fragment in fragments:
        assert fragment in lines[0]
    assert not (tmp_path / "out" / "metrics.jsonl").exists()


# ------------------------------------------------------------------------------------ the pieces


def episode(turns: int, max_turns: int = 5) -> Episode:
    return Episode(row={"prompt": "p"}, messages=[], turns=turns, max_turns=max_turns)


def test_length_penalty_is_free_then_linear_to_minus_one():
    assert length_penalty(model_tokens=[0, 64, 288, 512, 2000]) == [0.0, 0.0, -0.5, -1.0, -1.0]
    assert length_penalty(completion_ids=[[1] * 10, [1] * 30], free_tokens=10, max_tokens=30) == [0.0, -1.0]
    shorter = functools.partial(length_penalty, free_tokens=8, max_tokens=16)  # how a user binds parameters
    assert shorter(model_tokens=[12], completions=["x"], episodes=[episode(1)]) == [-0.5]


def test_turn_penalty_counts_turns_beyond_the_free_ones():
    episodes = [episode(1), episode(3), episode(5)]
    assert turn_penalty(episodes) == [0.0, -0.5, -1.0]  # up to each episode's own cap (5)
    assert turn_penalty(episodes, free_turns=2, max_turns=3) == [0.0, -1.0, -1.0]
    assert turn_penalty([episode(1, max_turns=1)]) == [0.0]  # a single-turn environment is never penalised


def batch_of(rows: list[dict]) -> RolloutBatch:
    episodes = [Episode(row=row, messages=[], turns=1, score=0.5) for row in rows]
    traces = [TokenTrace(prompt_ids=[1], completion_ids=[5, 6, 7], env_mask=[1, 0, 1]) for _ in rows]
    return RolloutBatch(episodes=episodes, traces=traces)


def test_wrapper_names_passes_episodes_and_the_episodes_own_rows():
    seen = {}

    def probe(prompts, episodes, model_tokens, city, **kwargs):
        seen.update(prompts=prompts, city=city, model_tokens=model_tokens)
        return [1, None]

    rollout = SimpleNamespace(last_batch=batch_of([{"prompt": "a", "city": "Oslo"}, {"prompt": "b", "city": "Rome"}]))
    reward = episode_reward(RewardFunc("m:short", "short", probe), rollout)
    assert reward.__name__ == "short"
    # TRL's columns are those of the prompts it sampled; a refill replaced them: the episodes' rows win.
    values = reward(prompts=["x", "y"], completions=["c", "d"], completion_ids=[[5], [7]], city=["Paris", "Paris"])
    assert values == [1.0, None]
    assert seen == {"prompts": ["a", "b"], "city": ["Oslo", "Rome"], "model_tokens": [2, 2]}


@pytest.mark.parametrize("values, problem", [
    (0.5, "returned float"), ([1.0], "returned 1 values for 2 episodes"), (["1", 2], "returned str '1'"),
    ([math.inf, 0], "returned inf"), ([True, 0], "returned bool"),
])
def test_bad_return_values_are_named(values, problem):
    with pytest.raises(ValueError, match=problem.replace("(", r"\(")):
        checked_values(values, 2)


def test_readme_examples_are_reward_functions():
    blocks = re.findall(r"```python\n(.*?)```", (REPO / "docs" / "environments.md").read_text(), flags=re.S)
    namespace: dict = {}
    for block in [b for b in blocks if "# my_rewards.py" in b]:
        exec(compile(block, "docs/environments.md:my_rewards", "exec"), namespace)  # our own documentation
    episodes = [Episode(row={}, messages=[{"role": "assistant", "content": text}], turns=1)
                for text in ("Please wait.", "No.")]
    assert namespace["polite"](completions=["", ""], episodes=episodes) == [0.1, 0.0]
    assert namespace["short"](model_tokens=[32, 80, 500], episodes=episodes) == [0.0, -0.5, -1.0]


def test_a_reward_function_that_fails_every_batch_stops_the_run_with_a_checkpoint(tiny_model_dir, tmp_path):
    from aitrain_grpo.training.rewards.failing import FAILED_BATCHES

    out = tmp_path / "out"
    result = subprocess.run(
        [sys.executable, "-m", "aitrain_grpo", "grpo", "--rl-env-module", "envs.letters", "--rl-env-class", "LetterEnv",
         "--rl-env-config", '{"turns": 1, "num_tasks": 8}', "--model", tiny_model_dir, "--output-dir", str(out),
         "--max-steps", "8", "--save-steps", "100", "--batch-size", "4", "--rl-num-generations", "2",
         "--rl-max-new-tokens", "8", "--rl-reward-funcs", f"{PROBES}:broken"],
        cwd=REPO / "tests", env=dict(os.environ, OMP_NUM_THREADS="1"), capture_output=True, text=True, timeout=600)
    assert result.returncode == 1, result.stderr[-3000:]
    (line,) = [row for row in result.stderr.splitlines() if row.startswith("error:")]
    assert f"reward function {PROBES}:broken failed every call of {FAILED_BATCHES} batches in a row (last: " \
           f"ValueError: probe failure" in line and "fix the function, then resume" in line
    assert len((out / "metrics.jsonl").read_text().splitlines()) == FAILED_BATCHES - 1  # the third never trained
    assert (out / f"checkpoint-{FAILED_BATCHES - 1}").is_dir()
