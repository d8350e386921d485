"""`aitrain env check` as an environment author uses it: a good environment passes with its numbers shown,
a broken one exits 1 naming the fault, a suspicious one passes with a warning that says what to fix.

The hotel check runs the installed command in a subprocess; the others invoke the same typer app
in-process (same code, same exit codes and output), which saves seconds of imports per case."""

from __future__ import annotations

import re
import shutil

import pytest

from helpers import REPO, in_process_cli, policy_row, run_cli

FIXTURES = REPO / "tests"
WORKBENCH = ["--rl-env-module", "envs_fixtures.workbench"]
TEXT_POLICIES = ["--policies", "oracle,empty"]


@pytest.fixture
def aitrain(monkeypatch):
    """Run `aitrain ARGS` in-process from tests/, where the fixture environments resolve."""
    return in_process_cli(monkeypatch, FIXTURES)


def test_hotel_oracle_scores_one_empty_scores_zero_and_the_model_plays(tiny_model_dir):
    result = run_cli("env", "check", "--rl-env-module", "envs.hotel", "--rl-env-class", "HotelEnv",
                     "--model", tiny_model_dir, "--episodes", "6", "--rl-max-new-tokens", "24")
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert policy_row(out, "oracle")[:3] == ["1.000", "1.000", "1.000"]
    assert policy_row(out, "empty")[:3] == ["0.000", "0.000", "0.000"]
    model = policy_row(out, "model")
    mean, low, high, turns = map(float, model[:4])
    assert low <= mean <= high and turns >= 1.0 and model[4] == "0"  # every episode played a turn, no errors
    # What the model will see: the dataset, a rendered prompt with its token count, the tools.
    assert re.search(r"rows\s+64", out)
    assert re.search(r"prompt tokens\s+\d+ in row 0; longest \d+", out)
    assert "<|im_start|>system" in out and "# Tools" in out
    assert "search_hotels(city, min_rating?, guests?)" in out and "book_hotel(hotel_id, check_in, nights, guests)" in out
    assert "env check passed" in out
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(
    "env_class, fragments",
    [
        ("ScoreTooHighEnv", ["ScoreTooHighEnv.score_episode returned 10.0, outside [0, 1]", "under the oracle policy"]),
        ("StepRaisesEnv", ["StepRaisesEnv.step raised KeyError", "8 of 8 episodes"]),
        ("SolveRaisesEnv", ["SolveRaisesEnv.solve raised ValueError: no answer", "under the oracle policy"]),
        ("NoPromptEnv", ["has no 'prompt'", "columns: question, number"]),
    ],
)
def test_a_broken_contract_exits_1_and_says_why(env_class, fragments, aitrain):
    result = aitrain("env", "check", *WORKBENCH, "--rl-env-class", env_class, "--episodes", "8", *TEXT_POLICIES)
    assert result.exit_code == 1, result.stdout + result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert errors, result.stderr
    for fragment in fragments:
        assert any(fragment in line for line in errors), (fragment, errors)
    assert "Traceback" not in result.stderr and "env check passed" not in result.stdout


def test_a_fault_every_policy_hits_is_one_error_naming_them_all(aitrain):
    result = aitrain("env", "check", *WORKBENCH, "--rl-env-class", "StepRaisesEnv", "--episodes", "8", *TEXT_POLICIES)
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "under the oracle policy" in errors[0] and "under the empty policy" in errors[0], errors


def test_the_step_column_shows_how_long_the_environment_took_to_answer(aitrain):
    result = aitrain("env", "check", *WORKBENCH, "--rl-env-class", "SlowStepEnv", "--episodes", "4", *TEXT_POLICIES)
    assert result.exit_code == 0, result.stdout + result.stderr
    for policy in ("oracle", "empty"):
        mean_ms, max_ms = (float(v) for v in policy_row(result.stdout, policy)[6].split("/"))
        assert 50.0 <= mean_ms <= max_ms < 5000.0, (policy, mean_ms, max_ms)  # every step sleeps 50 ms


def test_constant_scores_pass_with_a_no_learning_signal_warning(aitrain):
    result = aitrain("env", "check", *WORKBENCH, "--rl-env-class", "ConstantScoreEnv", *TEXT_POLICIES)
    assert result.exit_code == 0, result.stdout + result.stderr
    assert "warning: every episode scored 0.5 under every policy: there is no learning signal" in result.stdout
    assert "partial credit" in result.stdout


def test_a_metric_that_is_not_a_number_is_a_warning(aitrain):
    result = aitrain("env", "check", *WORKBENCH, "--rl-env-class", "TextMetricEnv", *TEXT_POLICIES)
    assert result.exit_code == 0, result.stdout + result.stderr
    warnings = [line for line in result.stdout.splitlines() if "episode.metrics" in line]
    assert warnings == ["warning: episode.metrics holds values that are not numbers, which training does not log: "
                        "'verdict' is str 'right'; put a number there (a flag as True/False, a count), or text in "
                        "episode.state"], result.stdout


def test_an_empty_reply_from_step_is_a_warning(aitrain):
    result = aitrain("env", "check", *WORKBENCH, "--rl-env-class", "EmptyReplyEnv", "--episodes", "4", *TEXT_POLICIES)
    assert result.exit_code == 0, result.stdout + result.stderr
    # The oracle answers right (no reply); the empty policy is answered "" in each of its 4 episodes.
    assert ("warning: step replied with empty text in 4 episode(s): the model was sent an empty message; return "
            "None to end the episode, or the text the model should answer") in result.stdout, result.stdout
    good = aitrain("env", "check", *WORKBENCH, "--rl-env-class", "NumberEnv", "--episodes", "4", *TEXT_POLICIES)
    assert "warning:" not in good.stdout and "with 0 warning(s)" in good.stdout, good.stdout


