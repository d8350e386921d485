"""A judge that cannot work is found before step 1, and one that stops working stops the run
(training/rewards/judge_setup.py, failing.py): an unreachable `--rl-judge-url` exits 2 in one line
before the model loads, writing nothing; a server that refuses the test call (a rubric past its context)
is named with the rubric's size; a rubric past an in-process judge's context, a judge model that is not
there and a rubric folder are each named with their own flag; every call of 3 batches in a row failing
raises `RewardFailing`, one that scores in between starts the count again, and a CLI run whose judge
starts failing after its test call stops after 3 steps, exit 1, with a checkpoint. About 40 seconds."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from types import SimpleNamespace

import pytest

from aitrain_grpo import RunConfig
from aitrain_grpo.env.base import Episode
from aitrain_grpo.errors import ConfigError
from aitrain_grpo.training.rewards.judge import HttpJudge, Judge
from aitrain_grpo.training.rewards.failing import FAILED_BATCHES, RewardFailing
from aitrain_grpo.training.rewards.judge_setup import build_judge
from helpers import REPO
from helpers.fake_judge import FakeJudge

LETTERS = ["--rl-env-module", "envs.letters", "--rl-env-class", "LetterEnv", "--rl-env-config",
           '{"turns": 1, "num_tasks": 8}', "--batch-size", "4", "--rl-num-generations", "2",
           "--rl-max-new-tokens", "16"]


@pytest.fixture
def fake():
    server = FakeJudge()
    yield server
    server.close()


def judge_options(**options) -> SimpleNamespace:
    """What `build_judge` reads of a run's options."""
    defaults = dict(rl_judge_rubric="Reward vivid replies.", rl_judge_model="fake", rl_judge_url=None,
                    rl_judge_api_key_env=None, rl_judge_mode="group", rl_judge_fallback=0.0, rl_num_generations=2,
                    model="tiny")
    return SimpleNamespace(**{**defaults, **options})


def aitrain(*args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "aitrain_grpo", "grpo", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=timeout, env=dict(os.environ, OMP_NUM_THREADS="1"))


def error_lines(result: subprocess.CompletedProcess) -> list[str]:
    return [line for line in result.stderr.splitlines() if line.startswith("error:")]


# ------------------------------------------------------------------------------------ before step 1


def test_an_unreachable_judge_url_exits_2_before_the_model_loads(refused_url, tiny_model_dir, tmp_path):
    out = tmp_path / "out"
    result = aitrain(*LETTERS, "--model", tiny_model_dir, "--output-dir", str(out), "--max-steps", "1",
                     "--rl-judge-rubric", "Many letters a.", "--rl-judge-url", refused_url + "/v1",
                     "--rl-judge-model", "fake")
    assert result.returncode == 2, result.stderr[-2000:]
    assert error_lines(result) == [line for line in result.stderr.splitlines() if line.strip()], result.stderr
    (line,) = error_lines(result)
    assert line.startswith(f"error: --rl-judge-url {refused_url}/v1/chat/completions: the judge's test call")
    assert "Connection refused" in line or "ConnectError" in line
    assert not out.exists() or not any(out.iterdir())  # nothing written, no lock left


def test_a_server_that_refuses_the_test_call_is_named_with_the_rubric_size(fake):
    fake.status = 400
    fake.reply = "This model's maximum context length is 4096 tokens."
    with pytest.raises(ConfigError, match=r"--rl-judge-url .*test call before step 1 failed \(.*HTTP 400.*maximum "
                                          r"context length.*the rubric is 50,000 characters"):
        build_judge(judge_options(rl_judge_url=fake.url + "/v1", rl_judge_rubric="x" * 50_000))
    assert len(fake.requests) == 1  # one call, no retries
    assert "x" * 50_000 in fake.requests[0]["body"]["messages"][0]["content"]  # the run's rubric, as it is sent


def test_a_judge_that_answers_its_test_call_is_built_and_asked_once(fake, capsys):
    judge = build_judge(judge_options(rl_judge_url=fake.url + "/v1"))
    try:
        assert isinstance(judge, Judge) and len(fake.requests) == 1
        assert "2 conversations follow" in fake.requests[0]["body"]["messages"][1]["content"]  # the run's own mode
        assert "warning" not in capsys.readouterr().err
    finally:
        judge.close()


