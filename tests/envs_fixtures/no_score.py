"""Environment subclasses that leave a required method to the base class."""

from aitrain_grpo.env import Environment, ToolEnvironment, tool


class NoScoreEnv(Environment):
    def build_dataset(self, tokenizer):
        return [{"prompt": "Hello"}]


class NoDatasetToolEnv(ToolEnvironment):
    @tool
    def look(self) -> str:
        """Look around."""
        return "a room"

    def score_episode(self, episode):
        return 1.0
