"""Learning per hour, head to head with TRL's own loop: SmolLM2 on envs.stations, the same start, the same
environment (written once in TRL's `environment_factory` form), the same tokens and recipe, the same
budget (wall minutes, or CPU minutes of training). Results in benchmarks/HEAD_TO_HEAD.md.

    OMP_NUM_THREADS=1 python benchmarks/head_to_head.py sft                       # the shared start
    python benchmarks/head_to_head.py train --cpu-budget 40 --seeds 1 2 3 4 5     # both trainers
    python benchmarks/head_to_head.py eval --parallel 2                           # final checkpoints, both loops
    python benchmarks/head_to_head.py report                                      # HEAD_TO_HEAD.md
    python benchmarks/head_to_head.py all --model tiny --budget 1 --seeds 1 --runs-dir /tmp/h2h \
        --md /tmp/h2h/HEAD_TO_HEAD.md                                             # the smoke run

`sft` makes the start: `aitrain sft` on envs.stations (beyond_sft's stations workload: 64 oracle
demonstrations, 24 steps; `--sft-from DIR` reuses an SFT output such as runs/beyond_sft/stations-sft),
then `aitrain export` merges its adapter into a plain float32 folder, <runs-dir>/start, which both
trainers load as they load any model (so both KL references are that model).

`train` runs each (trainer, seed) as its own process from the start, `--parallel` at a time, each with
OMP_NUM_THREADS=1 (one core; `--pin` also binds the k-th concurrent run to core k with taskset):
- `aitrain`: `aitrain grpo --rl-env trl:envs.stations_trl:StationsTRL` at its defaults (Hugging Face
  generation, lockstep turns, 2 episodes a pass, its tool-call parser) with the recipe's numbers, run
  through head_to_head_aitrain.py (aitrain unchanged; its evaluations' CPU written down);
- `trl`: benchmarks/head_to_head_trl.py, `GRPOTrainer(environment_factory=StationsTRL)` (read its
  docstring for the template and options TRL is given).
In-training held-back evaluation, for the learning curves (`--eval-every`, 2 steps; `--curve-tasks` 16
held-back rows x 2 samples; 0 turns it off): aitrain's own `--eval-every/--eval-episodes/--eval-env-config`
on envs.stations' held-back split, TRL's own (`eval_dataset` = the same rows, `eval_strategy="steps"`,
`eval_on_start`), both at the training temperature (TRL has no other), each into <run>/eval-ledger.jsonl.
The budget (head_to_head_jobs.py): `--budget` wall minutes after the process starts (model loading
included), or `--cpu-budget` CPU minutes of training (the process tree's CPU less its in-training
evaluations'), the fair clock on a shared machine; then the harness sends SIGTERM, the TRL runner
finishes the step in flight, saves a checkpoint and stops (its StopOnSignal), aitrain drops the step in
flight and saves its last finished one (SignalStop; before commit 632a29b it finished the step too, as in
the recorded runs): a run overshoots its budget by less than one step, and the report gives each run's
real minutes. Checkpoints every `--save-every` steps. Recorded in <run>/run.json (head_to_head_jobs.py):
command, times, exit code, peak memory, CPU seconds, the budget and the CPU timeline. `--max-steps N`
stops after N steps instead (timing one step).

`eval` plays the held-back split of envs.stations (`--eval-tasks` 64 rows x 2 samples = 128 episodes at
temperature 0.7, seed 0) with the start and with each run's final checkpoint (`--checkpoints all`: every
one) in both loops (`--loop`): `aitrain eval` (StationEnv, `{"split": "held_out"}`) into
<run>/eval/step-<N>.jsonl, and TRL's own evaluate() (head_to_head_trl.py --evaluate: TRL's parser and turn
handling) into <run>/eval-trl/step-<N>.jsonl. `report` is head_to_head_report.py: it adds the folder's
evaluated runs to the committed record beside the write-up (head_to_head_seeds.json, head_to_head_record.py),
so seeds trained on machines since lost still count, and gives the difference over every recorded seed.
The phase profile of one step each is head_to_head_profile.py.

`train --resume` keeps the runs that finished (run.json written) and goes on with the others, stopped with
their harness (a session's end), from their newest checkpoint (head_to_head_ledger.py dates it; the
budget counts on from the run's CPU then; a run with no checkpoint starts again).

Left out: GPUs, and the environment's per-turn rewards (the runs use `outcome`).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

from head_to_head_jobs import Job, run_jobs
from head_to_head_ledger import read_ledger, resume_point, spent, until, write_ledger
from head_to_head_report import checkpoints
from head_to_head_trl import RECIPE

REPO = Path(__file__).resolve().parent.parent
TRAINERS = ("aitrain", "trl")
ENV_SPEC = "trl:envs.stations_trl:StationsTRL"
ENV_CONFIG = {"rows": "envs.stations_trl:rows", "reward_func": "envs.stations_trl:station_reward",
              "max_turns": RECIPE["max_turns"]}
TURN_OPTIONS = ("--rl-max-new-tokens", str(RECIPE["max_new_tokens"]),
                "--rl-max-completion-length", str(RECIPE["max_completion_length"]))
EVAL = ("--rl-env-module", "envs.stations", "--rl-env-class", "StationEnv", "--rl-env-config", '{"split": "held_out"}',
        "--rl-num-generations", "2", "--rl-temperature", "0.7", "--seed", "0", *TURN_OPTIONS)
EVAL_TASKS = 64  # the 64 held-back rows (each of the 16 cities 4 times) x 2 samples: 128 episodes a checkpoint
CURVE_TASKS, CURVE_EVERY = 16, 2  # in-training evaluation: 16 held-back rows x 2 samples every 2 steps
HELD_BACK = {"split": "held_out"}
SFT_DEMOS, SFT_STEPS = 64, 24  # beyond_sft's stations workload


def aitrain(*args: str) -> list[str]:
    return [sys.executable, "-m", "aitrain_grpo", *args]


def start_dir(args) -> Path:
    """The shared start: `--start` (a model folder, or a name such as smollm2), else <runs-dir>/start."""
    if getattr(args, "start", None):
        from aitrain_grpo.models.loading import resolve_model

        return Path(resolve_model(args.start)).resolve()
    return (args.runs_dir / "start").resolve()


def run_dir(args, trainer: str, seed: int) -> Path:
    """A run's folder: run.json, train.log and eval/ here, the trainer's own output in train/."""
    return args.runs_dir / f"{trainer}-seed{seed}"


# ------------------------------------------------------------------------------------------- commands


def aitrain_command(start: Path, out: Path, seed: int, save_every: int, max_steps: int, eval_every: int = 0,
                    eval_tasks: int = CURVE_TASKS, resume: Path | None = None) -> list[str]:
    """`aitrain grpo` with the recipe, through head_to_head_aitrain.py (aitrain unchanged, its in-training
    evaluations written into the ledger); with `eval_every`, aitrain's `--eval-every` on the held-back split;
    with `resume`, going on from that checkpoint (`--resume-from-checkpoint`)."""
    r = RECIPE
    held_back = ("--eval-every", str(eval_every), "--eval-episodes", str(eval_tasks), "--eval-num-generations", "2",
                 "--eval-env-module", "envs.stations", "--eval-env-class", "StationEnv", "--eval-env-config",
                 json.dumps(HELD_BACK)) if eval_every else ()
    return [sys.executable, str(REPO / "benchmarks" / "head_to_head_aitrain.py"),
            "grpo", "--model", str(start), "--rl-env", ENV_SPEC, "--rl-env-config", json.dumps(ENV_CONFIG),
            "--no-use-vllm",  # TRL's arm generates with Hugging Face generate too
            "--batch-size", str(r["batch_size"]), "--rl-num-generations", str(r["num_generations"]),
            "--lr", str(r["lr"]), "--rl-kl-coef", str(r["kl_coef"]), "--rl-temperature", str(r["temperature"]),
            "--rl-top-k", str(r["top_k"]), "--rl-top-p", str(r["top_p"]), *TURN_OPTIONS,
            "--lora-r", str(r["lora_r"]), "--lora-alpha", str(r["lora_alpha"]),
            "--lora-dropout", str(r["lora_dropout"]), "--max-steps", str(max_steps), "--save-steps",
            str(save_every), "--seed", str(seed), *held_back, "--output-dir", str(out),
            *(("--resume-from-checkpoint", str(resume)) if resume else ("--overwrite",))]


def trl_command(start: Path, out: Path, seed: int, save_every: int, max_steps: int, eval_every: int = 0,
                eval_tasks: int = CURVE_TASKS, resume: Path | None = None) -> list[str]:
    held_back = ("--eval-every", str(eval_every), "--eval-tasks", str(eval_tasks)) if eval_every else ()
    return [sys.executable, str(REPO / "benchmarks" / "head_to_head_trl.py"), "--start", str(start),
            "--output-dir", str(out), "--seed", str(seed), "--save-steps", str(save_every),
            "--max-steps", str(max_steps), *held_back, *(("--resume", str(resume)) if resume else ())]


COMMANDS = {"aitrain": aitrain_command, "trl": trl_command}


# ------------------------------------------------------------------------------------------ phases


def sft(args) -> None:
    """The shared start: `aitrain sft` (or `--sft-from`), merged into a plain folder by `aitrain export`."""
    source = args.sft_from
    if source is None:
        source = args.runs_dir / "sft"
        command = aitrain("sft", "--model", args.model, "--rl-env-module", "envs.stations", "--rl-env-class",
                          "StationEnv", "--episodes", str(args.demos), "--max-steps", str(args.sft_steps),
                          "--output-dir", str(source), "--overwrite")
        run_jobs([Job("sft", command, args.runs_dir / "sft.log")], 1, False)
    command = aitrain("export", str(source), "--to", str(start_dir(args)), "--dtype", "float32", "--overwrite")
    run_jobs([Job("export", command, args.runs_dir / "export.log")], 1, False)
    (args.runs_dir / "start.json").write_text(json.dumps({"model": args.model, "sft": str(source), "demos": args.demos,
                                                          "sft_steps": args.sft_steps}) + "\n")
    print(f"start: {start_dir(args)}", flush=True)


def train(args) -> None:
    start = start_dir(args)
    if not (start / "config.json").is_file():
        raise SystemExit(f"no start model in {start}; run `head_to_head.py sft` first")
    jobs = []
    timed = args.max_steps == RECIPE["max_steps"]  # --max-steps N: no budget
    for seed in args.seeds:  # per seed both trainers, so side-by-side runs share the machine's load alike
        for trainer in args.trainers:
            out = run_dir(args, trainer, seed)
            if args.resume and (out / "run.json").is_file():
                print(f"{out.name}: finished (run.json), kept", flush=True)
                continue
            step, checkpoint, offset = resume_point_of(out) if args.resume else (None, None, 0.0)
            if checkpoint is None:
                if out.exists():
                    shutil.rmtree(out)
                out.mkdir(parents=True)
            else:
                trained = offset - spent(read_ledger(out / "eval-ledger.jsonl"))
                print(f"{out.name}: resumes from checkpoint-{step} at {trained / 60:.1f} CPU min of training", flush=True)
            command = COMMANDS[trainer](start, (out / "train").resolve(), seed, args.save_every, args.max_steps,
                                        args.eval_every, args.curve_tasks, checkpoint)
            cpu_budget = args.cpu_budget * 60 if timed and args.cpu_budget else None
            budget = args.budget * 60 if timed and cpu_budget is None else None
            jobs.append(Job(out.name, command, out / "train.log", budget, out / "run.json", cpu_budget,
                            out / "eval-ledger.jsonl", cpu_offset_s=offset, resumed_from_step=step))
    run_jobs(jobs, args.parallel, args.pin)


def resume_point_of(out: Path) -> tuple[int | None, Path | None, float]:
    """Where an unfinished run (stopped before its budget, its harness gone with it) goes on from: its newest
    checkpoint whose save the ledger dates, and the run's CPU seconds then; (None, None, 0.0) when there is
    none (a fresh start). The work after it is dropped: later checkpoints, and the ledger's later records;
    the earlier process's log is kept as train.<k>.log."""
    ledger = out / "eval-ledger.jsonl"
    records = read_ledger(ledger)
    for step, checkpoint in reversed(checkpoints(out)):
        cpu = resume_point(records, step)
        if cpu is None:
            continue
        for later, folder in checkpoints(out):
            if later > step:
                shutil.rmtree(folder)
        write_ledger(ledger, until(records, step))
        if (out / "train.log").exists():
            (out / "train.log").rename(out / f"train.{len(list(out.glob('train.*.log'))) + 1}.log")
        return step, checkpoint.resolve(), cpu
    return None, None, 0.0


