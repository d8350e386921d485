"""A backend whose turns a text policy writes: an oracle played by the token-level engine.

`aitrain sft` must show the model the contexts GRPO will show it. Where a context strategy rewrites an
episode's history (older tool results become stubs, a summary replaces the conversation, an
environment's `compact` hook), or tool results are cut to `--rl-max-tool-result-tokens`, those contexts
exist only in the token-level engine (engine/context.py), not in text-level play. `ScriptedBackend` lets
`RolloutEngine` play a text policy (the environment's `solve`): each turn it asks the policy for the next
message of the episode that turn belongs to, as the episode stands then (its messages after any
rewrite, so the policy sees what the model will see), and hands back that text's tokens followed by EOS
as if sampled (log-probabilities 0), cut to the turn's token limit like a sampled turn. The engine does
the rest as in training: budgets, stubs, summary requests, new sequences.

The text is encoded the way `demo_tokens` encodes a demonstration's turns (engine/demos.py), so a
conversation no strategy rewrote comes out as the same tokens either way.

A summary turn (`summarize`) is the policy's too: it is asked while `episode.log.summarizing` is set,
the summary request being the last message; an oracle meant for that strategy writes one there.
A policy that raises ends its episode as an error (scored 0 by whoever reads `errors`), not the rollout.

Left out: turns an environment asks of the policy itself (`episode.policy_turn`, self-play): they reach
the policy as a turn of the episode itself, so a self-play environment's oracle under a context strategy
answers them wrongly (under `keep`, sft plays text level, where they are answered right).
"""

from __future__ import annotations

from typing import Callable

from aitrain_grpo.engine.backends.base import RequestBackend, Sample, SamplingParams
from aitrain_grpo.engine.runner import BadReturnValue
from aitrain_grpo.env.base import Episode
from aitrain_grpo.errors import ConfigError


class ScriptedBackend(RequestBackend):
    """Turns written by `policy(episode) -> str` (see the module doc). Bound by the engine to each rollout's
    batch (`bind_batch`), so a request's `episode` (its order in the batch) names the episode it is for."""

    episode_affinity = True  # the engine passes each request's episode order (engine/policy_turns.py)

    def __init__(self, policy: Callable[[Episode], str], tokenizer):
        if tokenizer.eos_token_id is None:
            raise ConfigError("the model's tokenizer has no EOS token, so a turn's end cannot be taught; set "
                              "tokenizer.eos_token to the token that ends an assistant turn")
        self.policy, self.tokenizer = policy, tokenizer
        self.stop_ids = [tokenizer.eos_token_id]
        self.errors: dict[int, str] = {}  # episode order -> why its policy failed, for the batch last bound
        self._batch = None

    def bind_batch(self, batch) -> None:
        """The rollout about to be played (called by `RolloutEngine` once its episodes exist)."""
        self._batch, self.errors = batch, {}

    def _turn(self, order: int, max_tokens: int) -> Sample:
        episode = self._batch.episodes[order]
        try:
            text = self.policy(episode)
            if not isinstance(text, str):
                raise TypeError(f"returned {type(text).__name__}, not the text of the next message")
        except BadReturnValue as exc:  # the oracle's `solve` broke its contract (engine/runner.oracle_policy)
            self.errors[order] = f"solve {exc}".replace("\n", " ")
            episode.done = True
            return Sample([], [], "length")
        except Exception as exc:
            self.errors[order] = f"the policy failed: {type(exc).__name__}: {exc}".replace("\n", " ")
            episode.done = True  # nothing more is asked of it; its turn below is empty and cut
            return Sample([], [], "length")
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"] + self.stop_ids
        if len(ids) > max_tokens:
            return Sample(ids[:max_tokens], [0.0] * max_tokens, "length")
        return Sample(ids, [0.0] * len(ids), "stop")

    def generate(self, prompts: list[list[int]], max_tokens: int, sampling: SamplingParams,
                 episodes: list[int] | None = None) -> list[Sample]:
        if episodes is None:
            raise ValueError("a ScriptedBackend needs each prompt's episode order (the engine passes episodes=)")
        return [self._turn(order, max_tokens) for order in episodes]

    async def generate_one(self, prompt: list[int], max_tokens: int, sampling: SamplingParams,
                           episode: int | None = None) -> Sample:
        if episode is None:
            raise ValueError("a ScriptedBackend needs the request's episode order (the engine passes episode=)")
        return self._turn(episode, max_tokens)
