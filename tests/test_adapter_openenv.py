"""OpenEnv environments served by real OpenEnv servers (uvicorn processes): the echo environment from
openenv's own template (`openenv init`), and a number-guessing environment written here in OpenEnv's
style, played through `--rl-env openenv:URL`."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from helpers import require  # noqa: E402

require("openenv.core.env_server.http_server", "pip install 'aitrain-grpo[openenv]'")

from aitrain_grpo.engine.runner import play  # noqa: E402
from aitrain_grpo.env.adapters.openenv import OpenEnvEnv, action_field_of  # noqa: E402
from aitrain_grpo.errors import EnvLoadError  # noqa: E402
from helpers import free_port, run_cli  # noqa: E402

GUESS_ENV = textwrap.dedent('''
    import random

    from openenv.core.env_server.http_server import create_app
    from openenv.core.env_server.interfaces import Environment
    from openenv.core.env_server.types import Action, Observation, State


    class GuessAction(Action):
        guess: str


    class GuessObservation(Observation):
        feedback: str = ""


    class GuessEnvironment(Environment):
        SUPPORTS_CONCURRENT_SESSIONS = True

        def __init__(self):
            self._state = State(step_count=0)
            self.secret = 0

        def reset(self, seed=None, episode_id=None, **kwargs):
            self.secret = random.Random(seed).randint(1, 50)
            self._state = State(step_count=0)
            return GuessObservation(feedback="Guess my number between 1 and 50.", done=False, reward=0.0)

        def step(self, action, timeout_s=None, **kwargs):
            self._state.step_count += 1
            if action.guess == "boom":
                raise RuntimeError("the game crashed on boom")
            try:
                number = int(action.guess.strip().split()[-1])
            except (ValueError, IndexError):
                return GuessObservation(feedback="Say a number.", done=False, reward=0.0)
            if number == self.secret:
                return GuessObservation(feedback="Right!", done=True, reward=1.0)
            hint = "higher" if number < self.secret else "lower"
            return GuessObservation(feedback=f"No, {hint}.", done=self._state.step_count >= 8, reward=0.0)

        @property
        def state(self):
            return self._state


    app = create_app(GuessEnvironment, GuessAction, GuessObservation, env_name="guess", max_concurrent_envs=64)
    one_session = create_app(GuessEnvironment, GuessAction, GuessObservation, env_name="guess", max_concurrent_envs=1)
''')


def serve(app: str, cwd: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    process = subprocess.Popen([sys.executable, "-m", "uvicorn", app, "--port", str(port)], cwd=cwd,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    import httpx

    for _ in range(240):
        try:
            if httpx.get(url + "/schema", timeout=1).status_code == 200:
                return process, url
        except httpx.HTTPError:
            pass
        if process.poll() is not None:
            break
        time.sleep(0.5)
    process.kill()
    raise RuntimeError(f"OpenEnv server {app} did not start")


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    folder = tmp_path_factory.mktemp("openenv")
    subprocess.run([sys.executable, "-m", "openenv.cli", "init", "echo_env"], cwd=folder, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=120)
    (folder / "guess_server.py").write_text(GUESS_ENV)
    started = [serve("echo_env.server.app:app", folder), serve("guess_server:app", folder),
               serve("guess_server:one_session", folder)]
    yield {"echo": started[0][1], "guess": started[1][1], "guess_one_session": started[2][1]}
    for process, _ in started:
        process.kill()
        process.wait()


def bisect(episode) -> str:
    """Guess by halving: the model's side of the number game, from the feedback so far."""
    low, high = episode.state.setdefault("range", [1, 50])
    last = episode.state.get("last")
    feedback = episode.messages[-1]["content"]
    if last is not None:
        if "higher" in feedback:
            low = last + 1
        elif "lower" in feedback:
            high = last - 1
    episode.state["range"] = [low, high]
    episode.state["last"] = (low + high) // 2
    return f"My guess: {episode.state['last']}"


def test_the_template_echo_environment_plays_as_a_conversation(servers):
    env = OpenEnvEnv(servers["echo"], instructions="Say something.", size=5, max_turns=2)
    assert env.action_field == "message"  # the template action's one required text field
    rows = env.build_dataset(None)
    assert len(rows) == 4 and rows[0]["prompt"][0]["content"] == "Say something.\n\nEcho Env environment ready!"
    (episode,) = play(env, rows[:1], lambda ep: "hello")
    assert episode.error is None
    assert [m["content"] for m in episode.messages if m["role"] == "user"][1:] == ["hello"]  # echoed back
    assert episode.metrics["openenv_reward"] == pytest.approx(1.0)  # the template's 0.1 per character, twice
    assert episode.score == 1.0 and episode.turn_rewards == [pytest.approx(0.5), pytest.approx(0.5)]


def test_a_game_is_won_by_the_right_play_and_seeds_split(servers):
    env = OpenEnvEnv(servers["guess"], size=10)
    rows = env.build_dataset(None)
    held_out = OpenEnvEnv(servers["guess"], size=10, split="held_out").build_dataset(None)
    assert {r["openenv_seed"] for r in rows}.isdisjoint({r["openenv_seed"] for r in held_out}) and len(held_out) == 2
    episodes = play(env, rows, bisect)  # concurrent episodes, each on its own session
    assert all(ep.score == 1.0 and ep.stop_reason == "env" for ep in episodes), [ep.error for ep in episodes]
    wrong = play(env, rows[:2], lambda ep: "My guess: 0")
    assert all(ep.score == 0.0 and ep.turns == 8 for ep in wrong)  # the game's own end after 8 tries


def test_an_episode_that_fails_gives_its_server_session_back(servers):
    env = OpenEnvEnv(servers["guess_one_session"], size=5)  # a server with room for one session at a time
    rows = env.build_dataset(None)
    for _ in range(2):  # each failure must leave the one session free for what follows
        (failed,) = play(env, rows[:1], lambda ep: "boom")
        assert failed.score == 0.0 and "crashed on boom" in failed.error
    (played,) = play(env, rows[:1], bisect)
    assert played.error is None and played.score == 1.0
    both = play(env, rows[:2], bisect)  # two at once: one is refused, saying why
    assert sorted(ep.score for ep in both) == [0.0, 1.0]
    assert "at its session limit" in next(ep.error for ep in both if ep.error)


def test_what_cannot_be_mapped_is_a_one_line_error(servers, refused_url):
    with pytest.raises(EnvLoadError, match="did not answer /schema"):
        OpenEnvEnv(refused_url)
    schema = {"properties": {"x": {"type": "integer"}, "y": {"type": "string"}}, "required": ["x", "y"]}
    with pytest.raises(EnvLoadError, match="is not one required text field; name the field"):
        action_field_of(schema, None)
    assert action_field_of(schema, "y") == "y"


@pytest.mark.integration
def test_grpo_trains_an_openenv_server(servers, tiny_model_dir, tmp_path):
    result = run_cli("grpo", "--model", tiny_model_dir, "--rl-env", f"openenv:{servers['guess']}",
                     "--rl-env-config", '{"size": 8, "instructions": "Guess the number."}', "--max-steps", "2",
                     "--batch-size", "4", "--rl-max-new-tokens", "8", "--output-dir", str(tmp_path / "run"))
    assert result.returncode == 0, result.stderr[-2000:]
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "env/score_mean" in r] == [1, 2]
    assert all("env/openenv_reward" in r for r in records if "env/score_mean" in r)
