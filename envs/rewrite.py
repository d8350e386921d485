"""RewriteEnv: a two-turn conversation where the model must rewrite its own answer under a constraint.

Turn 1: the model answers a short question about a topic in one sentence. Turn 2: the environment asks
it to write the same sentence again under a checkable constraint (for example in capital letters). The
score checks content as well as form, so no degenerate answer can earn it:

    score = substance(turn 1) * kept(turn 1 -> turn 2) * constraint(turn 2)

- substance: how many distinct key words (4+ letters, not a common word) turn 1 has; one key word or
  fewer scores 0, four or more score 1. An empty or one-word answer therefore scores 0, and so does a
  turn 1 that is not ordinary prose (its first letter is not a capital): otherwise a model learns to
  write turn 1 in lowercase already and pass the `lowercase` rewrite by copying it.
- kept: the share of turn 1's key words (up to eight) that turn 2 repeats (case-insensitive), so turn 2
  must rewrite the same sentence, not write a new or shorter one.
- constraint: how far turn 2 meets the constraint, from 0 to 1 (e.g. the share of its letters that are
  capitals).

Tasks are (topic, constraint) pairs; `split="held_out"` gives topics that `split="train"` never shows,
for evaluating a trained model on tasks it was not trained on. Used by benchmarks/learning.py:

    aitrain grpo --model smollm2 --rl-env-module envs.rewrite --rl-env-class RewriteEnv \
        --use-lora --lr 5e-4 --rl-kl-coef 0 --rl-temperature 0.7

Left out: judging meaning or grammar (only words and letters are checked), and more than one rewrite.
"""

from __future__ import annotations

import re

from aitrain_grpo import Environment, Episode

TOPICS = (
    "the ocean", "a cat", "the moon", "coffee", "a bicycle", "winter", "a library", "music",
    "the forest", "bread", "a train", "the desert", "a garden", "rain", "the city", "a river",
    "chess", "the mountains", "a dog", "tea", "the sun", "a school", "football", "a volcano",
    "the night sky", "a bridge", "apples", "a storm", "the farm", "a piano", "snow", "the island",
    "a castle", "honey", "the market", "a lighthouse", "the wind", "a kitchen", "birds", "the beach",
)
# Every fifth topic is held back from training (8 of 40).
HELD_OUT_EVERY = 5

QUESTIONS = (
    "Write one short sentence about {topic}.",
    "Describe {topic} in one short sentence.",
    "Tell me one fact about {topic} in a single short sentence.",
)


def capitals_share(text: str) -> float:
    """The share of letters that are capitals (0 for text without letters)."""
    letters = [c for c in text if c.isalpha()]
    return sum(c.isupper() for c in letters) / len(letters) if letters else 0.0


def without(violations: int) -> float:
    """1 for none, 1/2 for one, 1/3 for two, ...: every violation counts, the first one most."""
    return 1.0 / (1 + violations)


def starts_as_prose(text: str) -> bool:
    """Whether the first letter of the text is a capital, as a sentence of ordinary prose begins."""
    first = next((c for c in text if c.isalpha()), "")
    return first.isupper()


def question_form(text: str) -> float:
    """1 for a text that ends with a question mark, else 0."""
    return 1.0 if text.strip().endswith("?") else 0.0


# name -> (the instruction for turn 2, the graded check of turn 2). The base SmolLM2-135M-Instruct
# (temperature 0.7, 48 episodes) scored 0.18 on lowercase and 0.37 on no_commas, 0.02 on capitals and 0.08 on question.
CONSTRAINTS = {
    "lowercase": ("Now write the same sentence again, all in lowercase letters.",
                  lambda text: without(sum(c.isupper() for c in text))),
    "no_commas": ("Now write the same sentence again without any commas.", lambda text: without(text.count(","))),
    "capitals": ("Now write the same sentence again, all in CAPITAL LETTERS.", capitals_share),
    "question": ("Now rewrite the same sentence as a question.", question_form),
}

DEFAULT_CONSTRAINTS = ("lowercase", "no_commas")

COMMON_WORDS = frozenset(
    """about above after again also because been before being below between both could does doing
    down during each every from further have having here into itself just like made make many more
    most much must only other over same should some such than that their them then there these they
    this those through under until very were what when where which while will with would your yours
    sentence write rewrite again""".split()
)


def key_words(text: str, limit: int = 8) -> list[str]:
    """The first `limit` distinct words of 4+ letters that are not common words, lower-cased."""
    words: list[str] = []
    for word in re.findall(r"[a-z]+", text.lower()):
        if len(word) >= 4 and word not in COMMON_WORDS and word not in words:
            words.append(word)
    return words[:limit]


class RewriteEnv(Environment):
    """Answer, then rewrite the answer under a constraint; graded on content and form."""

    max_turns = 2

    def __init__(self, constraints: list[str] | None = None, split: str = "train", repeats: int = 4):
        names = list(constraints or DEFAULT_CONSTRAINTS)
        unknown = [n for n in names if n not in CONSTRAINTS]
        if unknown:
            raise ValueError(f"unknown constraint(s) {unknown}; choose from {sorted(CONSTRAINTS)}")
        if split not in ("train", "held_out"):
            raise ValueError(f"split must be 'train' or 'held_out', got {split!r}")
        if repeats < 1:
            raise ValueError("repeats must be at least 1")
        self.constraints = names
        self.split = split
        self.repeats = repeats

    def topics(self) -> list[str]:
        held_out = self.split == "held_out"
        return [t for i, t in enumerate(TOPICS) if (i % HELD_OUT_EVERY == HELD_OUT_EVERY - 1) == held_out]

    def build_dataset(self, tokenizer) -> list[dict]:
        rows = []
        # Question wordings rotate across repeats, so the same topic is asked in different ways.
        for repeat in range(self.repeats):
            for t, topic in enumerate(self.topics()):
                for c, constraint in enumerate(self.constraints):
                    question = QUESTIONS[(t + c + repeat) % len(QUESTIONS)].format(topic=topic)
                    rows.append({"prompt": [{"role": "user", "content": question}], "topic": topic, "constraint": constraint})
        return rows

    def step(self, episode: Episode, completion: str) -> str | None:
        if episode.turns >= 2:
            return None
        return CONSTRAINTS[episode.row["constraint"]][0]

    def score_episode(self, episode: Episode) -> float:
        answers = [str(m["content"]) for m in episode.messages if m["role"] == "assistant"]
        score, metrics = score_rewrite(answers, episode.row["constraint"])
        episode.metrics.update(metrics)
        return score


def score_rewrite(answers: list[str], constraint_name: str) -> tuple[float, dict[str, float]]:
    """The score of a conversation's assistant answers (turn 1, turn 2), with its three factors."""
    first = answers[0] if answers else ""
    second = answers[1] if len(answers) > 1 else ""
    first_keys = key_words(first)
    substance = min(1.0, max(0.0, (len(first_keys) - 1) / 3)) if starts_as_prose(first) else 0.0
    second_words = set(re.findall(r"[a-z]+", second.lower()))
    kept = sum(w in second_words for w in first_keys) / len(first_keys) if first_keys else 0.0
    constraint = CONSTRAINTS[constraint_name][1](second) if second else 0.0
    return substance * kept * constraint, {"substance": substance, "kept": kept, "constraint": constraint}
