"""The run's metrics sink: one object that everything measuring a step writes into and the trainer's
`log` drains into each log record, so no part of training has to reach into another for its numbers.

Who writes: the training rollout (`env/*`, `agent/*`, `time/generate_s`..., a server pool's `vllm/*`,
--rl-zero-std-groups' and --rl-async-steps' counters), weight sync (`vllm/sync_seconds`), the step
timing callback (`time/<phase>_s`, `time/step_s`, `memory/*`: step_timing.py) and the trainer itself
(`sampling/is_masked_frac`). Who reads: `EpisodeGRPOTrainer.log` (training/trainer.py), once per log.

Left out: writing metrics.jsonl and the progress line (files.py, progress.py read the merged record),
and TRL's own metrics, which TRL averages and logs itself.
"""

from __future__ import annotations

import math
from collections import defaultdict


class StepMetrics:
    """Values recorded since the last log, each key averaged when logged (NaN left out), the way TRL
    averages its own metrics over the steps between two logs."""

    def __init__(self) -> None:
        self._values: dict[str, list[float]] = defaultdict(list)

    def update(self, metrics: dict[str, float]) -> None:
        for key, value in metrics.items():
            self._values[key].append(float(value))

    def drain(self) -> dict[str, float | None]:
        """The averages since the last drain; starts afresh."""
        averages: dict[str, float | None] = {}
        for key, values in self._values.items():
            valid = [v for v in values if not math.isnan(v)]
            averages[key] = sum(valid) / len(valid) if valid else None
        self._values.clear()
        return averages
