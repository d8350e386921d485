"""The other seat of a TextArena two-player game (env/adapters/textarena.py): who plays it, what it sees.

`opponent` in `--rl-env-config` picks the player:
- `"random"`: a move drawn, with the game's seed, from the moves the game lists to it ("Available Moves:
  '[0]', ...").
- `"module:function"`: your Python function from the opponent's observation text to its action.
- `{"base_url": "http://HOST:PORT/v1", "model": NAME}` (optional `api_key`, `temperature`, `max_tokens`):
  a second model behind an OpenAI-compatible server, asked through `/chat/completions`; its reply text is
  its action. The server is asked `GET /models` when the environment is built, so an unreachable server
  or a model it does not serve is a one-line error before training (a server without `/models` is taken
  on trust); a request that fails later fails its episode with the opponent named. `api_key` defaults to
  `OPENAI_API_KEY` (run files redact it).
- `"self"`: the policy being trained (self-play), through `episode.policy_turn` (engine/policy_turns.py):
  the run's model, backend and sampling (under env check's text-level policies, that policy). It cannot
  open the game, nor can a URL opponent: the prompt is fixed when rows are built, before any model plays.

A model opponent (a URL, or `"self"`) sees its seat as the trained model sees its own: its first
observation as TextArena's LLM observation wrapper writes it, as a user message, then each of its moves
as an assistant message and what the game said after it as the next user message (`game_reply`).

Left out: TextArena's own agent classes and their system prompt (the trained seat gets none either), and
a timeout option for the URL opponent (its client waits up to REPLY_TIMEOUT_S; `--rl-env-timeout` bounds
the whole `step`, the opponent's reply included).
"""

from __future__ import annotations

import asyncio
import inspect
import os
import random
import re
from typing import Any, Callable

from aitrain_grpo.env.base import Episode, Message
from aitrain_grpo.errors import EnvLoadError, one_line

URL_KEYS = {"base_url", "model", "api_key", "temperature", "max_tokens"}
CHECK_TIMEOUT_S = 10.0  # GET /models when the environment is built
REPLY_TIMEOUT_S = 120.0
_MOVES = re.compile(r"'(\[[^\]]+\])'")


def game_reply(previous: str, observation: str, action: str) -> str:
    """What the game said after `action`: the new part of the cumulative observation, without the echo
    of the action itself (TextArena writes it as `[Player] ...` or `[GAME] ...`, wrapped in brackets
    when the action had none)."""
    new = observation[len(previous):] if observation.startswith(previous) else observation
    action = action.strip()
    at = new.find(action) if action else -1
    if at >= 0:
        new = new[at + len(action):].lstrip("]")
    return new.strip()


def random_opponent(seed: int) -> Callable[[str], str]:
    """A player that picks one of the moves the game lists in its latest observation, seeded."""
    rng = random.Random(seed)

    def move(observation: str) -> str:
        listed = [line for line in observation.splitlines() if "vailable" in line and _MOVES.search(line)]
        if not listed:
            raise ValueError("the random opponent found no list of available moves in its observation; give "
                             "opponent='module:function' for this game")
        return rng.choice(_MOVES.findall(listed[-1]))

    return move


class SeatConversation:
    """A seat's game as chat messages, built as the trained seat's conversation is."""

    def __init__(self):
        self.messages: list[Message] = []
        self.observation = ""

    def see(self, observation: str) -> list[Message]:
        if not self.messages:
            text = observation
        else:
            text = game_reply(self.observation, observation, str(self.messages[-1]["content"])) or "[GAME] (no reply)"
        self.messages.append({"role": "user", "content": text})
        self.observation = observation
        return [dict(m) for m in self.messages]

    def said(self, action: str) -> None:
        self.messages.append({"role": "assistant", "content": action})


class Opponent:
    """One game's opponent seat: a fixed player, `answer(observation) -> action` (sync, so it may also open
    a game while rows are built), or a model asked with its seat's conversation, `ask(messages, episode)`
    (sync, run in a worker thread, or async: self-play)."""

    def __init__(self, answer: Callable[[str], str] | None = None, ask=None):
        self.answer, self.ask = answer, ask
        self.seat = SeatConversation()

    async def move(self, observation: str, episode: Episode) -> str:
        loop = asyncio.get_running_loop()
        if self.answer is not None:  # your function may be slow: a worker thread, as for any sync call
            return await loop.run_in_executor(None, self.answer, observation)
        messages = self.seat.see(observation)
        if inspect.iscoroutinefunction(self.ask):
            action = await self.ask(messages, episode)
        else:
            action = await loop.run_in_executor(None, self.ask, messages, episode)
        self.seat.said(action)
        return action


