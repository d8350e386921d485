"""LetterEnv: the smallest multi-turn environment, used for demos and the learning tests.

The model is asked for text, told "again" after each turn until it has spoken `turns` times, and
scored by how much of its text is the target letter (mean over its turns). There is no right answer
to find, only a direction to push, which makes it a quick check that training moves a model at all:
the tiny built-in model learns it within a few dozen steps at a high learning rate.

    aitrain grpo --rl-env-module envs.letters --rl-env-class LetterEnv \
        --rl-env-config '{"letter": "a", "turns": 3}' --lr 1e-2 --rl-kl-coef 0 --max-steps 60
"""

from __future__ import annotations

from aitrain_grpo import Environment, Episode


class LetterEnv(Environment):
    def __init__(self, letter: str = "a", turns: int = 3, num_tasks: int = 64):
        if len(letter) != 1:
            raise ValueError(f"letter must be a single character, got {letter!r}")
        if turns < 1 or num_tasks < 1:
            raise ValueError("turns and num_tasks must be at least 1")
        self.letter = letter
        self.turns = turns
        self.num_tasks = num_tasks
        self.max_turns = turns

    def build_dataset(self, tokenizer) -> list[dict]:
        return [
            {"prompt": [{"role": "user", "content": f"Task {i}: write something with many {self.letter}s."}], "task": i}
            for i in range(self.num_tasks)
        ]

    def step(self, episode: Episode, completion: str) -> str | None:
        if episode.turns >= self.turns:
            return None
        return f"Again, with more {self.letter}s."

    def score_episode(self, episode: Episode) -> float:
        texts = [m["content"] for m in episode.messages if m["role"] == "assistant"]
        fractions = [t.count(self.letter) / len(t) if t else 0.0 for t in texts]
        episode.metrics["letter_fraction_last"] = fractions[-1] if fractions else 0.0
        return sum(fractions) / len(fractions) if fractions else 0.0