def runs(args) -> list[Path]:
    return sorted(p for p in args.runs_dir.glob("*-seed*") if (p / "run.json").is_file())


def eval_command(loop: str, model: Path, target: Path, args) -> list[str]:
    """One model on the held-back tasks in one loop: `aitrain eval`, or TRL's evaluate() (head_to_head_trl.py)."""
    if loop == "aitrain":
        return aitrain("eval", "--model", str(model), *EVAL, "--episodes", str(args.eval_tasks), "--output", str(target))
    return [sys.executable, str(REPO / "benchmarks" / "head_to_head_trl.py"), "--evaluate", str(model),
            "--start", str(start_dir(args)), "--output", str(target), "--eval-tasks", str(args.eval_tasks),
            "--eval-samples", "2", "--eval-temperature", "0.7", "--eval-seed", "0"]


def evaluate(args) -> None:
    """Every model not yet evaluated, in each loop asked: the start (step 0) and each run's final checkpoint
    (`--checkpoints all`: every checkpoint). aitrain's loop into <run>/eval/, TRL's into <run>/eval-trl/."""
    jobs = []
    for loop in (("aitrain", "trl") if args.loop == "both" else (args.loop,)):
        suffix = "" if loop == "aitrain" else "-trl"
        target = args.runs_dir / f"start-eval{suffix}.jsonl"
        if not target.exists():
            jobs.append(Job(f"eval start ({loop} loop)", eval_command(loop, start_dir(args), target, args),
                            args.runs_dir / f"start-eval{suffix}.log"))
        for run in runs(args):
            found = checkpoints(run)
            for step, checkpoint in (found if args.checkpoints == "all" else found[-1:]):
                target = run / f"eval{suffix}" / f"step-{step}.jsonl"
                if not target.exists():
                    jobs.append(Job(f"eval {run.name} step {step} ({loop} loop)",
                                    eval_command(loop, checkpoint.resolve(), target, args),
                                    run / f"eval{suffix}" / f"step-{step}.log"))
    run_jobs(jobs, args.parallel, args.pin)


