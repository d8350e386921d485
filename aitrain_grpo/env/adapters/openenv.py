"""OpenEnv environments (openenv-core 0.3.0), served as they are: `--rl-env openenv:http://127.0.0.1:8000`.

How OpenEnv's notions map onto ours:
- The server: an OpenEnv app (`create_app(Env, Action, Observation)`, run by uvicorn, a Docker image or
  a Space) at `url`. Each episode has its own WebSocket session (openenv's `GenericEnvClient`), so the
  server must allow as many concurrent sessions as episodes in play (`max_concurrent_envs` in its
  `create_app`; the template's is 1).
- Prompt: the observation `reset(seed=s)` returns, as the user message, after `instructions` (the task
  as the model should read it: OpenEnv environments carry no prompt). The dataset is built by resetting
  once per seed over HTTP; each episode resets its session with its row's seed and must get the same
  observation back (a per-seed deterministic reset), or it ends with an error that says so.
- The model's turn -> the action: the turn's text as the action's one string field (`action_field`, or
  the only required string field of the action schema from `/schema`); an action with several fields
  cannot be made from text and is refused in one line unless `action_field` names one.
- Observations -> replies: `observation_field`, or the observation's only string field, or its fields
  as JSON (without `done`, `reward`, `metadata`); `done` ends the episode.
- Rewards -> score: the sum of the step rewards mapped from `reward_range` (default [0, 1]) onto [0, 1]
  and clamped; each step's reward is also that turn's reward (`episode.reward_turn`, scaled by the same
  range, for `--rl-advantage turn`); the raw sum is `env/openenv_reward`.
- Seeds and splits: seeds `seed .. seed+size-1`; every `held_out_every`-th is held back
  (`{"split": "held_out"}`).

Left out: typed actions with several fields, MCP-tool OpenEnv environments (their tools are an MCP
server: `MCPTools(url=...)` in a ToolEnvironment), starting Docker images, and an oracle.
"""

from __future__ import annotations

import contextlib
import json
from typing import Any

from aitrain_grpo.env.adapters.common import clamp01
from aitrain_grpo.env.base import Environment, Episode
from aitrain_grpo.errors import EnvLoadError

INSTALL = "pip install 'aitrain-grpo[openenv]'"
SPLITS = ("train", "held_out")
_ENVELOPE = ("done", "reward", "metadata")


def _client_class():
    try:
        from openenv.core.generic_client import GenericEnvClient
    except ImportError:
        raise EnvLoadError(f"openenv environments need the openenv-core package; install it with {INSTALL}") from None
    return GenericEnvClient


def _get_json(url: str, path: str, body: dict | None = None, timeout: float = 30.0) -> Any:
    import httpx

    try:
        if body is None:
            response = httpx.get(url.rstrip("/") + path, timeout=timeout)
        else:
            response = httpx.post(url.rstrip("/") + path, json=body, timeout=timeout)
        response.raise_for_status()
        return response.json()
    except (httpx.HTTPError, ValueError) as exc:
        raise EnvLoadError(f"OpenEnv server {url} did not answer {path} ({type(exc).__name__}: {exc}); start it "
                           f"(e.g. uvicorn your_env.server.app:app --port 8000) and check the URL") from None


def action_field_of(schema: dict[str, Any], chosen: str | None) -> str:
    """The action field the model's text goes into: `chosen`, or the schema's one required string field."""
    properties = schema.get("properties", {})
    if chosen is not None:
        if chosen not in properties:
            raise EnvLoadError(f"the OpenEnv action has no field {chosen!r}; its fields are {', '.join(properties)}")
        return chosen
    text_fields = [n for n in schema.get("required", []) if properties.get(n, {}).get("type") == "string"]
    others = [n for n in schema.get("required", []) if n not in text_fields]
    if len(text_fields) != 1 or others:
        raise EnvLoadError(f"the OpenEnv action ({', '.join(schema.get('required', [])) or 'no required fields'}) is not "
                           f"one required text field; name the field the model's text goes into with "
                           f"--rl-env-config '{{\"action_field\": \"...\"}}'")
    return text_fields[0]


