"""Learning per hour, head to head with TRL's own loop: SmolLM2 on envs.stations, the same start, the same
environment (written once in TRL's `environment_factory` form), the same tokens and recipe, the same
wall-clock budget. Results in benchmarks/HEAD_TO_HEAD.md.

    OMP_NUM_THREADS=1 python benchmarks/head_to_head.py sft                       # the shared start
    python benchmarks/head_to_head.py train --budget 40 --seeds 1 2 3             # both trainers
    python benchmarks/head_to_head.py eval --parallel 2                           # every checkpoint
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
  generation, lockstep turns, 2 episodes a pass, its tool-call parser) with the recipe's numbers;
- `trl`: benchmarks/head_to_head_trl.py, `GRPOTrainer(environment_factory=StationsTRL)` (read its
  docstring for the template and options TRL is given).
The budget: `--budget` minutes after the process starts (model loading included, the same for both),
the harness sends SIGTERM (or, on a budget shorter than loading, as soon as the run prints that training
began); the TRL runner finishes the step in flight, saves a checkpoint and stops (its StopOnSignal),
aitrain drops the step in flight and saves its last finished one (SignalStop; before commit 632a29b
it finished the step too, as in the recorded runs): a run overshoots its budget by less than one step,
and the report gives each run's real minutes. Checkpoints every `--save-every` steps. Recorded in
<run>/run.json: the command, start and end times, exit code and the process's peak resident memory
(`os.wait4`'s ru_maxrss: the process and its waited-for children), its CPU time, and its CPU time
sampled every 2 s (`cpu_timeline`): on a machine shared with other work, CPU seconds are what a run
would take on a core of its own. `--max-steps N` stops after N steps instead (timing one step).

`eval` plays the held-back split of envs.stations (StationEnv, `{"split": "held_out"}`, 32 tasks x 2
samples at temperature 0.7, seed 0: beyond_sft's evaluation) with the start and with every checkpoint of
every run, through `aitrain eval` (the same tasks and sampling seed for every model) into
<run>/eval/step-<N>.jsonl. `report` is head_to_head_report.py.

Left out: GPUs, resuming a stopped run, and the environment's per-turn rewards (the runs use `outcome`).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

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
EVAL_TASKS = 32  # the first 32 held-back rows (each of the 16 cities twice), x 2 samples: beyond_sft's evaluation
SFT_DEMOS, SFT_STEPS = 64, 24  # beyond_sft's stations workload
# Both trainers print this line when training begins (aitrain's progress display, the TRL runner's
# callback): a SIGTERM before it would find aitrain's SignalStop not yet installed and kill the run.
TRAINING_STARTED = "\ntraining: "
CPU_EVERY_S = 2.0  # how often a run's CPU time is sampled (run.json's cpu_timeline)
KILL_AFTER_S = 7200  # after SIGTERM, a run still going this long is killed (a SmolLM2 step took 20 min at load 8)


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


def aitrain_command(start: Path, out: Path, seed: int, save_every: int, max_steps: int) -> list[str]:
    r = RECIPE
    return aitrain("grpo", "--model", str(start), "--rl-env", ENV_SPEC, "--rl-env-config", json.dumps(ENV_CONFIG),
                   "--batch-size", str(r["batch_size"]), "--rl-num-generations", str(r["num_generations"]),
                   "--lr", str(r["lr"]), "--rl-kl-coef", str(r["kl_coef"]), "--rl-temperature", str(r["temperature"]),
                   "--rl-top-k", str(r["top_k"]), "--rl-top-p", str(r["top_p"]), *TURN_OPTIONS,
                   "--lora-r", str(r["lora_r"]), "--lora-alpha", str(r["lora_alpha"]),
                   "--lora-dropout", str(r["lora_dropout"]), "--max-steps", str(max_steps), "--save-steps",
                   str(save_every), "--seed", str(seed), "--output-dir", str(out), "--overwrite")


def trl_command(start: Path, out: Path, seed: int, save_every: int, max_steps: int) -> list[str]:
    return [sys.executable, str(REPO / "benchmarks" / "head_to_head_trl.py"), "--start", str(start),
            "--output-dir", str(out), "--seed", str(seed), "--save-steps", str(save_every),
            "--max-steps", str(max_steps)]


COMMANDS = {"aitrain": aitrain_command, "trl": trl_command}


# ------------------------------------------------------------------------------------------ processes


@dataclass
class Job:
    name: str
    command: list[str]
    log: Path
    budget_s: float | None = None  # SIGTERM this long after the start
    record: Path | None = None  # run.json
    core: int | None = None
    process: subprocess.Popen | None = None
    started: float = 0.0
    signalled: float | None = None
    info: dict = field(default_factory=dict)
    cpu: list = field(default_factory=list)  # [(seconds since start, CPU seconds used so far)]


def cpu_seconds(pid: int) -> float | None:
    """CPU time (user + system) a running process has used so far, from /proc (None where unreadable)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def _start(job: Job) -> None:
    command = (["taskset", "-c", str(job.core)] if job.core is not None else []) + job.command
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", TOKENIZERS_PARALLELISM="false",
               TRL_EXPERIMENTAL_SILENCE="1")
    job.log.parent.mkdir(parents=True, exist_ok=True)
    with job.log.open("w") as out:
        out.write("$ " + " ".join(command) + "\n")
        out.flush()
        job.started = time.time()
        job.process = subprocess.Popen(command, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT)
    print(f"started {job.name}" + (f" on core {job.core}" if job.core is not None else ""), flush=True)


