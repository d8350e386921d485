"""Classes that do not subclass Environment: one duck-typed environment, one that is not one."""

import abc

from aitrain_grpo.env.base import Environment


class DuckEnv:
    def __init__(self, size: int = 2):
        self.size = size

    def build_dataset(self, tokenizer):
        return [{"prompt": "Quack?"}] * self.size

    def score_episode(self, episode):
        return 1.0


class NotAnEnv:
    def build_dataset(self, tokenizer):
        return []


class AbstractEnv(Environment, abc.ABC):
    def build_dataset(self, tokenizer):
        return [{"prompt": "x"}]

    def score_episode(self, episode):
        return 0.0

    @abc.abstractmethod
    def grade(self, text): ...


class NoKeywordsEnv(Environment):
    def build_dataset(self, tokenizer):
        return [{"prompt": "x"}]

    def score_episode(self, episode):
        return 0.0
