"""The run's typed context: what the parts of a run share, passed to them explicitly.

TRL's trainer is not a message board: no feature module parks state on it or reads options back from it.
What several parts of a run need lives here, built once by `build_trainer` (training/trainer.py) and
handed to the trainer and to whoever needs a piece of it:

- `config` and `plan`: the run's options and its plan (output folder, resume point, generation engine,
  batch shape: training/run/plan.py);
- `metrics`: the run's metrics sink (runlog/step_metrics.py), drained into each log record;
- `timing`: the step's phase clock and memory peaks (runlog/step_timing.py);
- `rollout`: the training rollout (training/rollout/training_rollout.py), which plays a step's episodes;
- `shared_prefix`: the shared-prefix loss's mode and what it has found unsupported (step/shared_prefix.py);
- `curriculum`: `--rl-curriculum pools` (rollout/curriculum.py), made with the trainer's dataset; None when off;

Left out: TRL's own state (its optimizer, scheduler, model wrappers), which stays TRL's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from aitrain_grpo.config import RunConfig
from aitrain_grpo.runlog.step_metrics import StepMetrics
from aitrain_grpo.runlog.step_timing import StepTiming

if TYPE_CHECKING:
    from aitrain_grpo.training.rollout.curriculum import Curriculum
    from aitrain_grpo.training.run.plan import RunPlan
    from aitrain_grpo.training.rollout.training_rollout import TrainingRollout
    from aitrain_grpo.training.step.shared_prefix import SharedPrefix


@dataclass
class RunContext:
    """See the module docstring."""

    config: RunConfig
    metrics: StepMetrics
    timing: StepTiming
    rollout: "TrainingRollout"
    shared_prefix: "SharedPrefix"
    plan: "RunPlan | None" = None
    curriculum: "Curriculum | None" = None
    resumed_curriculum: dict[str, Any] | None = None  # read from a checkpoint; loaded when the curriculum is made


__all__ = ["RunContext"]
