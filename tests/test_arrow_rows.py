"""Rows Python holds but a training table cannot: a column that is a number in one row and text in another
is refused in one line by `env check` and by `grpo` (it was a pyarrow traceback after the model loaded,
while env check passed), and prompts that mix the two valid forms (a string, a list of messages) train.
"""

from __future__ import annotations

import json

from typer.testing import CliRunner

from aitrain_grpo.commands.cli import app
from aitrain_grpo.config import RunConfig
from aitrain_grpo.training.trainer import train
from envs.letters import LetterEnv
from helpers import REPO


def test_a_column_of_two_types_is_refused_in_one_line_by_env_check_and_grpo(tmp_path, monkeypatch, tiny_model_dir):
    monkeypatch.chdir(REPO)
    tasks = tmp_path / "mixed.jsonl"
    tasks.write_text("".join(json.dumps(row) + "\n" for row in (
        {"prompt": "1+1?", "answer": 2}, {"prompt": "2+2?", "answer": "four"}, {"prompt": "3+3?", "answer": 6})))
    said = "column 'answer' is number in row 0 and str in row 1; training stores each column as one type"
    checked = CliRunner().invoke(app, ["env", "check", "--rl-env", f"dataset:{tasks}", "--episodes", "1",
                                       "--policies", "oracle"])
    assert checked.exit_code != 0 and said in checked.output, checked.output
    out = tmp_path / "run"
    trained = CliRunner().invoke(app, ["grpo", "--model", tiny_model_dir, "--rl-env", f"dataset:{tasks}",
                                       "--max-steps", "1", "--output-dir", str(out)])
    errors = [line for line in trained.output.splitlines() if line.startswith("error:")]
    assert trained.exit_code != 0 and len(errors) == 1 and said in errors[0], trained.output
    assert "Traceback" not in trained.output and not (out / "run_config.json").exists()


class MixedPrompts(LetterEnv):
    """LetterEnv whose even rows give the prompt as a string and odd rows as messages."""

    def build_dataset(self, tokenizer) -> list[dict]:
        rows = super().build_dataset(tokenizer)
        return [{**row, "prompt": row["prompt"][0]["content"]} if i % 2 == 0 else row for i, row in enumerate(rows)]


def test_prompts_mixing_text_and_messages_train(tmp_path, tiny_model_dir):
    out = tmp_path / "run"
    train(RunConfig(model=tiny_model_dir, output_dir=str(out), max_steps=1, batch_size=4, rl_num_generations=2,
                    rl_max_new_tokens=8, use_vllm=False), env=MixedPrompts(turns=1, num_tasks=4))
    records = [json.loads(line) for line in (out / "episodes.jsonl").read_text().splitlines()]
    assert len(records) == 4 and all(r["messages"][0]["content"].startswith("Task ") for r in records)


def test_a_lone_surrogate_is_named_with_its_row_and_column():
    # json.loads of a cut emoji escape makes one; the prompt-length check raised UnicodeEncodeError.
    from aitrain_grpo.env.arrow_rows import stored_rows
    from aitrain_grpo.errors import EnvLoadError

    rows = [{"prompt": "fine"}, {"prompt": [{"role": "user", "content": json.loads('"caf\\u00e9 \\ud83d"')}]}]
    try:
        stored_rows(rows, "E.build_dataset")
    except EnvLoadError as exc:
        assert str(exc) == ("E.build_dataset: row 1's 'prompt' holds '\\ud83d', a lone surrogate, which is not text "
                            "UTF-8 can store; drop it, or read the source text with errors='replace'")
    else:
        raise AssertionError("a row UTF-8 cannot store was accepted")


def test_prompt_messages_come_back_with_only_their_own_keys():
    # Arrow gives every message of the column every key any message has; a template testing
    # `'tool_calls' in message` then read the user's question as a tool call.
    from aitrain_grpo.env.arrow_rows import stored_rows
    from aitrain_grpo.env.base import prompt_messages

    call = {"type": "function", "function": {"name": "add", "arguments": '{"a": 1, "b": 2}'}}
    prompt = [{"role": "system", "content": "Use the tools."}, {"role": "user", "content": "1 + 2?"},
              {"role": "assistant", "content": None, "tool_calls": [call]},
              {"role": "tool", "name": "add", "tool_call_id": "c1", "content": "3"}, {"role": "user", "content": "And 2 + 2?"}]
    stored = stored_rows([{"prompt": prompt}, {"prompt": "plain"}])
    assert stored[0]["prompt"][0].get("tool_calls", "absent") is None  # what training's rows hold
    assert prompt_messages(stored[0]["prompt"]) == prompt
