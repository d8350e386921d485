"""reasoning-gym task families through `--rl-env reasoning_gym:TASK`: real procedural tasks from the
package (no mocks), scored by each family's own `score_answer` on the `<answer>` the model wrote; the
oracle (the entry's stored answer in the prompt's format) for env check and sft, and families that store
no answers, which have none and say so."""

from __future__ import annotations

import json
import re

import pytest

from helpers import require  # noqa: E402

require("reasoning_gym", "pip install 'aitrain-grpo[reasoning-gym]'")

from aitrain_grpo.engine.runner import oracle_policy, play  # noqa: E402
from aitrain_grpo.env.base import has_solve  # noqa: E402
from aitrain_grpo.env.adapters.reasoning_gym import ReasoningGymEnv  # noqa: E402
from aitrain_grpo.errors import EnvLoadError  # noqa: E402
from helpers import run_cli  # noqa: E402
from helpers.cli import refused  # noqa: E402

FAMILIES = ("basic_arithmetic", "chain_sum", "leg_counting", "letter_counting", "spell_backward")


@pytest.mark.parametrize("task", FAMILIES)
def test_the_oracle_scores_one_and_a_wrong_or_missing_answer_less(task):
    env = ReasoningGymEnv(task, size=20, seed=3)
    rows = env.build_dataset(None)[:4]
    assert rows[0]["prompt"][0]["role"] == "system" and "<answer>" in rows[0]["prompt"][0]["content"]
    assert [ep.score for ep in play(env, rows, oracle_policy(env))] == [1.0] * 4
    wrong = play(env, rows, lambda ep: "<answer>definitely not it</answer>")
    assert all(ep.score < 1.0 and ep.metrics["answered"] == 1.0 for ep in wrong)
    untagged = play(env, rows, lambda ep: ep.row["answer"])  # the right answer, but not where it is read
    assert all(ep.score == 0.0 and ep.metrics["answered"] == 0.0 for ep in untagged)


def test_exact_scores_a_reply_that_only_contains_the_answer_zero():
    rows = ReasoningGymEnv("basic_arithmetic", size=20, seed=3).build_dataset(None)[:4]
    echo = lambda ep: f"<answer>{ep.row['prompt'][-1]['content']} = {ep.row['answer']}</answer>"  # noqa: E731
    partial = play(ReasoningGymEnv("basic_arithmetic", size=20, seed=3), rows, echo)
    assert all(0.0 < ep.score < 1.0 for ep in partial)  # the family's partial credit
    exact = ReasoningGymEnv("basic_arithmetic", size=20, seed=3, exact=True)
    assert [ep.score for ep in play(exact, rows, echo)] == [0.0] * 4
    assert [ep.score for ep in play(exact, rows, oracle_policy(exact))] == [1.0] * 4


def test_held_out_entries_are_never_trained_on_and_the_config_reaches_the_family():
    train = ReasoningGymEnv("basic_arithmetic", size=50, seed=1)
    held = ReasoningGymEnv("basic_arithmetic", size=50, seed=1, split="held_out")
    assert len(held.build_dataset(None)) == 10 and len(train.build_dataset(None)) == 40
    assert not {r["rg_index"] for r in train.build_dataset(None)} & {r["rg_index"] for r in held.build_dataset(None)}
    small = ReasoningGymEnv("basic_arithmetic", size=10, config={"min_terms": 2, "max_terms": 2, "max_digits": 1})
    assert all(len(row["prompt"][-1]["content"]) < 40 for row in small.build_dataset(None))


@pytest.mark.parametrize("options, problem", [
    ({"size": 0}, "size must be a whole number of at least 1"),  # was called a held_out_every problem
    ({"size": "many"}, "size must be a whole number of at least 1 (the entries reasoning-gym makes), got 'many'"),
    ({"held_out_every": 1}, "held_out_every must be a whole number of at least 2, got 1"),
    ({"size": 3}, "size 3 is below held_out_every 5, so no entry is held back; raise size or lower held_out_every"),
])
def test_sizes_that_cannot_make_a_split_are_named(options, problem):
    with pytest.raises(EnvLoadError, match=re.escape(problem)):
        ReasoningGymEnv("basic_arithmetic", **options)