def _finish(job: Job, status: int, usage) -> None:
    code = os.waitstatus_to_exitcode(status)
    job.info = {"command": job.command, "launched": job.started, "ended": time.time(),
                "wall_seconds": round(time.time() - job.started, 1), "exit_code": code,
                "signalled_after_s": round(job.signalled - job.started, 1) if job.signalled else None,
                "peak_rss_mib": round(usage.ru_maxrss / 1024, 1), "budget_s": job.budget_s, "core": job.core,
                "cpu_seconds": round(usage.ru_utime + usage.ru_stime, 1), "load_average": os.getloadavg(),
                "cpu_timeline": job.cpu}
    if job.record is not None:
        job.record.write_text(json.dumps(job.info, indent=1) + "\n")
    # A budget stop exits 143 (aitrain: "stopped by SIGTERM") or 0 (TRL).
    job.info["ok"] = code == 0 or (job.signalled is not None and code == 128 + signal.SIGTERM)
    print(f"{'finished' if job.info['ok'] else 'FAILED'} {job.name}: exit {code}, {job.info['wall_seconds']:.0f} s "
          f"({job.info['cpu_seconds']:.0f} s CPU), peak {job.info['peak_rss_mib']:.0f} MiB"
          + ("" if job.info["ok"] else f"; see {job.log}"), flush=True)


def run_jobs(jobs: list[Job], parallel: int, pin: bool) -> None:
    """Run `jobs`, `parallel` at a time; SIGTERM each at its budget; record each one's peak memory. A
    job that fails does not stop the others; the phase fails after all of them ended."""
    waiting, running = list(jobs), []
    while waiting or running:
        while waiting and len(running) < parallel:
            job = waiting.pop(0)
            taken = {j.core for j in running}
            job.core = next(c for c in range(parallel) if c not in taken) if pin else None
            _start(job)
            running.append(job)
        time.sleep(0.5)
        for job in list(running):
            now = time.time()
            used = cpu_seconds(job.process.pid)
            if used is not None and (not job.cpu or now - job.started - job.cpu[-1][0] >= CPU_EVERY_S):
                job.cpu.append((round(now - job.started, 1), used))
            if (job.budget_s is not None and job.signalled is None and now - job.started >= job.budget_s
                    and TRAINING_STARTED in job.log.read_text(errors="replace")):
                job.process.send_signal(signal.SIGTERM)
                job.signalled = now
                print(f"budget: SIGTERM to {job.name} after {now - job.started:.0f} s", flush=True)
            elif job.signalled is not None and now - job.signalled > KILL_AFTER_S:
                job.process.kill()
            pid, status, usage = os.wait4(job.process.pid, os.WNOHANG)
            if pid:
                job.process.returncode = os.waitstatus_to_exitcode(status)
                running.remove(job)
                _finish(job, status, usage)
    failed = [job for job in jobs if not job.info.get("ok")]
    if failed:
        raise SystemExit(f"{len(failed)} failed: " + "; ".join(f"{job.name} (see {job.log})" for job in failed))


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
    for seed in args.seeds:  # per seed both trainers, so side-by-side runs share the machine's load alike
        for trainer in args.trainers:
            out = run_dir(args, trainer, seed)
            if out.exists():
                shutil.rmtree(out)
            out.mkdir(parents=True)
            command = COMMANDS[trainer](start, (out / "train").resolve(), seed, args.save_every, args.max_steps)
            budget = None if args.max_steps != RECIPE["max_steps"] else args.budget * 60
            jobs.append(Job(out.name, command, out / "train.log", budget, out / "run.json"))
    run_jobs(jobs, args.parallel, args.pin)


def runs(args) -> list[Path]:
    return sorted(p for p in args.runs_dir.glob("*-seed*") if (p / "run.json").is_file())


def evaluate(args) -> None:
    """Every model not yet evaluated: the start (step 0) and each checkpoint of each run."""
    jobs = []
    options = (*EVAL, "--episodes", str(args.eval_tasks))
    target = args.runs_dir / "start-eval.jsonl"
    if not target.exists():
        command = aitrain("eval", "--model", str(start_dir(args)), *options, "--output", str(target))
        jobs.append(Job("eval start", command, args.runs_dir / "start-eval.log"))
    for run in runs(args):
        for step, checkpoint in checkpoints(run):
            target = run / "eval" / f"step-{step}.jsonl"
            if not target.exists():
                command = aitrain("eval", "--model", str(checkpoint.resolve()), *options, "--output", str(target))
                jobs.append(Job(f"eval {run.name} step {step}", command, run / "eval" / f"step-{step}.log"))
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
    parser.add_argument("--budget", type=float, default=40.0, help="minutes of training per run")
    parser.add_argument("--max-steps", type=int, default=RECIPE["max_steps"],
                        help="stop after this many steps instead of at the budget (timing a step)")
    parser.add_argument("--save-every", type=int, default=3, help="checkpoint every N steps")
    parser.add_argument("--eval-tasks", type=int, default=EVAL_TASKS, help="held-back tasks per model (x2 samples)")
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
