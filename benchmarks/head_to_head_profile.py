"""Where a step's time goes, aitrain against TRL: one step of each trainer from the same start with the same seed
and recipe (benchmarks/head_to_head.py's), phase by phase in CPU seconds, so HEAD_TO_HEAD.md can say where
aitrain's speed comes from instead of "not profiled".

    python benchmarks/head_to_head_profile.py --start runs/head_to_head/start            # SmolLM2 from the SFT start
    python benchmarks/head_to_head_profile.py --start runs/head_to_head/start --ablate   # + aitrain with fixes off
    python benchmarks/head_to_head_profile.py --start tiny --out /tmp/prof --md /tmp/prof/P.md   # smoke run

- aitrain: `aitrain grpo --max-steps 1` through head_to_head_aitrain.py with `H2H_CPU_PHASES=1`, so its
  own step timing (runlog/step_timing.py, training/step/phases.py) counts process CPU seconds: `time/rollout_s`,
  `time/score_s`, `time/ref_logprobs_s`, `time/loss_forward_backward_s`, `time/optimizer_step_s` (its
  `time/generate_s`, the engine's generate calls inside the rollout, stays wall seconds and is not shown:
  the table's "generate" is TRL's alone; aitrain's rollout is generation but for its 0.05 s of tools).
- TRL: `GRPOTrainer.train()` for one step (head_to_head_trl.py's `build_trainer`), with its methods wrapped
  here (TRL's private names, TRL 1.16) to charge CPU and wall seconds: `_generate` (the multi-turn rollout:
  generation, tool calls, parsing) and within it `_generate_single_turn` (the model's generate calls);
  `_get_per_token_logps_and_entropies` called inside `_generate_and_score_completions` (the reference
  log-probabilities; old ones too when TRL computes them); `_calculate_rewards`; the rest of
  `_generate_and_score_completions` and `_prepare_inputs` (advantages, tensors: "score");
  `training_step` less `_prepare_inputs` (every micro-batch's loss forward and backward); the optimizer from
  `on_pre_optimizer_step` to `on_optimizer_step`. The phases are named as aitrain's are.
- `--ablate`: aitrain again with `--shared-prefix-loss off` (its one CPU fix to TRL's passes that is a
  flag; the others, training/trl/lm_head.py, scoring_passes.py and engine/backends/attention.py, have no
  switch, so their part is read from the phase they speed up, not toggled).

The same seed and start give both trainers the same prompts' order but not the same samples (each samples
with its own generator calls), so the table also gives each step's model turns and tokens. Runs go
`--parallel` at a time (default 2, one core each): CPU seconds do not depend on the load, wall seconds do.

Left out: several steps (the runs themselves measure every step), memory (run.json), and GPUs.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
if str(REPO / "benchmarks") not in sys.path:
    sys.path.append(str(REPO / "benchmarks"))

PHASES = ("rollout", "score", "ref_logprobs", "reward", "loss_forward_backward", "optimizer_step")
BEGIN, END = "<!-- head-to-head-profile -->", "<!-- /head-to-head-profile -->"


class TRLPhases:
    """CPU and wall seconds of TRL's step phases (module docstring), from wrapped methods and callbacks."""

    def __init__(self):
        self.cpu: dict[str, float] = defaultdict(float)
        self.wall: dict[str, float] = defaultdict(float)
        self.scoring = False
        self.marks: dict[str, tuple[float, float]] = {}

    @staticmethod
    def now() -> tuple[float, float]:
        return time.process_time(), time.perf_counter()

    def charge(self, label: str, since: tuple[float, float]) -> None:
        cpu, wall = self.now()
        self.cpu[label] += cpu - since[0]
        self.wall[label] += wall - since[1]

    def wrap(self, trainer, name: str, label) -> None:
        original = getattr(trainer, name)

        def timed(*args, **kwargs):
            chosen = label() if callable(label) else label
            since = self.now()
            if name == "_generate_and_score_completions":
                self.scoring = True
            try:
                return original(*args, **kwargs)
            finally:
                if name == "_generate_and_score_completions":
                    self.scoring = False
                self.charge(chosen, since)

        setattr(trainer, name, timed)

    def install(self, trainer) -> None:
        from transformers import TrainerCallback

        self.wrap(trainer, "_generate", "rollout")
        self.wrap(trainer, "_generate_single_turn", "generate")
        self.wrap(trainer, "_get_per_token_logps_and_entropies",
                  lambda: "ref_logprobs" if self.scoring else "loss_logprobs")
        self.wrap(trainer, "_calculate_rewards", "reward")
        self.wrap(trainer, "_generate_and_score_completions", "generate_and_score")
        self.wrap(trainer, "_prepare_inputs", "prepare_inputs")
        self.wrap(trainer, "training_step", "training_step")
        phases = self

        class Edges(TrainerCallback):
            def on_step_begin(self, args, state, control, **kwargs):
                phases.marks["step"] = phases.now()

            def on_pre_optimizer_step(self, args, state, control, **kwargs):
                phases.marks["optimizer"] = phases.now()

            def on_optimizer_step(self, args, state, control, **kwargs):
                phases.charge("optimizer_step", phases.marks["optimizer"])

            def on_step_end(self, args, state, control, **kwargs):
                phases.charge("step", phases.marks["step"])

        trainer.add_callback(Edges())

    def table(self, clock: dict[str, float]) -> dict[str, float]:
        """The phases named as aitrain's (module docstring)."""
        rollout, ref, reward = clock["rollout"], clock["ref_logprobs"], clock["reward"]
        return {"rollout": rollout, "generate": clock["generate"],
                "score": clock["prepare_inputs"] - rollout - ref - reward, "ref_logprobs": ref, "reward": reward,
                "loss_forward_backward": clock["training_step"] - clock["prepare_inputs"],
                "optimizer_step": clock["optimizer_step"], "step": clock["step"]}