def test_an_unknown_family_is_named_with_close_matches():
    with pytest.raises(EnvLoadError, match="no task 'basic_arithmetc'; did you mean basic_arithmetic"):
        ReasoningGymEnv("basic_arithmetc")


def test_grpo_and_env_check_run_a_family_from_the_command_line(tmp_path):
    spec = ["--rl-env", "reasoning_gym:chain_sum", "--rl-env-config", '{"size": 40}']
    check = run_cli("env", "check", *spec, "--episodes", "4", "--rl-max-new-tokens", "8")
    assert check.returncode == 0, check.stdout[-2000:] + check.stderr[-2000:]
    assert "interface: reasoning-gym task" in check.stdout and "oracle │ 1.000" in check.stdout
    run = run_cli("grpo", *spec, "--max-steps", "2", "--batch-size", "4", "--rl-max-new-tokens", "16",
                  "--output-dir", str(tmp_path / "run"))
    assert run.returncode == 0, run.stderr[-2000:]
    metrics = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert sum("env/answered" in m for m in metrics) == 2
    assert json.loads((tmp_path / "run" / "run_config.json").read_text())["rl_env"] == "reasoning_gym:chain_sum"


def test_the_oracle_writes_the_format_the_system_prompt_asks_for():
    env = ReasoningGymEnv("syllogism", size=10, system_prompt="DeepSeekZero")  # <think>, then <answer>
    rows = env.build_dataset(None)[:3]
    episodes = play(env, rows, oracle_policy(env))
    assert [ep.score for ep in episodes] == [1.0] * 3
    for ep, row in zip(episodes, rows):
        assert ep.last_completion == f"<think>\n</think>\n<answer>{row['answer']}</answer>"


def test_sft_learns_from_a_familys_answers_in_its_format(tmp_path):
    out = tmp_path / "sft"
    result = run_cli("sft", "--rl-env", "reasoning_gym:syllogism", "--rl-env-config", '{"size": 20}', "--episodes", "8",
                     "--max-steps", "2", "--batch-size", "4", "--output-dir", str(out))
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert "kept 8 scoring >= 1" in result.stdout
    demos = [json.loads(line) for line in (out / "demos.jsonl").read_text().splitlines()]
    rows = ReasoningGymEnv("syllogism", size=20).build_dataset(None)
    for demo in demos:
        system, _, reply = demo["messages"]
        assert "<answer>answer here</answer>" in system["content"]
        assert reply == {"role": "assistant", "content": f"<answer>{rows[demo['row']]['answer']}</answer>"}
    assert {r["answer"] for r in rows[:8]} == {"Yes", "No"}  # both answers shown, not one to copy


def test_a_family_without_stored_answers_has_no_oracle_and_says_why(tmp_path):
    env = ReasoningGymEnv("propositional_logic", size=10)
    assert not has_solve(env) and "propositional_logic stores no answers" in env.no_oracle
    spec = ["--rl-env", "reasoning_gym:propositional_logic", "--rl-env-config", '{"size": 10}']
    check = run_cli("env", "check", *spec, "--episodes", "2", "--rl-max-new-tokens", "8")
    assert check.returncode == 0, check.stdout[-2000:] + check.stderr[-2000:]
    assert ("note: no oracle to check with: reasoning-gym's propositional_logic stores no answers"
            in " ".join(check.stdout.split()))
    assert "either solve or" not in check.stdout and "oracle │" not in check.stdout
    refused(["sft", *spec, "--output-dir", str(tmp_path / "never")], tmp_path, "no oracle to learn from",
            "propositional_logic stores no answers", "e.g. basic_arithmetic")
    assert not (tmp_path / "never").exists()


def test_a_mixture_with_a_family_without_stored_answers_says_which_and_why():
    from aitrain_grpo.env.adapters.mixture import MixtureEnv

    mixed = MixtureEnv([{"spec": "reasoning_gym:syllogism", "config": {"size": 10}},
                        {"spec": "reasoning_gym:propositional_logic", "config": {"size": 10}}])
    assert not has_solve(mixed)
    assert "propositional_logic stores no answers" in mixed.no_oracle
    both = MixtureEnv([{"spec": "reasoning_gym:syllogism", "config": {"size": 10}},
                       {"spec": "reasoning_gym:basic_arithmetic", "config": {"size": 10}}])
    assert has_solve(both) and getattr(both, "no_oracle", None) is None