async def ask_policy(messages: list[Message], episode: Episode) -> str:
    """Self-play: the opponent's turn from the policy being played (engine/policy_turns.py)."""
    if episode is None or episode.policy_turn is None:
        raise RuntimeError("opponent 'self' needs the policy's turns (episode.policy_turn), which whoever plays "
                           "this episode did not give")
    return await episode.policy_turn(messages)


class ServerModel:
    """A model behind an OpenAI-compatible URL, asked for one chat completion per move (blocking client,
    called from a worker thread)."""

    def __init__(self, config: dict[str, Any]):
        unknown = set(config) - URL_KEYS
        if unknown or not isinstance(config.get("base_url"), str) or not isinstance(config.get("model"), str):
            raise EnvLoadError(f"an opponent behind a URL is {{\"base_url\": ..., \"model\": ...}} with optional "
                               f"api_key, temperature, max_tokens; got {sorted(config)}")
        try:
            import openai
        except ImportError:
            raise EnvLoadError("an opponent behind a URL needs the openai package; install it with "
                               "pip install 'aitrain-grpo[agents]'") from None
        self.openai, self.url, self.model = openai, config["base_url"].rstrip("/"), config["model"]
        self.params = {k: config[k] for k in ("temperature", "max_tokens") if config.get(k) is not None}
        api_key = config.get("api_key") or os.environ.get("OPENAI_API_KEY") or "none"
        self.client = openai.OpenAI(base_url=self.url, api_key=api_key, max_retries=1, timeout=REPLY_TIMEOUT_S)
        self.check()

    def check(self) -> None:
        """Refuse, in one line, a server that cannot be reached or does not serve the model."""
        openai, where = self.openai, f"the opponent at {self.url}"
        try:
            served = [model.id for model in self.client.with_options(timeout=CHECK_TIMEOUT_S, max_retries=0).models.list()]
        except openai.NotFoundError:
            return  # a server without GET /models: its first reply will tell
        except openai.APIConnectionError as exc:
            raise EnvLoadError(f"{where} cannot be reached ({one_line(str(exc.__cause__ or exc), 120)}); start the "
                               f"server or fix base_url") from None
        except openai.APIStatusError as exc:
            raise EnvLoadError(f"{where} answered GET /models with HTTP {exc.status_code} "
                               f"({one_line(exc.message, 120)})") from None
        if self.model not in served:
            raise EnvLoadError(f"{where} serves no model {self.model!r} (it serves: {', '.join(served[:8]) or 'none'})")

    def __call__(self, messages: list[Message], episode: Episode | None = None) -> str:
        try:
            response = self.client.chat.completions.create(model=self.model, messages=messages, **self.params)
        except self.openai.OpenAIError as exc:
            raise RuntimeError(f"the opponent {self.model} at {self.url} failed: {one_line(str(exc), 200)}") from None
        return response.choices[0].message.content or ""


def opponent_factory(opponent: Any) -> Callable[[int], Opponent] | None:
    """`opponent` from the config as a maker of one game's opponent from the game's seed (None: no opponent)."""
    if opponent is None:
        return None
    if isinstance(opponent, dict):
        server = ServerModel(opponent)
        return lambda seed: Opponent(ask=server)
    if opponent == "self":
        return lambda seed: Opponent(ask=ask_policy)
    if opponent == "random":
        return lambda seed: Opponent(answer=random_opponent(seed))
    module, colon, name = str(opponent).partition(":")
    if not isinstance(opponent, str) or not colon:
        raise EnvLoadError(f"opponent {opponent!r} is not 'random', 'self', 'module:function' or "
                           f"{{\"base_url\": ..., \"model\": ...}}")
    from aitrain_grpo.env.loading import import_user_module

    function = getattr(import_user_module(module, flag="opponent", what="opponent module"), name, None)
    if not callable(function):
        raise EnvLoadError(f"opponent {opponent!r}: {module} has no function {name!r}")
    return lambda seed: Opponent(answer=function)
