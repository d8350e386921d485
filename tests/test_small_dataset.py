"""A dataset with fewer prompts than one step takes still trains every step asked (its rows repeated,
said once), and a run that ends with fewer steps than asked says so and exits 1, never "done"."""

from __future__ import annotations

import json
import re

from typer.testing import CliRunner

from aitrain_grpo.commands.cli import app
from aitrain_grpo.config import RunConfig
from aitrain_grpo.training.preflight import small_dataset as small_dataset
from helpers import REPO, run_cli

ONE_ROW_ENV = '''
from aitrain_grpo import Environment


class OneRow(Environment):
    def build_dataset(self, tokenizer):
        return [{"prompt": "Say a."}]

    def score_episode(self, episode):
        return float("a" in episode.last_completion)
'''


def readme_calculator_module(folder) -> None:
    """docs/environments.md's Calculator example, saved as envs/calc.py."""
    blocks = re.findall(r"```python\n(.*?)```", (REPO / "docs" / "environments.md").read_text(), flags=re.S)
    (code,) = [block for block in blocks if "class Calculator(" in block]
    (folder / "envs").mkdir()
    (folder / "envs" / "__init__.py").write_text("")
    (folder / "envs" / "calc.py").write_text(code)


def test_readme_calculator_example_trains_the_steps_it_asks_for(tmp_path, tiny_model_dir):
    readme_calculator_module(tmp_path)
    out = tmp_path / "out"
    result = run_cli("grpo", "--rl-env-module", "envs.calc", "--rl-env-class", "Calculator", "--max-steps", "3",
                     "--model", tiny_model_dir, "--output-dir", str(out), "--rl-max-new-tokens", "32", cwd=tmp_path)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    notes = [line for line in result.stderr.splitlines() if "repeating the rows" in line]
    assert len(notes) == 1, result.stderr
    assert "has 1 prompt(s) but one step takes 2" in notes[0] and "--batch-size 8" in notes[0]
    assert "not to be a single sample" not in result.stdout + result.stderr
    assert "done: 3 steps" in result.stdout
    steps = [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3]


def test_prompts_per_step_counts_accumulation_and_processes():
    config = RunConfig(rl_env_module="m", rl_env_class="C", batch_size=8, rl_num_generations=4,
                       gradient_accumulation_steps=3)
    assert small_dataset.prompts_per_step(config, processes=2) == 12
    rows = [{"prompt": "x", "n": 0}, {"prompt": "y", "n": 1}]
    assert [r["n"] for r in small_dataset.fill_one_step(rows, config, processes=2)] == [0, 1] * 6
    assert small_dataset.fill_one_step(rows * 6, config, processes=2) == rows * 6  # enough: untouched


def test_a_run_that_ends_short_says_so_and_exits_1(tmp_path, tiny_model_dir, monkeypatch):
    """Without the repeat, transformers ends a one-row run at step 0 as if it had finished."""
    (tmp_path / "one_row.py").write_text(ONE_ROW_ENV)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(small_dataset, "fill_one_step", lambda rows, config, processes=None: rows)
    result = CliRunner().invoke(app, [
        "grpo", "--rl-env-module", "one_row", "--rl-env-class", "OneRow", "--max-steps", "3",
        "--model", tiny_model_dir, "--output-dir", str(tmp_path / "out"), "--rl-max-new-tokens", "8",
    ])
    assert result.exit_code == 1, result.output
    assert "error: the run ended after 0 of 3 steps" in result.output
    assert "done:" not in result.output
