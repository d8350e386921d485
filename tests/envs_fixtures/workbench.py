"""Environments for `aitrain env check` tests: each breaks one rule, or bends one, in a way a user would.

All are "say the number" tasks: the model should answer with the row's number; `solve` does that.
"""

import time

from aitrain_grpo.env.base import Environment, Episode


class NumberEnv(Environment):
    """A correct environment: 1.0 for the right number, 0.5 for any digit, 0.0 otherwise."""

    max_turns = 2

    def __init__(self, num_tasks: int = 8):
        self.num_tasks = num_tasks

    def build_dataset(self, tokenizer):
        return [{"prompt": [{"role": "user", "content": f"Say {i}."}], "number": i} for i in range(self.num_tasks)]

    def step(self, episode: Episode, completion: str):
        return None

    def score_episode(self, episode: Episode) -> float:
        text = episode.last_completion.strip()
        if text == str(episode.row["number"]):
            return 1.0
        return 0.5 if any(c.isdigit() for c in text) else 0.0

    def solve(self, episode: Episode) -> str:
        return str(episode.row["number"])


class TextMetricEnv(NumberEnv):
    """Records its verdict as text in episode.metrics, beside a number: training logs only the number."""

    def score_episode(self, episode: Episode) -> float:
        score = super().score_episode(episode)
        episode.metrics["verdict"] = "right" if score == 1.0 else "wrong"
        episode.metrics["digits"] = sum(c.isdigit() for c in episode.last_completion)
        return score


class EmptyReplyEnv(NumberEnv):
    """Means to end the episode after a wrong answer, but returns "" (the model is sent an empty message)."""

    def step(self, episode: Episode, completion: str):
        return "" if completion.strip() != str(episode.row["number"]) else None


class ScoreTooHighEnv(NumberEnv):
    """Forgets to normalise: a right answer scores 10."""

    def score_episode(self, episode: Episode) -> float:
        return 10.0 * super().score_episode(episode)


class StepRaisesEnv(NumberEnv):
    def step(self, episode: Episode, completion: str):
        raise KeyError("history")


class NoPromptEnv(NumberEnv):
    def build_dataset(self, tokenizer):
        return [{"question": f"Say {i}.", "number": i} for i in range(self.num_tasks)]


class ConstantScoreEnv(NumberEnv):
    """Scores every episode the same, whatever happens: nothing to learn from."""

    def score_episode(self, episode: Episode) -> float:
        return 0.5


class WrongOracleEnv(NumberEnv):
    """`solve` answers off by one: the oracle does not reach 1.0."""

    def solve(self, episode: Episode) -> str:
        return str(episode.row["number"] + 1)


class SolveRaisesEnv(NumberEnv):
    """The oracle itself is broken."""

    def solve(self, episode: Episode) -> str:
        raise ValueError("no answer")


class SlowStepEnv(NumberEnv):
    """Takes 50 ms to answer a turn (a simulated user behind a network call)."""

    def step(self, episode: Episode, completion: str):
        time.sleep(0.05)
        return "Again." if episode.turns < 2 else None


class OddStepsRaiseEnv(NumberEnv):
    """Raises in `step` for odd numbers only: some episodes fail, the others play."""

    def step(self, episode: Episode, completion: str):
        if episode.row["number"] % 2:
            raise KeyError("history")
        return None


class LongAnswerEnv(NumberEnv):
    """An oracle whose answer alone is longer than the tiny model's context (4096 positions)."""

    def score_episode(self, episode: Episode) -> float:
        return 1.0

    def solve(self, episode: Episode) -> str:
        return " ".join(["word"] * 6000)


class CtrlCEnv(NumberEnv):
    """Ctrl-C pressed while a command builds the environment: the user stopping it as it starts."""

    def __init__(self, num_tasks: int = 8):
        super().__init__(num_tasks)
        # What Python's SIGINT handler raises in the main thread. (Not raise_signal: a test before this one in
        # the same pytest process may have left SIGINT's default action, which ends the process.)
        raise KeyboardInterrupt
