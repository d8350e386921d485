"""`TokenTrace`: one training sequence of an episode as tokens, exactly as the model saw and sampled them.

An episode is one sequence unless its history is rewritten (a context strategy, engine/context.py; an
agent's own rewrite, engine/agent_session.py): each rewrite ends a sequence and starts the next from the
chat template of the rewritten messages. `RolloutBatch.traces` holds each episode's last sequence and
`RolloutBatch.earlier` those before it (engine/rollout.py).

Left out: how sequences are built (the rollout engine and the context keeper) and how they train (training/).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class TokenTrace:
    """One sequence of an episode. `env_mask[i]` is 1 where the model sampled `completion_ids[i]`;
    `turn_starts[k]` is where model turn k of this sequence begins in `completion_ids`, and
    `turn_numbers[k]` the episode's turn it belongs to (its index in `episode.turn_rewards`): a turn the
    environment answers is the episode's turn of that number; a summary turn (the `summarize` strategy)
    carries the number of the turn that follows it, whose future it serves."""

    prompt_ids: list[int]
    completion_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    env_mask: list[int] = field(default_factory=list)
    turn_starts: list[int] = field(default_factory=list)
    turn_numbers: list[int] = field(default_factory=list)

    def add_model_tokens(self, ids: list[int], logprobs: list[float], turn: int | None = None) -> None:
        """One model turn's sampled tokens; `turn` is its episode turn (default: its order in this sequence)."""
        self.turn_numbers.append(len(self.turn_starts) if turn is None else turn)
        self.turn_starts.append(len(self.completion_ids))
        self.completion_ids.extend(ids)
        self.logprobs.extend(logprobs)
        self.env_mask.extend([1] * len(ids))

    def add_env_tokens(self, ids: list[int]) -> None:
        self.completion_ids.extend(ids)
        self.logprobs.extend([0.0] * len(ids))
        self.env_mask.extend([0] * len(ids))

    @property
    def length(self) -> int:
        """Tokens in the sequence: the prompt and everything after it (what the model's context holds)."""
        return len(self.prompt_ids) + len(self.completion_ids)