class OpenEnvEnv(Environment):
    """An OpenEnv environment server, played over one WebSocket session per episode."""

    interface = "OpenEnv environment server"

    def __init__(self, url: str, instructions: str = "", action_field: str | None = None,
                 observation_field: str | None = None, size: int = 64, seed: int = 0, split: str = "train",
                 held_out_every: int = 5, max_turns: int = 10, reward_range: list[float] | None = None,
                 timeout: float = 30.0):
        self._client = _client_class()
        if split not in SPLITS:
            raise EnvLoadError(f"split must be one of {', '.join(SPLITS)}, got {split!r}")
        low, high = reward_range or (0.0, 1.0)
        if not high > low:
            raise EnvLoadError(f"reward_range must be [low, high] with high > low, got {reward_range!r}")
        self.url, self.instructions, self.observation_field = url, instructions, observation_field
        self.size, self.seed, self.split, self.held_out_every = size, seed, split, held_out_every
        self.max_turns, self.reward_range, self.timeout = max_turns, (float(low), float(high)), timeout
        schema = _get_json(url, "/schema", timeout=timeout)
        self.action_field = action_field_of(schema.get("action", {}), action_field)
        self._sessions: dict[int, Any] = {}  # id(episode) -> its client, from reset to score

    # ------------------------------------------------------------------------------- text

    def observation_text(self, observation: dict[str, Any]) -> str:
        fields = {k: v for k, v in (observation or {}).items() if k not in _ENVELOPE}
        if self.observation_field is not None:
            if self.observation_field not in fields:
                raise ValueError(f"the observation has no field {self.observation_field!r}; it has {', '.join(fields)}")
            return str(fields[self.observation_field])
        texts = [v for v in fields.values() if isinstance(v, str)]
        return texts[0] if len(texts) == 1 else json.dumps(fields, default=str)

    def _prompt(self, observation_text: str) -> str:
        return f"{self.instructions}\n\n{observation_text}" if self.instructions else observation_text

    # ------------------------------------------------------------------------------- dataset

    def seeds(self) -> list[int]:
        every = self.held_out_every
        held = (lambda i: every > 0 and i % every == every - 1)
        return [self.seed + i for i in range(self.size) if held(i) == (self.split == "held_out")]

    def build_dataset(self, tokenizer) -> list[dict[str, Any]]:
        rows = []
        for seed in self.seeds():
            first = _get_json(self.url, "/reset", {"seed": seed}, timeout=self.timeout)
            text = self.observation_text(first.get("observation", {}))
            rows.append({"prompt": [{"role": "user", "content": self._prompt(text)}], "openenv_seed": seed,
                         "first_observation": text})
        return rows

    # ------------------------------------------------------------------------------- episodes

    async def reset(self, episode: Episode) -> None:
        client = self._client(base_url=self.url, connect_timeout_s=self.timeout, message_timeout_s=self.timeout)
        self._sessions[id(episode)] = client
        async with self._closed_on_error(episode):
            await client.connect()
            episode.state["openenv_rewards"] = []
            try:
                result = await client.reset(seed=episode.row["openenv_seed"])
            except Exception as exc:
                # A full server closes the session (websockets' ConnectionClosed, not imported here) or,
                # depending on when the refusal arrives, answers with its CAPACITY_REACHED error.
                if type(exc).__name__.startswith("ConnectionClosed") or "CAPACITY_REACHED" in str(exc):
                    raise RuntimeError(
                        f"the OpenEnv server at {self.url} closed the session before reset; most likely it is at "
                        f"its session limit: allow as many sessions as episodes in play (max_concurrent_envs in "
                        f"its create_app) or train fewer episodes at once") from None
                raise
            text = self.observation_text(result.observation)
            if text != episode.row["first_observation"]:
                raise ValueError(f"reset(seed={episode.row['openenv_seed']}) gave another observation than when the "
                                 f"dataset was built; the environment's reset must be deterministic per seed")

    async def step(self, episode: Episode, completion: str):
        client = self._sessions[id(episode)]
        async with self._closed_on_error(episode):
            result = await client.step({self.action_field: completion})
            reward = float(result.reward or 0.0)
            episode.state["openenv_rewards"].append(reward)
            if reward:
                episode.reward_turn(reward / (self.reward_range[1] - self.reward_range[0]))
            if result.done:
                await self._close(episode)
                return None
            return self.observation_text(result.observation)

    async def score_episode(self, episode: Episode) -> float:
        await self._close(episode)
        total = sum(episode.state.get("openenv_rewards", []))
        episode.metrics["openenv_reward"] = total
        low, high = self.reward_range
        return clamp01((total - low) / (high - low))

    async def _close(self, episode: Episode) -> None:
        client = self._sessions.pop(id(episode), None)
        if client is not None:
            await client.close()

    @contextlib.asynccontextmanager
    async def _closed_on_error(self, episode: Episode):
        """An episode that fails in reset or step is scored 0 without `score_episode`: give its server
        session back here, or a server with room for N sessions refuses new episodes after N failures."""
        try:
            yield
        except BaseException:
            with contextlib.suppress(Exception):  # the session may be gone with the server; the first error counts
                await self._close(episode)
            raise
