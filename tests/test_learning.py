"""Training through `train()` makes the tiny model better at a multi-turn task, on every seed tried.

Since issue 35 the recipe is README's quick start as it is now (examples/quickstart.yaml): envs.letters
pays nothing for a turn cut at its token limit, and credit per turn (`rl_advantage="turn"`). Measured on
seeds 0, 1, 2 (benchmarks/FIRST_RUN.md), first 10 -> last 10 steps: 0.17 -> 0.96, 0.15 -> 0.96,
0.11 -> 0.94; hence a 0.5 bar. What follows is the history of the earlier recipe (outcome credit, the old
score that paid a cut turn), kept for its measurements of the tiny model.

The recipe: envs.letters (score = share of 'a' in the model's words, 3 turns), 60 steps, batch 8,
group 4, 16 new tokens per turn, lr 3e-3 with no learning-rate warm-up (transformers' default
schedule: linear decay to 0 from the first step), no KL, top-k off, temperature 1. The rise of a run
is the mean score of its last 10 steps minus that of its first 10; each of the three seeds below must
rise by at least 0.25, and each is asserted (no early return), so a trainer that learns on one seed
in three fails.

Why this recipe: a 300k-parameter model does not improve gradually under GRPO. Within a few dozen steps
it converges onto one 'a'-rich token repeated to the end of the turn, and the score plateaus at that
token's share of 'a's: " a" gives 0.5, while " are", "name" (from tool-call JSON) or " assistant" give
0.2-0.25. Which token wins depends on how often the model samples it at the start and on the step size,
so both the tiny model and this learning rate were tuned (60 steps, batch 8, group 4, 16 tokens):

- tiny model v2 (uniform word salad, long tool conversations filling ~80% of the warm-up): 0 of 5 seeds
  reached +0.3 at lr 1e-2, 5e-3 or 3e-3;
- tiny model v3 (Zipf-weighted words, so " a" is ~6% of sampled tokens; 512-token warm-up windows):
  lr 3e-3 gave 10 of 10 seeds +0.34 to +0.42; 2e-3 9 of 10; 5e-3 4 of 5; two rebuilds with other
  warm-up seeds (as another torch or CPU might give) 9 of 10 at 3e-3.
- measured for this test (seeds 0, 1, 2 as asserted here; 2-core AVX-512 CPU, torch 2.13, trl 1.16;
  20-60 s a seed), mean score of the first 10 -> last 10 steps: 0.094 -> 0.496 (+0.40), 0.108 -> 0.477
  (+0.37), 0.085 -> 0.497 (+0.41); a second run gave the same numbers to the third decimal. The 0.25
  bar leaves 0.12 of margin under the smallest rise.

A broken trainer (no update, wrong sign, model tokens masked out of the loss) stays near or below its
first steps' score and fails on every seed: with the reward's sign flipped, seeds 0 and 1 went from
0.056 to 0.002 and 0.057 to 0.004.
"""

from __future__ import annotations

import json

import pytest

from aitrain_grpo import RunConfig, train

SEEDS = (0, 1, 2)
MIN_RISE = 0.5
STEPS = 60


def letter_run(model: str, output_dir, seed: int) -> list[dict]:
    config = RunConfig(
        model=model, output_dir=str(output_dir), rl_env_module="envs.letters", rl_env_class="LetterEnv",
        rl_env_config={"letter": "a", "turns": 3}, max_steps=STEPS, batch_size=8, rl_num_generations=4,
        rl_max_new_tokens=16, lr=3e-3, rl_kl_coef=0.0, rl_top_k=0, rl_temperature=1.0, seed=seed,
        # Tuned with a cut turn ending its episode (the default was `end` then); kept so the figures hold.
        rl_cut_turn="end",
        rl_advantage="turn",  # README's quick start since issue 35 (examples/quickstart.yaml)
    )
    summary = train(config)
    assert summary["global_step"] == STEPS
    assert (output_dir / "adapter_config.json").exists()  # LoRA is the default
    return [json.loads(line) for line in (output_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
@pytest.mark.parametrize("seed", SEEDS)
def test_multi_turn_letter_score_rises_by_a_quarter_within_60_steps(tiny_model_dir, tmp_path, seed):
    records = letter_run(tiny_model_dir, tmp_path / f"seed{seed}", seed)
    assert [r["step"] for r in records] == list(range(1, STEPS + 1))
    assert records[0]["env/turns_mean"] > 1.0  # episodes really were multi-turn
    scores = [r["env/score_mean"] for r in records]
    first, last = sum(scores[:10]) / 10, sum(scores[-10:]) / 10
    assert last - first >= MIN_RISE, f"seed {seed}: mean score went from {first:.3f} to {last:.3f} ({last - first:+.3f})"
