"""TextArena single-player games (textarena 0.7.4), trained unchanged: `--rl-env textarena:GAME`.

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
Two-player games are refused with a one-line error (an opponent policy is not wired yet), and so are
games that need data TextArena downloads at run time (nltk corpora): the error says which.

Left out: two-player games and self-play, TextArena's online play, and per-step rewards.
"""

from __future__ import annotations

from typing import Any

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


class TextArenaEnv(Environment):
    """One TextArena single-player game as a multi-turn environment (see the module docstring)."""

    interface = "TextArena game"

    def __init__(self, game: str, num_tasks: int = 64, seed: int = 0, split: str = "train", held_out_every: int = 5,
                 max_turns: int = 20):
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
        self.ta, self.game, self.max_turns = ta, game, max_turns
        held_out = split == "held_out"
        seeds = (seed + i for i in range(num_tasks * held_out_every))
        self.seeds = [s for s in seeds if ((s - seed) % held_out_every == held_out_every - 1) == held_out][:num_tasks]
        self._start(self.seeds[0])  # refuse a game that cannot run here before anything else

    def _start(self, seed: int):
        """A fresh game reset with `seed`, and player 0's first observation."""
        try:
            env = self.ta.make(self.game)
            env.reset(num_players=1, seed=seed)
        except AssertionError as exc:
            raise EnvLoadError(f"TextArena's {self.game} is not a single-player game ({one_line(str(exc), 120)}); "
                               f"two-player games are not supported yet") from None
        except LookupError as exc:
            raise EnvLoadError(f"TextArena's {self.game} needs data it downloads at run time "
                               f"({one_line(str(exc).strip(' *' + chr(10)), 120)}); pick a game that runs offline") from None
        player, observation = env.get_observation()
        return env, str(observation)

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
        if state.error_count > errors or (done and state.game_info.get(0, {}).get("invalid_move")):
            episode.metrics["invalid_move"] += 1.0
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
        finished = bool(rewards) and 0 in rewards
        episode.metrics["finished"] = float(finished)
        return clamp01(float(rewards[0])) if finished else 0.0


def _state(env):
    """The game's own state under TextArena's wrappers."""
    while hasattr(env, "env"):
        env = env.env
    return env.state
