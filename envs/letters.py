"""LetterEnv: the smallest multi-turn environment, used for demos and the learning tests.

The model is asked for text and told "again" after each turn until it has spoken `turns` times. Each
turn scores the share of its letters that are the target letter (case, spaces and punctuation ignored),
full marks from FULL_MARKS (80%) up; the episode scores the mean over the `turns` turns it asked for.
A turn cut off by its token limit scores 0, and so does a turn never played (an episode that a cut turn
ended): what pays is finishing each turn, not filling the token budget with the letter. So a perfect
episode (1.0, a success in `aitrain eval`) is `turns` finished turns of (nearly) nothing but the letter,
e.g. "A a a a.". Each turn's score is also given as its turn reward (`reward_turn`), which
`--rl-advantage turn` credits to that turn's tokens; README's quick start trains so, and the tiny built-in
model learns the task within its 60 steps (benchmarks/FIRST_RUN.md):

    aitrain grpo --config examples/quickstart.yaml

`pay_cut_turns=True` keeps the score the quick start used to learn a shortcut on (issue 35): the share of
the letter in each played turn's whole text, spaces counted, averaged over the turns played, a cut turn
included. The tiny model games it by filling its first turn with " a a a" until the turn is cut and the
episode ends (0.5); the shortcut warning's end-to-end test trains on it (tests/test_shortcuts.py).
`probes()` declares that shortcut for `aitrain env check`: the letter written until the turn is cut. The
default score keeps it at 0; under `pay_cut_turns` env check warns that it pays.
"""

from __future__ import annotations

from aitrain_grpo import Environment, Episode

# A turn whose letters are at least 80% the target gets full marks: the tiny model's turns open with a
# capitalised word ("An a a a a." is 90%), and a success should not hinge on that one token.
FULL_MARKS = 0.8


class LetterEnv(Environment):
    def __init__(self, letter: str = "a", turns: int = 3, num_tasks: int = 64, pay_cut_turns: bool = False):
        if len(letter) != 1 or not letter.isalpha():
            raise ValueError(f"letter must be a single letter, got {letter!r}")
        if turns < 1 or num_tasks < 1:
            raise ValueError("turns and num_tasks must be at least 1")
        self.letter = letter
        self.turns = turns
        self.num_tasks = num_tasks
        self.pay_cut_turns = pay_cut_turns
        self.max_turns = turns

    def build_dataset(self, tokenizer) -> list[dict]:
        return [
            {"prompt": [{"role": "user", "content": f"Task {i}: write something with many {self.letter}s."}], "task": i}
            for i in range(self.num_tasks)
        ]

    def turn_score(self, text: str) -> float:
        """The share of the text's letters that are the target, over FULL_MARKS, at most 1 (0 with no letters)."""
        letters = [c for c in text.lower() if c.isalpha()]
        share = letters.count(self.letter.lower()) / len(letters) if letters else 0.0
        return min(1.0, share / FULL_MARKS)

    def step(self, episode: Episode, completion: str) -> str | None:
        # The engine counts a turn cut at its token limit before asking for the reply (--rl-cut-turn
        # continue); a turn cut under `end` never reaches here. Either way it earns nothing.
        cut = episode.truncated_turns > episode.state.get("cut_turns", 0)
        episode.state["cut_turns"] = episode.truncated_turns
        score = 0.0 if cut else self.turn_score(completion)
        episode.state.setdefault("turn_scores", []).append(score)
        episode.reward_turn(score / self.turns)  # the turn rewards add up to the episode's score
        if episode.turns >= self.turns:
            return None
        return f"Again, with more {self.letter}s."

    def probes(self) -> dict:
        """Issue 35's shortcut, for env check: " a a a" past any turn limit, so every turn is cut."""
        return {"fill-the-turn": lambda episode: f" {self.letter}" * 4096}

    def score_episode(self, episode: Episode) -> float:
        if self.pay_cut_turns:
            texts = [m["content"] for m in episode.messages if m["role"] == "assistant"]
            shares = [t.count(self.letter) / len(t) if t else 0.0 for t in texts]
            episode.metrics["letter_fraction_last"] = shares[-1] if shares else 0.0
            return sum(shares) / len(shares) if shares else 0.0
        scores = episode.state.get("turn_scores", [])
        episode.metrics["letter_fraction_last"] = scores[-1] if scores else 0.0
        return sum(scores) / self.turns
