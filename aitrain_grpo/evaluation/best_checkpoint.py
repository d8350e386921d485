"""`--save-best METRIC`: keep the weights with the best held-back value as `best/` in the run's folder.

After each held-back evaluation (held_back.py) `BestCheckpoint.offer` compares the logged value of the
metric with the best so far (higher or lower is better as option_rules.EVAL_METRICS says; a tie keeps
the earlier weights) and, when it is better, writes the model (a LoRA adapter, or the full model with
--no-peft), the tokenizer, the run's run_config.json and `best.json` (metric, value, step) into `best/`,
write-then-rename (outputs.written_atomically): a crash mid-save leaves the earlier best whole. So
`best/` reads as the final model does: `aitrain eval --model RUN/best`, `aitrain export RUN/best`,
`--model RUN/best` for a new run.

A resumed run takes the best so far from `best/best.json` when it was written at or before the step it
resumes from (a later one belongs to the steps being played again, and is replaced by the first better
value); a fresh run replaces whatever `best/` an earlier run left at its first evaluation.

Left out: the optimizer and scheduler state (best/ is a model to use, not a checkpoint to resume from:
resume from checkpoint-N), and DeepSpeed ZeRO-3, whose sharded weights `save_pretrained` on the main
process alone does not gather.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path
from typing import Any

from aitrain_grpo.outputs import written_atomically

BEST_DIR = "best"
BEST_RECORD = "best.json"


class BestCheckpoint:
    """The best value of `metric` so far and the folder that holds its weights (module docstring)."""

    def __init__(self, output_dir: str | Path, metric: str, higher_is_better: bool):
        self.output_dir = Path(output_dir)
        self.folder = self.output_dir / BEST_DIR
        self.metric = metric
        self.higher_is_better = higher_is_better
        self.value: float | None = None
        self.step: int | None = None

    def resume(self, step: int) -> None:
        """Take the best so far from `best/best.json`, if it was written at or before `step` for this metric."""
        try:
            record = json.loads((self.folder / BEST_RECORD).read_text())
        except (OSError, ValueError):
            return
        if (isinstance(record, dict) and record.get("metric") == self.metric and isinstance(record.get("step"), int)
                and record["step"] <= step and isinstance(record.get("value"), (int, float))):
            self.value, self.step = float(record["value"]), record["step"]

    def better(self, value: float) -> bool:
        if not math.isfinite(value):
            return False
        if self.value is None:
            return True
        return value > self.value if self.higher_is_better else value < self.value

    def offer(self, step: int, metrics: dict[str, float], model, tokenizer, *, write: bool = True) -> bool:
        """Keep the weights of `step` when `metrics[metric]` beats the best so far; True when they were.
        `write` False (a process other than the main one) updates the best without writing."""
        value = metrics.get(self.metric)
        if value is None or not self.better(value):
            return False
        self.value, self.step = float(value), step
        if write:
            with written_atomically(self.folder, folder=True) as folder:
                model.save_pretrained(str(folder))
                if tokenizer is not None:
                    tokenizer.save_pretrained(str(folder))
                if (self.output_dir / "run_config.json").is_file():  # eval finds the environment and settings
                    shutil.copyfile(self.output_dir / "run_config.json", folder / "run_config.json")
                (folder / BEST_RECORD).write_text(json.dumps(self.record(), indent=2) + "\n")
        return True

    def record(self) -> dict[str, Any]:
        return {"metric": self.metric, "value": self.value, "step": self.step}

    def describe(self) -> str:
        return f"best {self.metric} {self.value:.4g} at step {self.step}"
