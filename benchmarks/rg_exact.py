"""A reward for benchmarks/rg_warm_start.py: 1 for an episode whose answer the family scores 1, else 0.

reasoning-gym's default `score_answer` gives partial credit when the reply only contains the answer
(`len(answer) / len(reply)`: `<answer>1 + 6 = 7</answer>` scores 0.11 on "7"). GRPO divides each
group's advantages by their spread, so in a group where nothing is right that 0.11 is pushed as hard as
a right answer, and from SmolLM2's basic_arithmetic start the policy learned to echo the question inside
the tags within two steps at lr 1e-3 (SIGNAL.md). `--rl-reward-funcs benchmarks.rg_exact:exact
--rl-reward-weights 0,1` trains on exact answers alone (the environment's `correct` metric). The adapter's own `{"exact": true}`,
added after SIGNAL.md's runs, scores the same way; this file stays so those commands reproduce as written.
"""


def exact(episodes, **kwargs) -> list[float]:
    return [float(episode.metrics.get("correct", 0.0)) for episode in episodes]
