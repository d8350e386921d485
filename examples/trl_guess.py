"""An environment written for TRL's `GRPOTrainer(environment_factory=...)`, trained here unchanged:

    aitrain grpo --rl-env trl:examples.trl_guess:GuessNumberEnv --rl-env-config '{"rows": "examples.trl_guess:rows"}'

Nothing below imports aitrain_grpo: `reset(**row)` gets the dataset row's columns and returns text to add
to the prompt, every public method is a tool, and `get_reward()` scores the episode, as in TRL's docs.
"""

import random


class GuessNumberEnv:
    def reset(self, **kwargs) -> str:
        self.secret = kwargs["secret"]
        self.guesses = 0
        self.solved = False
        return f" The number is between 1 and {kwargs['high']}."

    def guess(self, number: int) -> str:
        """Guess the secret number.

        Args:
            number: The number to guess.
        """
        self.guesses += 1
        if number == self.secret:
            self.solved = True
            return "Right!"
        return "Too low." if number < self.secret else "Too high."

    def get_reward(self) -> float:
        return 1.0 / self.guesses if self.solved else 0.0


def rows(count: int = 64, high: int = 20, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    ask = "Find my secret number with the guess tool."
    return [{"prompt": [{"role": "user", "content": ask}], "secret": rng.randint(1, high), "high": high}
            for _ in range(count)]