def report(args) -> None:
    from head_to_head_report import write_report

    print(write_report(args.runs_dir, args.md, sys.argv))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("phase", choices=("sft", "train", "eval", "report", "all"))
    parser.add_argument("--model", default="smollm2", help="sft's base model ('tiny' for the smoke run)")
    parser.add_argument("--sft-from", type=Path, default=None, help="reuse this `aitrain sft` output")
    parser.add_argument("--start", default=None, help="train/eval from this model instead of <runs-dir>/start "
                                                      "(e.g. smollm2, to time a step)")
    parser.add_argument("--demos", type=int, default=SFT_DEMOS)
    parser.add_argument("--sft-steps", type=int, default=SFT_STEPS)
    parser.add_argument("--trainers", nargs="+", choices=TRAINERS, default=list(TRAINERS))
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--budget", type=float, default=40.0, help="wall minutes per run")
    parser.add_argument("--cpu-budget", type=float, default=None,
                        help="CPU minutes of training per run (its process tree, in-training evaluation left out); "
                             "replaces --budget")
    parser.add_argument("--eval-every", type=int, default=CURVE_EVERY,
                        help="in-training held-back evaluation every N steps, both trainers (0: none)")
    parser.add_argument("--curve-tasks", type=int, default=CURVE_TASKS, help="held-back tasks (x2) a training eval")
    parser.add_argument("--resume", action="store_true",
                        help="train: keep finished runs, and go on with unfinished ones from their last checkpoint")
    parser.add_argument("--max-steps", type=int, default=RECIPE["max_steps"],
                        help="stop after this many steps instead of at the budget (timing a step)")
    parser.add_argument("--save-every", type=int, default=3, help="checkpoint every N steps")
    parser.add_argument("--eval-tasks", type=int, default=EVAL_TASKS, help="held-back tasks per model (x2 samples)")
    parser.add_argument("--loop", choices=("aitrain", "trl", "both"), default="both", help="eval: whose loop plays")
    parser.add_argument("--checkpoints", choices=("final", "all"), default="final", help="eval: which checkpoints")
    parser.add_argument("--parallel", type=int, default=2, help="processes at once, one core each")
    parser.add_argument("--pin", action="store_true", help="bind the k-th concurrent process to core k")
    parser.add_argument("--runs-dir", type=Path, default=REPO / "runs" / "head_to_head")
    parser.add_argument("--md", type=Path, default=REPO / "benchmarks" / "HEAD_TO_HEAD.md")
    args = parser.parse_args(argv)
    args.runs_dir.mkdir(parents=True, exist_ok=True)
    phases = {"sft": [sft], "train": [train], "eval": [evaluate], "report": [report],
              "all": [sft, train, evaluate, report]}[args.phase]
    for phase in phases:
        phase(args)


if __name__ == "__main__":
    main()
