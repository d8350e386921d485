"""The judge reward (`--rl-judge-rubric`, training/rewards/judge.py): group and episode modes read the judge's
JSON scores; a nonsense reply, an HTTP error or a refused connection scores the fallback and is counted;
repeated transcripts hit the cache; a CLI run on the tiny model with a judge behind a local fake
OpenAI-compatible server (no provider is reachable here) logs rewards/judge/mean, weights it into the
total, sends the key and writes it into no file of the run folder; the tiny model judges in-process for
one step (its model's generate scripted to write a score); bad options are named in one line, a pasted key never echoed. About a minute (two tiny-model runs)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from aitrain_grpo import RunConfig
from aitrain_grpo.env.base import Episode
from aitrain_grpo.errors import ConfigError
from aitrain_grpo.training.rewards.judge import HttpJudge, Judge, parse_scores
from helpers import REPO
from helpers.fake_judge import FakeJudge, one_judged_step

KEY_ENV = "AITRAIN_JUDGE_TEST_KEY"  # a name redaction does not know as secret: only the judge keeps it out
KEY = "sk-judge-test-7f3a9c1e5b"
LETTERS = ["--rl-env-module", "envs.letters", "--rl-env-class", "LetterEnv", "--rl-env-config",
           '{"turns": 1, "num_tasks": 8}']


@pytest.fixture
def fake():
    server = FakeJudge()
    yield server
    server.close()


def episodes(count: int, tag: str = "") -> list[Episode]:
    prompt = [{"role": "user", "content": "Write about the sea."}]
    return [Episode(row={"prompt": prompt}, messages=[*prompt, {"role": "assistant", "content": f"reply {i}{tag}"}])
            for i in range(count)]


def judge_at(url: str, mode: str, fallback: float = 0.0, group_size: int = 2) -> Judge:
    return Judge("Reward vivid replies.", mode, fallback, group_size, HttpJudge(url + "/v1", "fake", None))


def scored(judge: Judge, eps: list[Episode]) -> tuple[list[float], dict[str, float]]:
    metrics: dict[str, float] = {}
    scores = judge.score(eps, lambda name, value: metrics.__setitem__(name, value))
    return scores, metrics


# ------------------------------------------------------------------------------------ the pieces


def test_group_mode_scores_each_group_in_one_call(fake):
    scores, metrics = scored(judge_at(fake.url, "group", group_size=2), episodes(4))
    assert scores == [0.0, 0.5, 0.0, 0.5]  # two groups of two, each scored i / 2 in order
    assert len(fake.requests) == 2 and metrics == {"judge/failures": 0.0, "judge/cache_hits": 0.0}
    request = next(r for r in fake.requests if "reply 0" in r["body"]["messages"][-1]["content"])  # calls run in parallel
    assert request["path"] == "/v1/chat/completions" and request["body"]["model"] == "fake"
    system, ask = request["body"]["messages"]
    assert "Reward vivid replies." in system["content"]
    assert "Write about the sea." in ask["content"] and "reply 0" in ask["content"] and "reply 1" in ask["content"]
    assert ask["content"].count("Write about the sea.") == 1  # the shared task is shown once


def test_episode_mode_scores_each_episode_in_its_own_call(fake):
    scores, metrics = scored(judge_at(fake.url, "episode"), episodes(3))
    assert scores == [0.75] * 3 and len(fake.requests) == 3 and metrics["judge/failures"] == 0


@pytest.mark.parametrize("mode", ["group", "episode"])
def test_a_nonsense_reply_scores_the_fallback_and_is_counted(fake, mode, capsys):
    fake.reply = "They are all wonderful, I would give them a ten."
    judge = judge_at(fake.url, mode, fallback=0.25)
    scores, metrics = scored(judge, episodes(4))
    assert scores == [0.25] * 4
    assert metrics["judge/failures"] == (2 if mode == "group" else 4)
    assert capsys.readouterr().err.count("warning: the judge") == 1  # once, then only counted
    fake.reply = None  # failures are not cached: the next batch asks again
    assert scored(judge, episodes(4))[1]["judge/failures"] == 0


def test_an_http_error_or_a_refused_connection_scores_the_fallback(fake, refused_url):
    fake.status = 500
    assert scored(judge_at(fake.url, "group", fallback=0.5), episodes(2)) == ([0.5, 0.5], {
        "judge/failures": 1.0, "judge/cache_hits": 0.0})
    scores, metrics = scored(judge_at(refused_url, "episode"), episodes(2))
    assert scores == [0.0, 0.0] and metrics["judge/failures"] == 2


def test_a_key_the_server_echoes_in_its_error_is_masked(fake, monkeypatch, capsys):
    monkeypatch.setenv(KEY_ENV, KEY)
    fake.status, fake.reply = 401, f"Incorrect API key provided: {KEY}"
    judge = Judge("r", "episode", 0.0, 2, HttpJudge(fake.url + "/v1", "fake", KEY_ENV))
    assert scored(judge, episodes(1))[0] == [0.0]
    err = capsys.readouterr().err
    assert "HTTP 401" in err and KEY not in err and fake.requests[0]["auth"] == f"Bearer {KEY}"


def test_repeated_transcripts_hit_the_cache(fake):
    judge = judge_at(fake.url, "episode")
    scored(judge, episodes(2))
    scores, metrics = scored(judge, [*episodes(2), *episodes(1, tag=" new")])
    assert scores == [0.75] * 3 and metrics["judge/cache_hits"] == 2 and len(fake.requests) == 3
    judge.rubric = "Another rubric."  # the rubric is part of the key
    assert scored(judge, episodes(1))[1]["judge/cache_hits"] == 0


@pytest.mark.parametrize("reply, count, mode, expected", [
    ("[0.1, 1, 0]", 3, "group", [0.1, 1.0, 0.0]),
    ('Here: ```json\n{"scores": [{"score": 0.2}, {"score": 0.9}]}\n```', 2, "group", [0.2, 0.9]),
    ("Scores: [0.3, 0.7]. The second is [more] vivid.", 2, "group", [0.3, 0.7]),  # prose around the JSON
    ("[0.5, 0.5]", 3, "group", None),  # one score short
    ("[0.5, 7]", 2, "group", None),  # out of [0, 1]
    ("[true, 0]", 2, "group", None),
    ('{"score": 0.4}', 1, "episode", [0.4]),
    ("0.6", 1, "episode", [0.6]),
    ("__import__('os').system('true')", 1, "episode", None),  # read as JSON, never evaluated
])
def test_replies_are_read_as_json_scores(reply, count, mode, expected):
    assert parse_scores(reply, count, mode) == expected


# ------------------------------------------------------------------------------------ real runs


def test_a_cli_run_with_a_judge_at_a_url_logs_it_and_writes_the_key_nowhere(fake, tiny_model_dir, tmp_path):
    (tmp_path / "rubric.txt").write_text("Reward replies that use many letters a.\n")
    out = tmp_path / "out"
    result = subprocess.run(
        [sys.executable, "-m", "aitrain_grpo", "grpo", *LETTERS, "--model", tiny_model_dir, "--output-dir", str(out),
         "--max-steps", "1", "--batch-size", "4", "--rl-num-generations", "2", "--rl-max-new-tokens", "16",
         "--rl-judge-rubric", f"@{tmp_path / 'rubric.txt'}", "--rl-judge-url", fake.url + "/v1",
         "--rl-judge-model", "fake", "--rl-judge-api-key-env", KEY_ENV, "--rl-reward-weights", "1,2"],
        cwd=REPO, env=dict(os.environ, OMP_NUM_THREADS="1", **{KEY_ENV: KEY}), capture_output=True, text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert fake.requests and all(r["auth"] == f"Bearer {KEY}" for r in fake.requests)
    assert "Reward replies that use many letters a." in fake.requests[0]["body"]["messages"][0]["content"]
    record = json.loads((out / "metrics.jsonl").read_text().splitlines()[0])
    assert record["rewards/judge/mean"] == pytest.approx(0.25)  # groups of two score [0, 0.5]
    assert record["judge/failures"] == 0
    assert record["reward"] == pytest.approx(record["rewards/episode_score/mean"] + 2 * 0.25, abs=1e-4)
    config = json.loads((out / "run_config.json").read_text())
    assert config["rl_judge_api_key_env"] == KEY_ENV  # the variable's name, kept to reproduce the run
    files = [p for p in out.rglob("*") if p.is_file()]
    assert len(files) > 3
    assert not [str(p) for p in files if KEY.encode() in p.read_bytes()]
    assert KEY not in result.stdout + result.stderr


def a_share(judge_prompt: str) -> float:
    """The share of the letters of the judged reply (the transcript's last assistant turn) that are 'a'."""
    reply = judge_prompt.rsplit("[assistant]", 1)[-1].split("\n\nScore it by the rubric")[0]
    letters = [c for c in reply.lower() if c.isalpha()]
    return round(letters.count("a") / len(letters), 2) if letters else 0.0


@pytest.fixture
def scripted_local_judge(monkeypatch):
    """The in-process judge (`LocalJudge`: the model loaded, its chat template, its context check, decoding
    and parsing) with the model's generate scripted: it writes `{"score": S}`, S the share of the letters
    of the judged reply that are 'a' (the rubric's ask), as tokens after the prompt. The tiny model itself
    never writes a readable score, so a judge that scores at all shows here. The prompts it was given
    are kept."""
    import torch

    from aitrain_grpo.training.rewards.judge import LocalJudge

    prompts: list[str] = []
    load = LocalJudge.__init__

    def scripted(self, model_name):
        load(self, model_name)
        tokenizer = self.tokenizer

        def generate(inputs, **kwargs):
            prompt = tokenizer.decode(inputs[0])
            prompts.append(prompt)
            ids = tokenizer(json.dumps({"score": a_share(prompt)}), add_special_tokens=False)["input_ids"]
            return torch.cat([inputs, torch.tensor([ids], device=inputs.device)], dim=1)

        self.model.generate = generate

    monkeypatch.setattr(LocalJudge, "__init__", scripted)
    return prompts


def test_an_in_process_judge_scores_each_episode_for_one_step(tiny_model_dir, tmp_path, capsys, scripted_local_judge):
    record = one_judged_step(tiny_model_dir, tmp_path / "out", rl_num_generations=2, rl_judge_model="self",
                             rl_judge_mode="episode", rl_judge_fallback=0.321)
    prompts = scripted_local_judge
    assert len(prompts) == 4 and all("Many letters a." in prompt for prompt in prompts)  # one call per episode
    expected = [a_share(prompt) for prompt in prompts]  # what the scripted judge wrote, read back as its reward
    assert record["judge/failures"] == 0
    assert record["rewards/judge/mean"] == pytest.approx(sum(expected) / 4, abs=1e-4)
    assert record["rewards/judge/mean"] != pytest.approx(0.321)  # four 2-decimal scores never average to the fallback
    assert "warning: the judge" not in capsys.readouterr().err


@pytest.mark.parametrize("options, fragment", [
    ({"rl_judge_model": "self"}, "--rl-judge-model needs --rl-judge-rubric"),
    ({"rl_judge_mode": "episode"}, "--rl-judge-mode needs --rl-judge-rubric"),
    ({"rl_judge_rubric": "x"}, "--rl-judge-rubric needs --rl-judge-model"),
    ({"rl_judge_rubric": "@/no/such/rubric.txt", "rl_judge_model": "self"}, "no such file"),
    ({"rl_judge_rubric": "x", "rl_judge_model": "m", "rl_judge_url": "http://h/v1", "rl_judge_api_key_env": KEY_ENV},
     f"{KEY_ENV}: that environment variable is not set"),
    ({"rl_judge_rubric": "x", "rl_judge_model": "self", "rl_reward_weights": "1,1,1"}, "then the judge's"),
])
def test_bad_judge_options_are_named(options, fragment, monkeypatch):
    monkeypatch.delenv(KEY_ENV, raising=False)
    with pytest.raises(ConfigError, match=re.escape(fragment)):
        RunConfig(rl_env_module="envs.letters", rl_env_class="LetterEnv", **options).validate()


def test_a_key_pasted_for_its_variable_exits_2_without_echoing_it(tiny_model_dir, tmp_path):
    flags = ["--rl-judge-rubric", "x", "--rl-judge-model", "m", "--rl-judge-url", "http://h/v1",
             "--rl-judge-api-key-env", "sk-pasted-key-1234"]
    result = subprocess.run(
        [sys.executable, "-m", "aitrain_grpo", "grpo", *LETTERS, "--model", tiny_model_dir,
         "--output-dir", str(tmp_path / "out"), *flags], cwd=REPO, capture_output=True, text=True, timeout=120)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 2 and len(lines) == 1 and "not the key itself" in lines[0], result.stderr
    assert "sk-pasted-key-1234" not in result.stderr
