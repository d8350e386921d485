"""TextArena games (textarena 0.7.4), trained unchanged: `--rl-env textarena:GAME`.

How TextArena's notions map onto ours:
- Tasks: one game per row, reset with the row's seed (`seed`, `seed + 1`, ...); rows whose seed is
  `held_out_every`-th (5) are held back: `split="held_out"` gives games `split="train"` never plays.
- Prompt: the game's first observation for player 0, as TextArena's LLM wrapper writes it, as the user
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
- Two-player games: the model plays seat `player` (0) against a fixed `opponent`: `"random"` (a move
  drawn, with the game's seed, from the moves the game lists to it: "Available Moves: '[0]', ...") or
  `"module:function"` (your Python function from the opponent's observation text to its action). The
  opponent's moves happen inside `reset` (when it opens) and `step`; the model sees them in the game's
  reply. Score: the win/draw/loss reward -1/0/1 as (r + 1) / 2: 1 won, 0.5 drawn, 0 lost (an invalid
  move that loses the game is a loss); `env/won` counts wins. A game with more than two players, or a
  two-player game without `opponent`, is refused in one line.
Games that need data TextArena downloads at run time (nltk corpora) are refused with a one-line error.

Left out: self-play (both seats played by the trained model), an opponent behind an OpenAI-compatible
URL, TextArena's online play, and per-step rewards.
"""

from __future__ import annotations

import random
import re
from typing import Any, Callable

from aitrain_grpo.env.adapters.common import clamp01
from aitrain_grpo.env.base import Environment, Episode
from aitrain_grpo.errors import EnvLoadError, one_line

INSTALL = "pip install 'aitrain-grpo[textarena]'"
SPLITS = ("train", "held_out")
GAME_KEY = "ta_game"


def _textarena():
    try:
        import textarena
    except ImportError:
        raise EnvLoadError(f"textarena environments need the textarena package; install it with {INSTALL}") from None
    return textarena


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


_MOVES = re.compile(r"'(\[[^\]]+\])'")


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


def _opponent_factory(opponent: str | None) -> Callable[[int], Callable[[str], str]] | None:
    if opponent is None or opponent == "random":
        return None if opponent is None else random_opponent
    module, colon, name = opponent.partition(":")
    if not colon:
        raise EnvLoadError(f"opponent {opponent!r} is not 'random' or 'module:function'")
    from aitrain_grpo.env.loading import import_user_module

    function = getattr(import_user_module(module, flag="opponent", what="opponent module"), name, None)
    if not callable(function):
        raise EnvLoadError(f"opponent {opponent!r}: {module} has no function {name!r}")
    return lambda seed: function


class TextArenaEnv(Environment):
    """One TextArena game as a multi-turn environment (see the module docstring)."""

    interface = "TextArena game"

    def __init__(self, game: str, num_tasks: int = 64, seed: int = 0, split: str = "train", held_out_every: int = 5,
                 max_turns: int = 20, opponent: str | None = None, player: int = 0):
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
        if player not in (0, 1):
            raise EnvLoadError(f"player is the model's seat, 0 or 1; got {player!r}")
        self.ta, self.game, self.max_turns, self.player = ta, game, max_turns, player
        self.opponent = _opponent_factory(opponent)
        held_out = split == "held_out"
        seeds = (seed + i for i in range(num_tasks * held_out_every))
        self.seeds = [s for s in seeds if ((s - seed) % held_out_every == held_out_every - 1) == held_out][:num_tasks]
        self._start(self.seeds[0])  # refuse a game that cannot run here before anything else

    def _start(self, seed: int):
        """A fresh game reset with `seed`, the opponent's opening moves, and the model's first observation."""
        players = 1 if self.opponent is None else 2
        try:
            env = self.ta.make(self.game)
            env.reset(num_players=players, seed=seed)
        except AssertionError as exc:
            hint = ("give an opponent: --rl-env-config '{\"opponent\": \"random\"}' (or \"module:function\")"
                    if players == 1 else "it is not a two-player game; leave out opponent")
            raise EnvLoadError(f"TextArena's {self.game} cannot be played by {players} player(s) "
                               f"({one_line(str(exc), 120)}); {hint}") from None
        except LookupError as exc:
            raise EnvLoadError(f"TextArena's {self.game} needs data it downloads at run time "
                               f"({one_line(str(exc).strip(' *' + chr(10)), 120)}); pick a game that runs offline") from None
        if self.opponent is not None:
            env.aitrain_opponent = self.opponent(seed)
            if self._opponent_moves(env):
                raise EnvLoadError(f"TextArena's {self.game} ended before the model's first move (seed {seed})")
        player, observation = env.get_observation()
        return env, str(observation)

    def _opponent_moves(self, env) -> bool:
        """Let the opponent play until it is the model's turn; True when the game ended."""
        while _state(env).current_player_id != self.player:
            _, observation = env.get_observation()
            done, _ = env.step(env.aitrain_opponent(str(observation)))
            if done:
                return True
        return False

    def build_dataset(self, tokenizer) -> list[dict[str, Any]]:
        return [{"prompt": [{"role": "user", "content": self._start(seed)[1]}], "seed": seed} for seed in self.seeds]

    def reset(self, episode: Episode) -> None:
        env, observation = self._start(episode.row["seed"])
        episode.state[GAME_KEY] = env
        episode.state["observation"] = observation
        episode.metrics["invalid_move"] = 0.0

    def step(self, episode: Episode, completion: str) -> str | None:
        env = episode.state[GAME_KEY]
        state = _state(env)
        errors = state.error_count
        done, _ = env.step(completion)
        # An invalid move the game forgave (another try, counted in error_count) or one that ended it.
        if state.error_count > errors or (done and state.game_info.get(self.player, {}).get("invalid_move")):
            episode.metrics["invalid_move"] += 1.0
        if not done and self.opponent is not None:
            done = self._opponent_moves(env)
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
