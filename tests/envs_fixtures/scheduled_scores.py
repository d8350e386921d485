"""envs.letters whose episodes score by a schedule instead of their text: the n-th `score_episode` call
of an instance scores `scores[n // per_call]`, whatever the model wrote. A held-back evaluation of
`per_call` episodes thus logs `scores[i]` at its i-th evaluation, so a test knows which evaluation is the
best before the run starts (tests/test_eval_during_training.py)."""

from __future__ import annotations

from envs.letters import LetterEnv


class ScheduledScores(LetterEnv):
    def __init__(self, scores: list[float], per_call: int, **kwargs):
        super().__init__(**{"turns": 1, **kwargs})
        self.scores, self.per_call, self.scored = list(scores), per_call, 0

    def score_episode(self, episode) -> float:
        index = min(self.scored // self.per_call, len(self.scores) - 1)
        self.scored += 1
        return self.scores[index]
