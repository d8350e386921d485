"""TextArena games (textarena 0.7.4), trained unchanged: `--rl-env textarena:GAME`.

How TextArena's notions map onto ours:
- Tasks: one game per row, reset with the row's seed (`seed`, `seed + 1`, ...); rows whose seed is
  `held_out_every`-th (5) are held back: `split="held_out"` gives games `split="train"` never plays.
- Prompt: the game's first observation for the model's seat, as TextArena's LLM wrapper writes it, as the user
  message. The rows are made by resetting each game once (cheap); each episode resets its own game with
  the same seed in `reset`, so what the model sees is what the game it plays would show.
- The model's turn: its whole text is the action (TextArena reads the `[...]` part, e.g. `[42]`).
- Replies: the text the game adds to the observation after the action, from its first `[GAME]` message
  on (the echo of the model's own action, already in the conversation, is left out).
- End: when the game says done; the episode's turn cap is `max_turns` (a game's own turn limit usually
  ends it first). An invalid move follows the game's own rule (another try, or a loss) and is counted in
  `env/invalid_move`.
- Score: the player's reward from `close()`. TextArena's single-player games reward their share of
  completion in 0..1 (1 = solved), which is the score as it is; the -1 some give for a final invalid
  move becomes 0. A game not finished when the episode ended has no reward and scores 0
  (`env/finished` 0).
- Two-player games: the model plays seat `player` (0) against `opponent` (textarena_opponents.py says
  each in full): `"random"` (a move drawn, with the game's seed, from the moves the game lists to it),
  `"module:function"` (your function from the opponent's observation text to its action), a second model
  behind an OpenAI-compatible URL (`{"base_url": ..., "model": ...}`, checked when the environment is
  built), or `"self"`: self-play, the other seat played by the policy being trained. The opponent's
  moves happen inside `reset` (a fixed opponent that opens) and `step`; the model sees them in the game's
  reply, as it would any opponent's. Score: the win/draw/loss reward -1/0/1 as (r + 1) / 2: 1 won, 0.5
  drawn, 0 lost (an invalid move that loses the game is a loss); `env/won` counts wins. A game with more
  than two players, or a two-player game without `opponent`, is refused in one line.
- Self-play: each opponent move is `await episode.policy_turn(messages)` (env/base.py,
  engine/policy_turns.py), the opponent seat's own conversation (its first observation, its moves, the
  game's replies) answered by the run's model with the run's backend and sampling (under env check's
  text-level policies, by that policy: `empty` gives both seats empty moves). Only the chosen seat's turns are in the episode's token sequence and train; the
  opponent's tokens are sampled but never trained. Training both seats (`player: "both"`) is refused:
  TRL's rollout trains one sequence per episode, and the two seats' turns are two conversations. A model
  opponent (a URL or self) cannot open the game (e.g. `player: 1` in TicTacToe): the prompt is fixed
  when rows are built, before any model plays; that is refused in one line too.
Games that need data TextArena downloads at run time (nltk corpora: Wordle, Hangman, WordLadder, ...) run
when that data is installed and are refused in one line when it is not: their `nltk.download` calls are
answered from the installed data (`installed_nltk_data_only`), never the network, so nothing is printed.
`reset` and `step` are async (self-play awaits the policy); the game's own calls are quick and run on the
event loop, an opponent's function or HTTP request in a worker thread.

Left out: training both seats, TextArena's online play, and per-step rewards.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any, Iterator

from aitrain_grpo.env.adapters.common import clamp01
from aitrain_grpo.env.adapters.textarena_opponents import game_reply, opponent_factory
from aitrain_grpo.env.base import Environment, Episode
from aitrain_grpo.errors import EnvLoadError, one_line

INSTALL = "pip install 'aitrain-grpo[textarena]'"
SPLITS = ("train", "held_out")
GAME_KEY = "ta_game"


NLTK_PACKAGES = ("words", "averaged_perceptron_tagger_eng")  # what TextArena's word games ask nltk for
_NLTK_FOLDERS = ("corpora", "taggers", "tokenizers", "chunkers", "grammars", "misc", "models", "stemmers")


@contextlib.contextmanager
def installed_nltk_data_only() -> Iterator[None]:
    """Within the block, `nltk.download(name)` answers from the data installed here: True when each
    package is found, else a `LookupError` naming the first missing one. TextArena's word games call it
    when imported and built; the real one went to the network (offline: seven lines of `[nltk_data]`
    errors, then the game failed anyway, and even installed data was checked online)."""
    try:
        import nltk
    except ImportError:  # a game that needs it fails on its own import, as a missing package
        yield
        return

    def installed(info_or_id=None, *args, **kwargs) -> bool:
        names = [info_or_id] if isinstance(info_or_id, str) else list(info_or_id or [])
        for name in names:
            if not any(_nltk_found(nltk, f"{folder}/{name}") for folder in _NLTK_FOLDERS):
                raise LookupError(f"nltk data {name!r} is not installed")
        return True

    original, nltk.download = nltk.download, installed
    try:
        yield
    finally:
        nltk.download = original


def _nltk_found(nltk, resource: str) -> bool:
    try:
        nltk.data.find(resource)
    except LookupError:
        return False
    return True


def _textarena():
    try:
        import textarena
    except ImportError:
        raise EnvLoadError(f"textarena environments need the textarena package; install it with {INSTALL}") from None
    return textarena


class TextArenaEnv(Environment):
    """One TextArena game as a multi-turn environment (see the module docstring)."""

    interface = "TextArena game"

    def __init__(self, game: str, num_tasks: int = 64, seed: int = 0, split: str = "train", held_out_every: int = 5,
                 max_turns: int = 20, opponent: str | dict | None = None, player: int | str = 0):
        ta = _textarena()
        from textarena.envs.registration import ENV_REGISTRY

        if game not in ENV_REGISTRY:
            import difflib

            close = difflib.get_close_matches(game, list(ENV_REGISTRY), n=3)
            raise EnvLoadError(f"TextArena has no game {game!r}" + (f"; did you mean {', '.join(close)}?" if close else ""))
        if split not in SPLITS:
            raise EnvLoadError(f"split must be one of {', '.join(SPLITS)}, got {split!r}")
        if held_out_every < 2:
            raise EnvLoadError(f"held_out_every must be at least 2, got {held_out_every}")
        if player == "both":
            raise EnvLoadError("player 'both' cannot be trained: an episode trains one token sequence, one seat's "
                               "turns; train one seat (player 0 or 1) against opponent 'self'")
        if player not in (0, 1):
            raise EnvLoadError(f"player is the model's seat, 0 or 1; got {player!r}")
        self.ta, self.game, self.max_turns, self.player = ta, game, max_turns, player
        self.opponent = opponent_factory(opponent)
        self.opponent_name = ("the policy itself (self-play)" if opponent == "self" else
                              "the model behind the URL" if isinstance(opponent, dict) else "a fixed opponent")
        held_out = split == "held_out"
        seeds = (seed + i for i in range(num_tasks * held_out_every))
        self.seeds = [s for s in seeds if ((s - seed) % held_out_every == held_out_every - 1) == held_out][:num_tasks]
        self._start(self.seeds[0])  # refuse a game that cannot run here before anything else

    def _start(self, seed: int):
        """A fresh game reset with `seed`, a fixed opponent's opening moves, and the model's first observation."""
        players = 1 if self.opponent is None else 2
        try:
            with installed_nltk_data_only():
                env = self.ta.make(self.game)
                env.reset(num_players=players, seed=seed)
        except AssertionError as exc:
            hint = ("give an opponent: --rl-env-config '{\"opponent\": \"random\"}' (or \"self\", \"module:function\", "
                    "{\"base_url\": ..., \"model\": ...})"
                    if players == 1 else "it is not a two-player game; leave out opponent")
            raise EnvLoadError(f"TextArena's {self.game} cannot be played by {players} player(s) "
                               f"({one_line(str(exc), 120)}); {hint}") from None
        except LookupError as exc:
            raise EnvLoadError(f"TextArena's {self.game} needs data it downloads at run time "
                               f"({one_line(str(exc).strip(' *' + chr(10)), 120)}); install it where there is a "
                               f"network (python -m nltk.downloader {' '.join(NLTK_PACKAGES)}) or pick a game "
                               f"that runs offline, e.g. textarena:GuessTheNumber-v0") from None
        if self.opponent is not None:
            env.aitrain_opponent = opponent = self.opponent(seed)
            if opponent.answer is None and _state(env).current_player_id != self.player:
                raise EnvLoadError(f"TextArena's {self.game} (seed {seed}) opens with seat {1 - self.player}, played "
                                   f"by {self.opponent_name}: the prompt is fixed when rows are built, before "
                                   f"any model move; train the opening seat (player {1 - self.player})")
            while _state(env).current_player_id != self.player:  # a fixed opponent's opening, seeded
                _, observation = env.get_observation()
                if env.step(opponent.answer(str(observation)))[0]:
                    raise EnvLoadError(f"TextArena's {self.game} ended before the model's first move (seed {seed})")
        player, observation = env.get_observation()
        return env, str(observation)

    async def _opponent_moves(self, env, episode: Episode) -> bool:
        """Let the opponent play until it is the model's turn; True when the game ended."""
        while _state(env).current_player_id != self.player:
            _, observation = env.get_observation()
            done, _ = env.step(await env.aitrain_opponent.move(str(observation), episode))
            if done:
                return True
        return False

    def build_dataset(self, tokenizer) -> list[dict[str, Any]]:
        return [{"prompt": [{"role": "user", "content": self._start(seed)[1]}], "seed": seed} for seed in self.seeds]

    async def reset(self, episode: Episode) -> None:
        env, observation = await asyncio.get_running_loop().run_in_executor(None, self._start, episode.row["seed"])
        episode.state[GAME_KEY] = env
        episode.state["observation"] = observation
        episode.metrics["invalid_move"] = 0.0

    async def step(self, episode: Episode, completion: str) -> str | None:
        # Async for self-play, whose opponent awaits the policy's turn; the game's own calls are quick and run
        # on the event loop, an opponent's (your function, a URL) in a worker thread.
        env = episode.state[GAME_KEY]
        state = _state(env)
        errors = state.error_count
        done, _ = env.step(completion)
        # An invalid move the game forgave (another try, counted in error_count) or one that ended it.
        if state.error_count > errors or (done and state.game_info.get(self.player, {}).get("invalid_move")):
            episode.metrics["invalid_move"] += 1.0
        if not done and self.opponent is not None:
            done = await self._opponent_moves(env, episode)
        if done:
            return None
        _, observation = env.get_observation()
        reply = game_reply(episode.state["observation"], str(observation), completion)
        episode.state["observation"] = str(observation)
        return reply or "[GAME] (no reply)"

    def score_episode(self, episode: Episode) -> float:
        env = episode.state.get(GAME_KEY)
        if env is None:
            return 0.0
        rewards, _ = env.close()
        finished = bool(rewards) and self.player in rewards
        episode.metrics["finished"] = float(finished)
        reward = float(rewards[self.player]) if finished else None
        if self.opponent is None:
            return clamp01(reward) if finished else 0.0
        episode.metrics["won"] = float(finished and reward > 0)
        return clamp01((reward + 1) / 2) if finished else 0.0


def _state(env):
    """The game's own state under TextArena's wrappers."""
    while hasattr(env, "env"):
        env = env.env
    return env.state