def trl_step(start: str, output: Path, seed: int) -> None:
    """One TRL step with its phases timed; writes <output>/phases.json."""
    import torch

    from head_to_head_trl import build_trainer

    torch.set_num_threads(1)
    trainer = build_trainer(start, output / "train", seed, save_steps=10**6, max_steps=1)
    phases = TRLPhases()
    phases.install(trainer)
    trainer.train()
    history = [h for h in trainer.state.log_history if "step_time" in h]
    stats = {k: history[0].get(k) for k in ("tools/call_frequency", "completions/mean_length", "reward")
             if history and k in history[0]}
    result = {"cpu": phases.table(phases.cpu), "wall": phases.table(phases.wall), "stats": stats}
    (output / "phases.json").write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result), flush=True)


def aitrain_phases(run: Path) -> dict:
    """The step's `time/*` (CPU seconds under H2H_CPU_PHASES=1, but `time/generate_s`: wall) from metrics.jsonl."""
    records = [json.loads(x) for x in (run / "train" / "metrics.jsonl").read_text().splitlines() if x.strip()]
    step = next(r for r in records if r.get("step") == 1 and "time/step_s" in r)
    cpu = {p: step.get(f"time/{p}_s", 0.0) for p in PHASES if p != "reward"}
    cpu.update(reward=None, generate=None, step=step["time/step_s"])
    stats = {k: step.get(k) for k in ("env/turns_mean", "env/tool_calls_mean", "completions/mean_length", "reward")
             if k in step}
    return {"cpu": cpu, "wall": {"generate": step.get("time/generate_s")}, "stats": stats}


def cell(value) -> str:
    return "n/a" if value is None else f"{value:.1f}"


def table(results: dict[str, dict]) -> str:
    rows = ["| run | rollout | (of which generate) | score | ref log-probs | reward | loss forward+backward | "
            "optimizer | step | episode stats |", "| --- " * 10 + "|"]
    for name, r in results.items():
        c = r["cpu"]
        rows.append(f"| {name} | {cell(c['rollout'])} | {cell(c.get('generate'))} | {cell(c['score'])} | "
                    f"{cell(c['ref_logprobs'])} | {cell(c['reward'])} | {cell(c['loss_forward_backward'])} | "
                    f"{cell(c['optimizer_step'])} | {cell(c['step'])} | "
                    + ", ".join(f"{k} {v:.2f}" for k, v in r["stats"].items() if isinstance(v, (int, float))) + " |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--start", required=False, help="the shared start (a model folder, or tiny/smollm2)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", type=Path, default=REPO / "runs" / "head_to_head" / "profile")
    parser.add_argument("--md", type=Path, default=None, help="write the table into this file's profile block")
    parser.add_argument("--ablate", action="store_true", help="also aitrain with --shared-prefix-loss off")
    parser.add_argument("--parallel", type=int, default=2)
    parser.add_argument("--from-json", action="store_true", help="only write the table of <out>/profile.json")
    parser.add_argument("--trl-step", type=Path, default=None, help=argparse.SUPPRESS)  # the TRL child process
    args = parser.parse_args(argv)
    if args.from_json:
        return write_table(json.loads((args.out / "profile.json").read_text()), args)
    from aitrain_grpo.models.loading import resolve_model

    start = str(Path(resolve_model(args.start)).resolve())
    if args.trl_step is not None:
        trl_step(start, args.trl_step, args.seed)
        return
    import head_to_head
    from head_to_head_jobs import Job, run_jobs

    runs = {"aitrain": head_to_head.aitrain_command(Path(start), (args.out / "aitrain" / "train").resolve(),
                                                    args.seed, 10**6, 1),
            "trl": [sys.executable, str(Path(__file__).resolve()), "--start", start, "--seed", str(args.seed),
                    "--trl-step", str((args.out / "trl").resolve())]}
    if args.ablate:
        runs["aitrain, --shared-prefix-loss off"] = [*runs["aitrain"][:-3], "--shared-prefix-loss", "off",
                                                     *runs["aitrain"][-3:]]
        runs["aitrain, --shared-prefix-loss off"][-2] = str((args.out / "aitrain-sp-off" / "train").resolve())
    folders = {"aitrain": "aitrain", "trl": "trl", "aitrain, --shared-prefix-loss off": "aitrain-sp-off"}
    import os

    os.environ["H2H_CPU_PHASES"] = "1"  # the aitrain children's phase clock counts CPU seconds
    run_jobs([Job(name, command, args.out / folders[name] / "train.log", record=None)
              for name, command in runs.items()], args.parallel, False)
    results = {name: (json.loads((args.out / "trl" / "phases.json").read_text()) if name == "trl"
                      else aitrain_phases(args.out / folders[name])) for name in runs}
    (args.out / "profile.json").write_text(json.dumps(results, indent=1) + "\n")
    write_table(results, args)


def write_table(results: dict, args) -> None:
    block = (f"One step each from `{args.start}`, seed {args.seed}, CPU seconds a phase (`python "
             f"benchmarks/head_to_head_profile.py --start {args.start}{' --ablate' if args.ablate else ''}`):\n\n"
             + table(results))
    print(block)
    if args.md is not None:
        from learning import write_block

        if not args.md.exists():
            args.md.write_text("# Profile\n")
        write_block(block, BEGIN, END, args.md)


if __name__ == "__main__":
    main()