def test_an_oracle_below_one_is_a_warning(aitrain):
    result = aitrain("env", "check", *WORKBENCH, "--rl-env-class", "WrongOracleEnv", "--episodes", "4", *TEXT_POLICIES)
    assert result.exit_code == 0, result.stdout + result.stderr
    assert "the oracle (solve) scored below 1.0 in 4 of 4 episodes (mean 0.500" in result.stdout
    assert "no learning signal" not in result.stdout  # the scores do vary (0.5 vs 0.0)


def test_an_environment_without_solve_skips_the_oracle(aitrain):
    result = aitrain("env", "check", "--rl-env-module", "envs_fixtures.good", "--rl-env-class", "GoodEnv",
                     "--rl-env-config", '{"num_tasks": 3}', *TEXT_POLICIES)
    assert result.exit_code == 0, result.stdout + result.stderr
    assert "GoodEnv has no solve(episode) -> str, so no oracle was played" in result.stdout
    assert policy_row(result.stdout, "empty")[0] == "1.000"
    assert "warning: an empty reply scores 1.000 on average" in result.stdout


def test_a_template_that_rewrites_earlier_turns_is_a_warning(aitrain, tiny_model_dir, tmp_path):
    # Like templates that strip past reasoning: earlier assistant turns lose their content.
    model = tmp_path / "rewriting"
    shutil.copytree(tiny_model_dir, model)
    template = (model / "chat_template.jinja").read_text()
    keep_content = "{%- if message.content is string -%}"
    assert template.count(keep_content) == 1, "the tiny model's chat template changed; update this test"
    (model / "chat_template.jinja").write_text(template.replace(
        keep_content, "{%- if message.content is string and (message.role != 'assistant' or loop.last) -%}"))
    result = aitrain("env", "check", *WORKBENCH, "--rl-env-class", "NumberEnv", "--model", str(model),
                     "--policies", "empty")
    assert result.exit_code == 0, result.stdout + result.stderr
    assert "warning: the chat template rewrites earlier turns" in result.stdout
    assert "use a model whose template only appends turns" in result.stdout


def test_the_tiny_template_is_append_only(aitrain):
    # A policy named twice is played once: twice, the oracle's 1.0 read as "1 under every policy: no signal".
    result = aitrain("env", "check", *WORKBENCH, "--rl-env-class", "NumberEnv", "--policies", "oracle,oracle")
    assert result.exit_code == 0, result.stdout + result.stderr
    assert "append-only" not in result.stdout and "rewrites earlier turns" not in result.stdout
    assert policy_row(result.stdout, "oracle")[0] == "1.000"
    assert "warning:" not in result.stdout  # one policy scoring 1.0 everywhere is what an oracle should do


@pytest.mark.parametrize(
    "args, fragment",
    [
        (["--rl-env-class", "NumberEnv", "--policies", "oracle,random"], "--policies takes a comma-separated list"),
        (["--rl-env-class", "NumberEnv", "--episodes", "0"], "--episodes must be a positive integer"),
        (["--rl-env-class", "NumberEnvv"], "did you mean 'NumberEnv'"),
        (["--rl-env-class", "NumberEnv", "--model", "/nonexistent/model"], "does not exist"),
    ],
)
def test_bad_options_are_one_line_errors(args, fragment, aitrain):
    result = aitrain("env", "check", *WORKBENCH, *args)
    assert result.exit_code == 2, result.stdout + result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and fragment in lines[0], result.stderr


def test_under_a_window_the_oracle_plays_as_training_plays_it(aitrain, tiny_model_dir):
    # Four 170-token pages and the task pass a 1000-token window under keep: training's engine cuts every
    # episode, so env check's oracle (played at text level it scores 1.0 on every task) must show the cut.
    longdocs = ["--rl-env-module", "envs.longdocs", "--rl-env-class", "LongDocsEnv", "--model", tiny_model_dir,
                "--rl-env-config", '{"num_tasks": 4, "documents": 4, "page_words": 60}', "--episodes", "4",
                "--policies", "oracle,empty"]
    text_level = aitrain("env", "check", *longdocs)
    assert text_level.exit_code == 0, text_level.stdout
    assert policy_row(text_level.stdout, "oracle")[0] == "1.000"
    windowed = aitrain("env", "check", *longdocs, "--rl-context-window", "1000", "--rl-context", "keep")
    assert float(policy_row(windowed.stdout, "oracle")[0]) < 1.0, windowed.stdout
    assert policy_row(windowed.stdout, "oracle")[5] == "4"  # the cut column: every episode cut by the window


def test_env_check_refuses_what_grpo_refuses_before_a_model_loads(aitrain, tiny_model_dir):
    # A window that cannot hold a prompt and one reply: grpo refuses it (training/preflight/run_checks.py),
    # and env check, which used to play on, refuses it in the same one line.
    result = aitrain("env", "check", *WORKBENCH, "--rl-env-class", "NumberEnv", "--model", tiny_model_dir,
                     "--rl-context-window", "10", *TEXT_POLICIES)
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert result.exit_code == 2 and len(errors) == 1 and "--rl-context-window 10 cannot hold" in errors[0], result.stderr
