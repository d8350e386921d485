"""`--rl-env dataset:FILE`: a file of prompts and answers trains as TRL trains a dataset, with no
environment class written. What a user sees: the reply's answer (tagged, boxed or bare) scored against
the row's, env check's oracle at 1 and its empty reply at 0, the row's columns in reward functions, a
held-back split the training split never shows, and a one-line error for a file that cannot serve."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from aitrain_grpo.commands.cli import app
from aitrain_grpo.config import RunConfig
from aitrain_grpo.engine.runner import play
from aitrain_grpo.env.adapters.dataset import DatasetEnv, matches
from aitrain_grpo.env.base import has_solve
from aitrain_grpo.env.dataset import build_rows
from aitrain_grpo.env.loading import load_environment
from aitrain_grpo.env_spec import environment_of
from aitrain_grpo.errors import EnvLoadError
from aitrain_grpo.training.trainer import train
from helpers import REPO


@pytest.fixture
def tasks(tmp_path):
    path = tmp_path / "tasks.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"What is {i} + {i}?", "answer": str(2 * i), "level": i % 3}) + "\n"
                            for i in range(1, 21)))
    return str(path)


@pytest.mark.parametrize("reply, answer, how, right", [
    ("The sum is 1,234.", "1234", "auto", True),
    ("<think>12? no</think><answer>13</answer>", "13", "auto", True),
    ("first \\boxed{7}, then \\boxed{8}", "8", "number", True),
    ("12 apples, then 13", "12", "number", False),  # the last number is the answer
    ("  Paris. ", "paris", "auto", True),
    ("It is Paris, France", "Paris", "exact", False),
    ("It is Paris, France", "Paris", "contains", True),
    ("<answer>\\frac{1}{2}</answer>", "\\frac{1}{2}", "auto", True),
    ("no number here", "3", "number", False),
])
def test_the_replys_answer_is_read_and_compared(reply, answer, how, right):
    assert matches(reply, answer, how) is right


def test_the_oracle_scores_1_and_a_wrong_reply_0_through_the_spec(tasks):
    env = load_environment(*environment_of(f"dataset:{tasks}", None, None, '{"system_prompt": "Answer briefly."}'))
    rows = build_rows(env, None)
    assert rows[0]["prompt"][0] == {"role": "system", "content": "Answer briefly."}
    assert rows[0]["level"] == 1  # the row's other columns travel with it
    solved = play(env, rows[:4], env.solve)
    assert [e.score for e in solved] == [1.0] * 4 and all(e.metrics["correct"] == 1.0 for e in solved)
    assert [e.score for e in play(env, rows[:4], lambda e: "0")] == [0.0] * 4


def test_the_held_back_split_is_rows_training_never_shows(tasks):
    train_rows = {r["answer"] for r in build_rows(DatasetEnv(tasks, split="train", held_out_every=4), None)}
    held = {r["answer"] for r in build_rows(DatasetEnv(tasks, split="held_out", held_out_every=4), None)}
    assert len(held) == 5 and len(train_rows) == 15 and not held & train_rows
    assert len(build_rows(DatasetEnv(tasks, num_tasks=3), None)) == 3


@pytest.mark.parametrize("kwargs, said", [
    (dict(answer_column="solution"), "dataset row 0 has no 'solution' (its columns: answer, level, prompt)"),
    (dict(match="fuzzy"), "match must be one of auto, number, exact, contains, none"),
    (dict(split="test"), "split must be one of all, train, held_out"),
    (dict(num_tasks=0), "num_tasks must be a whole number of at least 1"),  # 0 played every row
    (dict(num_tasks=-1), "num_tasks must be a whole number of at least 1"),  # -1 dropped the last row
])
def test_options_that_cannot_serve_are_refused_in_one_line(tasks, kwargs, said):
    with pytest.raises(EnvLoadError) as raised:
        DatasetEnv(tasks, **kwargs)
    assert said in str(raised.value) and "\n" not in str(raised.value)


def test_an_empty_answer_is_named_as_empty(tmp_path):
    path = tmp_path / "tasks.jsonl"
    path.write_text(json.dumps({"prompt": "1+1?", "answer": None}) + "\n")
    with pytest.raises(EnvLoadError, match=r"dataset row 0 has 'answer' empty \(null\) \(its columns: answer, prompt\)"):
        DatasetEnv(str(path))


def test_without_answers_the_reward_functions_score(tmp_path):
    path = tmp_path / "open.jsonl"
    path.write_text(json.dumps({"prompt": "Write a haiku."}) + "\n")
    env = DatasetEnv(str(path), match="none")
    assert not has_solve(env) and "no answers" in env.no_oracle  # env check's note, sft's refusal
    assert [e.score for e in play(env, build_rows(env, None), lambda e: "leaves fall")] == [0.0]


def test_env_check_and_a_training_run_take_the_file(tasks, tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)
    checked = CliRunner().invoke(app, ["env", "check", "--rl-env", f"dataset:{tasks}", "--episodes", "2",
                                       "--policies", "oracle,empty"])
    assert checked.exit_code == 0, checked.output
    assert "dataset of prompts and answers" in checked.output
    train(RunConfig(rl_env=f"dataset:{tasks}", output_dir=str(tmp_path / "run"), max_steps=1, rl_max_new_tokens=8,
                    use_vllm=False))
    record = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[0])
    assert record["env/episodes"] == 8 and "env/correct" in record
    assert json.loads((tmp_path / "run" / "run_config.json").read_text())["rl_env"] == f"dataset:{tasks}"


def test_a_csv_file_serves_and_a_file_of_another_kind_is_named(tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)
    (tmp_path / "tasks.csv").write_text("prompt,answer\nWhat is 1+1?,2\nWhat is 2+2?,4\n")
    env = DatasetEnv(str(tmp_path / "tasks.csv"))
    assert [e.score for e in play(env, build_rows(env, None), env.solve)] == [1.0, 1.0]
    (tmp_path / "tasks.txt").write_text("What is 1+1?\n")
    for name, kind in (("tasks.txt", "a file of another kind"), ("", "a folder")):
        result = CliRunner().invoke(app, ["env", "check", "--rl-env", f"dataset:{tmp_path / name}", "--episodes", "1"])
        assert result.exit_code == 2
        assert f"error: rows '{tmp_path / name}' is {kind}; name a .parquet, .json, .jsonl, .csv file" in result.output


@pytest.mark.parametrize("name, text, said", [
    ("bad.jsonl", '{"prompt": "a", "answer": 1}\n{prompt: "b"}\n',
     "line 2 is not JSON (Expecting property name enclosed in double quotes at column 2: '{prompt: \"b\"}')"),
    ("empty.jsonl", "", "is empty; give a .parquet, .json, .jsonl, .csv file"),
    ("bad.json", '[{"prompt": "a"},\n {"prompt": "b",}]', "line 2 is not JSON"),
    ("scalar.json", "3", "holds a JSON int, not rows"),
])
def test_a_file_that_is_not_rows_is_named_with_its_line(tmp_path, name, text, said):
    (tmp_path / name).write_text(text)
    with pytest.raises(EnvLoadError) as raised:
        DatasetEnv(str(tmp_path / name))
    assert said in str(raised.value) and "\n" not in str(raised.value), str(raised.value)


def test_json_files_hold_rows_as_an_array_columns_or_lines(tmp_path):
    forms = {"array.json": json.dumps([{"prompt": "1+1?", "answer": 2}, {"prompt": "2+2?", "answer": 4}]),
             "columns.json": json.dumps({"prompt": ["1+1?", "2+2?"], "answer": [2, 4]}),
             "lines.json": '{"prompt": "1+1?", "answer": 2}\n\n{"prompt": "2+2?", "answer": 4}\n'}
    for name, text in forms.items():
        (tmp_path / name).write_text(text)
        rows = build_rows(DatasetEnv(str(tmp_path / name)), None)
        assert [(r["prompt"][-1]["content"], r["answer"]) for r in rows] == [("1+1?", 2), ("2+2?", 4)], name
