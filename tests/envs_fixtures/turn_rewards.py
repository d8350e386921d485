"""Two-turn environment that rewards each model turn (`episode.reward_turn`) by the share of the letter
'a' in it. Its score is fixed (`flat_score`), so every group is flat for the outcome advantage and
only turn credit can move the policy; or, with `flat_score=None`, the score is turn 2's share of 'a'
(groups differ), and the turn rewards are extra information an `outcome` run must ignore."""

from aitrain_grpo.env.base import Environment, Episode


def share_of_a(text: str) -> float:
    letters = [c for c in text.lower() if c.isalpha()]
    return sum(c == "a" for c in letters) / len(letters) if letters else 0.0


class TurnRewardEnv(Environment):
    max_turns = 2

    def __init__(self, num_tasks: int = 8, flat_score: float | None = 0.5, reward_turns: bool = True):
        self.num_tasks = num_tasks
        self.flat_score = flat_score
        self.reward_turns = reward_turns

    def build_dataset(self, tokenizer):
        return [{"prompt": [{"role": "user", "content": f"Say something about {i}."}], "task": i} for i in range(self.num_tasks)]

    def step(self, episode: Episode, completion: str):
        if self.reward_turns:
            episode.reward_turn(share_of_a(completion))
        return "Now say it again." if episode.turns < 2 else None

    def score_episode(self, episode: Episode) -> float:
        if self.flat_score is not None:
            return self.flat_score
        return share_of_a(episode.last_completion)
