"""Runs that would train nothing: a dataset too small for one step, and a run that ends short.

TRL samples `batch_size * gradient_accumulation_steps * processes / rl_num_generations` distinct prompts
for each optimizer step and drops an incomplete last batch of each epoch, so a dataset with fewer rows
than that gives no batch at all: transformers then "trains" zero steps and returns as if it had
finished. `fill_one_step` repeats the rows (whole copies, in order) until one step's worth is there,
and says so once. `steps_short` is the check for the end of a run: fewer steps than asked is a run
that did not do its job, whatever the reason.

Left out: datasets that fill a step but not `--epochs` worth of steps (TRL's sampler handles those),
and choosing which rows to repeat (every row is repeated the same number of times).
"""

from __future__ import annotations

import os
import sys
from typing import Any

from aitrain_grpo.config import RunConfig


def prompts_per_step(config: RunConfig, processes: int | None = None) -> int:
    """Distinct prompts one optimizer step draws from the dataset, over all processes."""
    if processes is None:
        processes = int(os.environ.get("WORLD_SIZE", "1"))
    episodes = config.batch_size * config.gradient_accumulation_steps * processes
    return max(1, episodes // config.rl_num_generations)


def fill_one_step(rows: list[dict[str, Any]], config: RunConfig, processes: int | None = None) -> list[dict[str, Any]]:
    """`rows`, repeated whole until one step's prompts are there; a note on stderr when it repeats."""
    needed = prompts_per_step(config, processes)
    if not rows or len(rows) >= needed:
        return rows
    copies = -(-needed // len(rows))  # ceiling division
    if os.environ.get("RANK", "0") == "0":
        print(
            f"note: the dataset has {len(rows)} prompt(s) but one step takes {needed} "
            f"(--batch-size {config.batch_size} x --gradient-accumulation-steps {config.gradient_accumulation_steps} "
            f"/ --rl-num-generations {config.rl_num_generations}, over all processes); "
            f"repeating the rows {copies} times so every step is full",
            file=sys.stderr, flush=True,
        )
    return rows * copies


def steps_short(done: int, asked: int) -> str | None:
    """One line when a run ended after fewer optimizer steps than it was asked for, else None."""
    if done >= asked and done > 0:
        return None
    return (f"the run ended after {done} of {asked} steps; the steps it did are saved, but it did not finish: "
            f"read the lines above for why, and see that the dataset fills --max-steps steps")
