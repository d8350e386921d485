"""Trainer callbacks: the metrics file and a compact console line per logging step.

`metrics.jsonl` holds one JSON object per logged training step: `step`, TRL's `reward` and
`reward_std`, the loss and KL, and every `env/*` value the rollout logged. Only the main process
writes it. The console line is what a person watching the run reads: reward, turns, errors, speed.

Left out: health warnings, transcripts and reports.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

from rich.console import Console
from transformers import TrainerCallback


def _clean(value):
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


class MetricsFileCallback(TrainerCallback):
    """Appends each training log (not the end-of-run summary) to `<output_dir>/metrics.jsonl`."""

    def __init__(self, output_dir: str | Path):
        self.path = Path(output_dir) / "metrics.jsonl"

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not state.is_world_process_zero or not logs or "reward" not in logs:
            return
        record = {"step": state.global_step, **{k: _clean(v) for k, v in logs.items()}}
        with self.path.open("a") as f:
            f.write(json.dumps(record) + "\n")


class ConsoleCallback(TrainerCallback):
    """One line per logging step: step/total, reward mean±std, turns, errors, seconds per step."""

    def __init__(self, console: Console | None = None):
        self.console = console or Console(highlight=False)
        self.started = None

    def on_train_begin(self, args, state, control, **kwargs):
        self.started = time.time()
        if state.is_world_process_zero:
            self.console.print(f"training: {state.max_steps} steps, output in {args.output_dir}")

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not state.is_world_process_zero or not logs or "reward" not in logs:
            return
        elapsed = time.time() - (self.started or time.time())
        per_step = elapsed / max(state.global_step, 1)
        parts = [
            f"step {state.global_step}/{state.max_steps}",
            f"reward {logs.get('reward', 0):.3f}±{logs.get('reward_std', 0):.3f}",
            f"turns {logs.get('env/turns_mean', 0):.2f}",
            f"errors {int(logs.get('env/errors', 0))}",
            f"{per_step:.2f}s/step",
        ]
        self.console.print("  ".join(parts))