def test_a_rubric_past_an_in_process_judges_context_is_refused(tiny_model_dir, tmp_path):
    rubric = tmp_path / "rubric.txt"
    rubric.write_text("Reward replies that use many letters a. " * 100_000)  # 4 MB, read stripped
    with pytest.raises(ConfigError, match=r"^--rl-judge-rubric: the judge's prompt with this rubric \(3,999,999 "
                                          r"characters\).*exceeds the judge's context \(--model .*: 4,096 tokens\)"):
        build_judge(judge_options(rl_judge_rubric=f"@{rubric}", rl_judge_model="self", model=tiny_model_dir))


def test_a_judge_model_that_is_not_there_is_named_with_its_flag(tmp_path):
    missing = str(tmp_path / "no-such-judge")
    with pytest.raises(ConfigError, match=rf"^--rl-judge-model {re.escape(missing)} \(the judge\): .*does not exist"):
        build_judge(judge_options(rl_judge_model=missing))


def test_a_rubric_folder_is_named_as_a_folder(tmp_path):
    with pytest.raises(ConfigError, match=r"--rl-judge-rubric @.*: that is a folder; name the rubric's file"):
        RunConfig(rl_env_module="envs.letters", rl_env_class="LetterEnv", rl_judge_rubric=f"@{tmp_path}",
                  rl_judge_model="self").validate()


# ------------------------------------------------------------------------------------ while the run goes


def episodes(count: int, tag: str) -> list[Episode]:
    prompt = [{"role": "user", "content": "Write about the sea."}]
    return [Episode(row={"prompt": prompt}, messages=[*prompt, {"role": "assistant", "content": f"reply {i} {tag}"}])
            for i in range(count)]


def test_every_call_of_3_batches_in_a_row_failing_stops_and_a_scored_one_resets(fake):
    judge = Judge("Reward vivid replies.", "group", 0.0, 2, HttpJudge(fake.url + "/v1", "fake", None), " at fake")
    fake.reply = "no idea"
    for batch in range(FAILED_BATCHES - 1):
        assert judge.score(episodes(4, f"a{batch}")) == [0.0] * 4
    fake.reply = None  # one batch that scores starts the count again
    assert judge.score(episodes(4, "b")) == [0.0, 0.5, 0.0, 0.5]
    fake.reply = "no idea"
    for batch in range(FAILED_BATCHES - 1):
        judge.score(episodes(4, f"c{batch}"))
    judge.score(episodes(4, "b"))  # only cache hits: no call, the count stays
    with pytest.raises(RewardFailing, match=rf"^the judge at .* failed every call of {FAILED_BATCHES} batches in a "
                                           r"row \(last: answered no 2 score\(s\).*'no idea'\); the run stopped"):
        judge.score(episodes(4, "d"))


def test_a_run_whose_judge_starts_failing_stops_with_a_checkpoint(fake, tiny_model_dir, tmp_path):
    fake.reply_for = lambda ask: "[0, 0.5]" if len(fake.requests) <= 1 else "the server is overloaded"
    out = tmp_path / "out"
    result = aitrain(*LETTERS, "--model", tiny_model_dir, "--output-dir", str(out), "--max-steps", "8",
                     "--save-steps", "100", "--rl-judge-rubric", "Many letters a.", "--rl-judge-url", fake.url + "/v1",
                     "--rl-judge-model", "fake", "--rl-judge-fallback", "0.25")
    assert result.returncode == 1, result.stderr[-3000:]
    (line,) = error_lines(result)
    assert f"failed every call of {FAILED_BATCHES} batches in a row" in line
    assert "--rl-judge-fallback 0.25" in line and "'the server is overloaded'" in line
    records = [json.loads(row) for row in (out / "metrics.jsonl").read_text().splitlines()]
    assert len(records) == FAILED_BATCHES - 1  # the third failed batch never trained
    assert (out / f"checkpoint-{FAILED_BATCHES - 1}").is_dir() and "resume with:" in result.stderr
