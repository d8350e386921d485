"""A tiny valid environment with one required constructor argument."""

from aitrain_grpo.env.base import Environment, Episode


class GoodEnv(Environment):
    def __init__(self, num_tasks: int, seed: int = 0, *, prefix: str = "Task"):
        self.num_tasks = num_tasks
        self.seed = seed
        self.prefix = prefix

    def build_dataset(self, tokenizer):
        return [{"prompt": [{"role": "user", "content": f"{self.prefix} {i}"}], "answer": i}
                for i in range(self.num_tasks)]

    def score_episode(self, episode: Episode) -> float:
        return 1.0


class Helper:
    """Not an environment: listed among the module's classes, rejected if chosen."""


def make_env():
    return GoodEnv(num_tasks=1)


default_env = GoodEnv(num_tasks=1)
