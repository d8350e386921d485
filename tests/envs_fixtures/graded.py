"""envs.letters whose score depends on the task alone (the curriculum's tests): tasks in EASY always score
1, in HARD always 0, the others 0.5 (always normal); records the task each episode plays, in order."""

from __future__ import annotations

import threading

from envs.letters import LetterEnv

EASY, HARD = {0, 4}, {1, 5}


class Graded(LetterEnv):
    def __init__(self, **kwargs):
        super().__init__(**{"turns": 1, "num_tasks": 8, **kwargs})
        self.tasks: list[int] = []
        self.lock = threading.Lock()

    def reset(self, episode):
        with self.lock:
            self.tasks.append(episode.row["task"])

    def score_episode(self, episode):
        task = episode.row["task"]
        return 1.0 if task in EASY else 0.0 if task in HARD else 0.5

    def per_step(self) -> list[set[int]]:  # two prompts of four episodes a step
        return [set(self.tasks[i:i + 8]) for i in range(0, len(self.tasks), 8)]


def pooled_before(steps: list[set[int]]) -> list[set[int]]:
    """Per step, the easy or hard tasks it played that a step two or more before it had played: what a
    curriculum with revisit 0 never draws (a batch sees the groups of the steps up to two before it)."""
    first: dict[int, int] = {}
    found = []
    for step, tasks in enumerate(steps):
        found.append({t for t in tasks if t in EASY | HARD and first.get(t, step) <= step - 2})
        for task in tasks:
            first.setdefault(task, step)
    return found
