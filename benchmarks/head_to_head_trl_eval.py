"""Held-back evaluation in TRL's own loop, for the head-to-head: TRL's `GRPOTrainer.evaluate()` on the held-back
rows of envs.stations (`rows("held_out")`), as TRL evaluates during training (`eval_dataset`,
`eval_strategy="steps"`): its generation with `environment_factory`, its response parser (a `<tool_call>` block
must close and hold valid JSON, else the turn is text and the episode ends), its turn limit
(`max_tool_calling_iterations`), and the same reward function. So a checkpoint of either trainer is also
judged by TRL's rules, not only by aitrain's (`aitrain eval`: its lenient parser, cut turns continued).

- `EvalRecorder`: the reward function wrapped, keeping its name (`station_reward`, so TRL's metric names do
  not change), records each evaluation episode's score (training episodes pass through) and logs
  `success` (TRL shows it as `eval_success`); success is the share of episodes scoring 1.0, as in aitrain's
  evaluation.
- `ledger_evaluations`: each `trainer.evaluate()` (TRL's `eval_on_start` and every `eval_steps`) writes
  its begin and end into the evaluation ledger (head_to_head_ledger.py), whose CPU the budget leaves out.
- `evaluate_checkpoint`: `head_to_head_trl.py --evaluate CHECKPOINT --start START --output FILE` loads a
  checkpoint of either trainer (a LoRA adapter on the start, merged; or a plain model folder, the start
  itself) and runs `trainer.evaluate()` without training: `--eval-tasks` held-back rows x `--eval-samples`
  (TRL's `num_generations_eval`) at `--eval-temperature` (0.7, as `aitrain eval` here), sampling seed
  `--eval-seed`. Writes one JSON line an episode (`city`, `score`), what head_to_head_report.py reads
  from `aitrain eval` too.

Left out: TRL's loss forward in evaluation (its `prediction_step` computes the loss of the episodes; with
beta 0 there is no reference pass, and its cost is small beside generation), and the same episodes as
`aitrain eval` (each loop samples its own: the two loops' numbers are two estimates on the same tasks).
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

SUCCESS = 1.0 - 1e-9


class EvalRecorder:
    """See the module docstring; `trainer` is set once the trainer exists."""

    def __init__(self):
        self.trainer = None
        self.scores: list[float] = []
        self.cities: list[str] = []

    def reward_func(self):
        from envs.stations_trl import station_reward as score

        recorder = self

        def station_reward(completions, environments, **kwargs):
            scores = score(completions, environments, **kwargs)
            trainer = recorder.trainer
            if trainer is not None and not trainer.model.training:
                recorder.scores.extend(scores)
                recorder.cities.extend(getattr(env, "city", None) for env in environments)
                if kwargs.get("log_metric") is not None:
                    kwargs["log_metric"]("success", sum(s >= SUCCESS for s in scores) / max(1, len(scores)))
            return scores

        return station_reward

    def success(self) -> float | None:
        return sum(s >= SUCCESS for s in self.scores) / len(self.scores) if self.scores else None

    def mean(self) -> float | None:
        return statistics.mean(self.scores) if self.scores else None


def ledger_evaluations(trainer, recorder: EvalRecorder, ledger) -> None:
    """Wrap `trainer.evaluate` (Trainer calls it by attribute, at the start and every eval_steps)."""
    original = trainer.evaluate

    def evaluate(*args, **kwargs):
        step = trainer.state.global_step
        recorder.scores.clear()
        recorder.cities.clear()
        ledger.begin(step)
        metrics = original(*args, **kwargs)
        ledger.end(step, recorder.success(), recorder.mean(), len(recorder.scores))
        print(f"trl held-back eval at step {step}: success {recorder.success() or 0:.1%}, mean score "
              f"{recorder.mean() or 0:.3f} ({len(recorder.scores)} episodes)", flush=True)
        return metrics

    trainer.evaluate = evaluate


def load_policy(path: str | Path, start: str | Path):
    """A checkpoint as a plain model: a LoRA adapter (either trainer's checkpoint) merged into the start, or
    a full model folder (the start)."""
    from transformers import AutoModelForCausalLM

    path = Path(path)
    if (path / "adapter_config.json").exists():
        from peft import PeftModel

        base = AutoModelForCausalLM.from_pretrained(str(start), dtype="float32")
        return PeftModel.from_pretrained(base, str(path)).merge_and_unload()
    return AutoModelForCausalLM.from_pretrained(str(path), dtype="float32")


def evaluate_checkpoint(checkpoint: str | Path, start: str | Path, output: Path, tasks: int, samples: int,
                        temperature: float, seed: int) -> dict:
    """TRL's evaluate() on the held-back rows with `checkpoint`'s weights; writes `output`, returns a summary."""
    import torch
    from datasets import Dataset
    from trl import GRPOTrainer

    from envs.stations_trl import StationsTRL, rows
    from head_to_head_trl import RECIPE, grpo_args, tokenizer_for

    torch.set_num_threads(1)
    recipe = dict(RECIPE, temperature=temperature, kl_coef=0.0)  # no KL: no reference model to load
    args = grpo_args(output.parent / f".{output.stem}-trl", seed, save_steps=10**9, recipe=recipe)
    args.num_generations_eval = samples
    args.per_device_eval_batch_size = 16 if 16 % samples == 0 else samples
    recorder = EvalRecorder()
    trainer = GRPOTrainer(model=load_policy(checkpoint, start), args=args, processing_class=tokenizer_for(str(start)),
                          train_dataset=Dataset.from_list(rows("train")),
                          eval_dataset=Dataset.from_list(rows("held_out")[:tasks]), environment_factory=StationsTRL,
                          reward_funcs=[recorder.reward_func()])
    recorder.trainer = trainer
    metrics = trainer.evaluate()
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text("".join(json.dumps({"city": c, "score": s}) + "\n"
                              for c, s in zip(recorder.cities, recorder.scores)))
    summary = {"checkpoint": str(checkpoint), "episodes": len(recorder.scores), "success": recorder.success(),
               "mean_score": recorder.mean(), "trl_metrics": {k: v for k, v in metrics.items()
                                                              if isinstance(v, (int, float))}}
    print(f"trl loop: {summary['episodes']} episodes, success {summary['success']:.3f}, mean score "
          f"{summary['mean_score']:.3f} -> {output}", flush=True)
    return summary
