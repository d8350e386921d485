"""Episodes whose history outgrows the context, for the context strategies' tests (engine/context.py):
`Library`, whose every reply is a long tool result, `Recording`, the tiny model's backend keeping what
it sampled for each prompt, and `play`, one engine run of an environment's rows (a text policy such as an
oracle plays at the token level through the product's `ScriptedBackend`)."""

from __future__ import annotations

from aitrain_grpo import Environment
from aitrain_grpo.engine.rollout import RolloutEngine
from aitrain_grpo.engine.settings import EpisodeSettings
from helpers.rollouts import GREEDY, NEW_TOKENS, TurnEndingHF


class Recording(TurnEndingHF):
    """The tiny model's backend (every turn ends on EOS), keeping what it sampled for each prompt."""

    def generate(self, prompts, max_tokens, sampling, **keys):
        samples = super().generate(prompts, max_tokens, sampling, **keys)
        drawn = self.__dict__.setdefault("drawn", {})
        for prompt, sample in zip(prompts, samples):
            drawn.setdefault(tuple(prompt), []).append(list(sample.token_ids))
        return samples


class Library(Environment):
    """Each turn's reply is a long tool result; 6 turns, then the score says how many were played."""

    max_turns = 6

    def __init__(self, words: int = 30, longer_by_task: int = 0):
        self.words, self.longer_by_task = words, longer_by_task

    def build_dataset(self, tokenizer):
        return [{"prompt": [{"role": "system", "content": "You collect facts from documents."},
                            {"role": "user", "content": f"Task {task}: read every document."}], "task": task}
                for task in range(2) for _ in range(2)]

    def step(self, episode, completion):
        words = self.words + self.longer_by_task * episode.row["task"]
        facts = " ".join(f"fact{episode.turns}-{k}" for k in range(words))
        return [{"role": "tool", "name": "read", "content": f"document {episode.turns}: {facts}"}]

    def score_episode(self, episode):
        return episode.turns / self.max_turns


def play(model, tokenizer, env, schedule="lockstep", backend=None, **settings):
    """Every row of `env` played once (greedy, NEW_TOKENS a turn, `settings` over that): (batch, engine, backend)."""
    backend = backend or Recording.for_model(model, tokenizer)
    with RolloutEngine(env, tokenizer, backend, EpisodeSettings(max_new_tokens=NEW_TOKENS, sampling=GREEDY,
                                                                schedule=schedule, **settings)) as engine:
        return engine.run(env.build_dataset(tokenizer)), engine, backend
