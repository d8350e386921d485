"""RewriteAgent: `envs.rewrite`'s task written as agent code on the openai SDK, to train through the endpoint.

The same rows, the same two turns (answer, then rewrite under the constraint) and the same score as
`RewriteEnv`, but the conversation is driven by a plain openai-SDK loop against the run's
OpenAI-compatible endpoint instead of by `step`. benchmarks/learning.py's `rewrite-agent` workload trains
it with the `rewrite` recipe, so the two can be compared: what the endpoint changes in learning.

A first answer cut off by its token limit (`finish_reason == "length"`) ends the episode with score 0,
as `--rl-cut-turn end` does for `RewriteEnv` in that recipe (the agent decides, not the run's option).

    aitrain grpo --model smollm2 --rl-env-module envs.rewrite_agent --rl-env-class RewriteAgent \\
        --lr 1e-3 --rl-kl-coef 0 --rl-temperature 0.7 --batch-size 16 --rl-num-generations 4 \\
        --rl-max-new-tokens 40 --rl-max-completion-length 128 --max-steps 30

Left out: anything `RewriteEnv` leaves out (see envs/rewrite.py).
"""

from __future__ import annotations

from aitrain_grpo import AgentEnvironment, AgentResult
from envs.rewrite import CONSTRAINTS, RewriteEnv, score_rewrite


class RewriteAgent(AgentEnvironment):
    """Answer, then rewrite the answer under a constraint, asked by an agent loop."""

    max_turns = 2

    def __init__(self, constraints: list[str] | None = None, split: str = "train", repeats: int = 4):
        self.tasks = RewriteEnv(constraints, split, repeats)  # the rows and their checks

    def build_dataset(self, tokenizer) -> list[dict]:
        return self.tasks.build_dataset(tokenizer)

    async def rollout(self, client, row) -> AgentResult:
        messages = list(row["prompt"])
        answers = []
        for instruction in (None, CONSTRAINTS[row["constraint"]][0]):
            if instruction is not None:
                messages.append({"role": "user", "content": instruction})
            reply = await client.chat.completions.create(model=client.model, messages=messages)
            choice = reply.choices[0]
            answers.append(choice.message.content or "")
            messages.append({"role": "assistant", "content": answers[-1]})
            if choice.finish_reason == "length" and instruction is None:
                return AgentResult(0.0, {"substance": 0.0, "kept": 0.0, "constraint": 0.0})
        score, metrics = score_rewrite(answers, row["constraint"])
        return AgentResult(score, metrics)
