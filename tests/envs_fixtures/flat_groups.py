"""Single-turn environment whose `flat` prompts always score 0.5 (a group with no signal) and whose
other prompts score by the completion's length (groups of sampled episodes almost always differ)."""

from aitrain_grpo.env.base import Environment, Episode


class FlatGroupsEnv(Environment):
    max_turns = 1

    def __init__(self, num_tasks: int = 8, flat_every: int = 2):
        self.num_tasks = num_tasks
        self.flat_every = flat_every  # every flat_every-th prompt is flat; 1: all of them

    def build_dataset(self, tokenizer):
        return [
            {"prompt": [{"role": "user", "content": f"Say something about {i}."}], "task": i, "flat": i % self.flat_every == 0}
            for i in range(self.num_tasks)
        ]

    def score_episode(self, episode: Episode) -> float:
        if episode.row["flat"]:
            return 0.5
        return (len(episode.last_completion) % 5) / 4
