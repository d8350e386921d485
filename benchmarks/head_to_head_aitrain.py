"""`aitrain` for the head-to-head: `python benchmarks/head_to_head_aitrain.py grpo ...` is `aitrain grpo ...`
with two measurements added from outside, so that aitrain's code runs unchanged:
- each in-training held-back evaluation (`--eval-every`, evaluation/held_back.py's
  `HeldBackEvaluation.evaluate`) writes its begin and end, in process CPU seconds, with its success and
  mean score, into the evaluation ledger (head_to_head_ledger.py, `H2H_EVAL_LEDGER`), which the harness's
  CPU budget leaves out and the report draws; each checkpoint saved (training/trl/hooks.py's
  `_save_checkpoint`) writes a save record there, the point a resumed run counts on from;
- with `H2H_CPU_PHASES=1` (head_to_head_profile.py), the step's phase clock (training/step/phases.py,
  `PhaseClock`) counts process CPU seconds instead of wall seconds, so `time/*` in metrics.jsonl are what
  each phase costs on a core of its own.

Left out: anything else; without the variables this is `python -m aitrain_grpo`.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))


def instrument() -> None:
    from aitrain_grpo.evaluation import held_back
    from head_to_head_ledger import Ledger

    ledger = Ledger()
    evaluate = held_back.HeldBackEvaluation.evaluate

    def evaluate_in_ledger(self, step, state, model, tokenizer):
        ledger.begin(step)
        metrics = evaluate(self, step, state, model, tokenizer)
        ledger.end(step, metrics.get("eval/success"), metrics.get("eval/mean_score"),
                   len(self.tasks.rows or []) * self.tasks.samples)
        return metrics

    held_back.HeldBackEvaluation.evaluate = evaluate_in_ledger
    from aitrain_grpo.training.trl.hooks import TRLHooks

    save_checkpoint = TRLHooks._save_checkpoint

    def save_in_ledger(self, model, trial):
        save_checkpoint(self, model, trial)
        ledger.save(self.state.global_step)

    TRLHooks._save_checkpoint = save_in_ledger
    if os.environ.get("H2H_CPU_PHASES") == "1":
        from aitrain_grpo.training.step import phases

        phases.PhaseClock.__init__.__defaults__ = (time.process_time,)


if __name__ == "__main__":
    instrument()
    from aitrain_grpo.commands.cli import app

    sys.argv[0] = "aitrain"
    app()
