"""An environment whose step and score_episode are coroutines, taking any keyword arguments."""

from aitrain_grpo.env.base import Environment


class AsyncEnv(Environment):
    def __init__(self, **options):
        self.options = options

    def build_dataset(self, tokenizer):
        return [{"prompt": "Say hi."}]

    async def step(self, episode, completion):
        return None

    async def score_episode(self, episode):
        return 0.5
