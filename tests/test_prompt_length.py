"""A dataset whose prompts do not fit the model's context is refused in one line before training (issue
35, item 3): it used to print one transformers warning and run for minutes with no output."""

from __future__ import annotations

import pytest

from helpers import run_cli

from aitrain_grpo.errors import ConfigError
from aitrain_grpo.training.preflight.prompt_length import check_prompt_lengths, model_context

LONG_ENV = '''
from envs.letters import LetterEnv


class LongPrompts(LetterEnv):
    """envs.letters with one prompt far past the tiny model's 4,096 tokens."""

    def build_dataset(self, tokenizer):
        rows = super().build_dataset(tokenizer)
        rows[1]["prompt"] = [{"role": "user", "content": "many words " * 5000}]
        return rows
'''


def test_grpo_refuses_prompts_longer_than_the_context_in_one_line(tmp_path, tiny_model_dir):
    (tmp_path / "long_envs.py").write_text(LONG_ENV)
    out = tmp_path / "run"
    result = run_cli("grpo", "--model", tiny_model_dir, "--rl-env-module", "long_envs", "--rl-env-class", "LongPrompts",
                     "--output-dir", str(out), "--max-steps", "1", cwd=tmp_path, timeout=300)
    assert result.returncode == 2, result.stderr[-2000:]
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("error: 1 of 64 dataset prompts do not fit"), last
    assert "context of 4096 tokens" in last and "row 1" in last and "shorten or drop them in build_dataset" in last
    assert "Traceback" not in result.stderr
    assert not out.exists()  # nothing written, not even the lock


def test_short_prompts_pass_without_being_tokenized(tiny_model_and_tokenizer):
    model, tokenizer = tiny_model_and_tokenizer
    assert model_context(model, tokenizer) == 4096

    class NoTokenizing:
        model_max_length = tokenizer.model_max_length

        def __call__(self, *args, **kwargs):
            raise AssertionError("a short prompt was tokenized")

        apply_chat_template = __call__

    rows = [{"prompt": "short"}] * 10_000
    check_prompt_lengths(rows, NoTokenizing(), model, reply_tokens=128, model_name="tiny")
    with pytest.raises(ConfigError, match="1 of 2 dataset prompts do not fit tiny's context of 4096 tokens"):
        check_prompt_lengths([{"prompt": "short"}, {"prompt": "word " * 5000}], tokenizer, model, reply_tokens=128,
                             model_name="tiny")


def test_a_prompt_is_measured_with_the_tools_its_episodes_offer(tiny_model_and_tokenizer):
    """A prompt that fits alone but not with its tools' schemas, which the rollout renders into the same
    prompt, is refused: it was measured without them and passed."""
    model, tokenizer = tiny_model_and_tokenizer

    class ToolHeavy:  # a duck-typed environment: its tools are every row's
        tools = [{"type": "function", "function": {"name": "lookup", "description": "find a word " * 1500,
                                                   "parameters": {"type": "object", "properties": {}}}}]

    rows = [{"prompt": "word " * 2500}]
    check_prompt_lengths(rows, tokenizer, model, reply_tokens=128, model_name="tiny")  # alone: it fits
    with pytest.raises(ConfigError, match="1 of 1 dataset prompts do not fit tiny's context of 4096 tokens"):
        check_prompt_lengths(rows, tokenizer, model, reply_tokens=128, model_name="tiny", env=ToolHeavy())
