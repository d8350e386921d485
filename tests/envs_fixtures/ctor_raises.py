"""An environment whose constructor rejects its arguments with a multi-line message."""

from aitrain_grpo.env.base import Environment


class CtorRaisesEnv(Environment):
    def __init__(self, num_tasks: int = 1):
        if num_tasks < 1:
            raise ValueError(f"num_tasks must be positive,\ngot {num_tasks}")
        self.num_tasks = num_tasks

    def build_dataset(self, tokenizer):
        raise KeyError("missing_column")

    def score_episode(self, episode):
        return 1.0
