"""The processes of benchmarks/head_to_head.py: start them `--parallel` at a time (one core each), stop each
at its budget, and record what each used (run.json).

The budget is one of two clocks:
- wall minutes (`--budget`): SIGTERM `budget_s` seconds after the process started (model loading
  included): what a user waits, but on a machine shared with other work a run gets less than a core and
  does fewer steps, by an amount neither trainer controls;
- CPU minutes (`--cpu-budget`): SIGTERM when the process tree's training CPU seconds reach `cpu_budget_s`.
  Training CPU is the CPU time of the process and every descendant (/proc: user + system, with the
  children it has already waited for), less what its in-training held-back evaluations used. Each runner
  writes those into its evaluation ledger (`H2H_EVAL_LEDGER`, a JSON line as an evaluation begins and as
  it ends, with the process's CPU seconds; head_to_head_ledger.py), and an evaluation under way counts from
  its begin line. So both trainers stop at the same compute spent training, whatever the machine's load,
  and evaluating more often (aitrain, doing more steps) costs a run none of its budget.
Either way the signal waits until the run has printed that training began (a SIGTERM before it would find
aitrain's SignalStop not yet installed), and a run still going KILL_AFTER_S after it is killed.

A resumed run (`cpu_offset_s`: its CPU when the checkpoint it goes on from was saved, head_to_head_ledger.py)
counts on from there: the offset is added to its process tree's CPU and passed to the runner
(`H2H_CPU_OFFSET`) for its ledger. Its new process loads the model again, and that CPU counts as training
(tens of seconds in 40 minutes; run.json says where a run was resumed).

Recorded in run.json: the command, start and end, exit code, peak resident memory (`os.wait4`), CPU
seconds (the process and its waited-for children), the budget (`budget_s` or `cpu_budget_s`), the
training and evaluation CPU seconds when the signal went (`signal_train_cpu_s`, `signal_eval_cpu_s`),
`resumed_from_step` and `cpu_offset_s` (None and 0 for a run in one process), `code`: the repository's
commit when the process started, "+changes" when its tracked files differed from it (the report says
which code each run ran: a run resumed in a later session may run later code), and `cpu_timeline`:
[seconds since start, the run's CPU seconds (process tree plus offset)] every CPU_EVERY_S.

Left out: processes that detach from the tree (none here), and several machines.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from head_to_head_ledger import CPU_OFFSET_ENV, LEDGER_ENV

REPO = Path(__file__).resolve().parent.parent
# Both trainers print this line when training begins (aitrain's progress display, the TRL runner's callback).
TRAINING_STARTED = "\ntraining: "
CPU_EVERY_S = 2.0  # how often a run's CPU time is sampled (run.json's cpu_timeline)
KILL_AFTER_S = 7200  # after SIGTERM, a run still going this long is killed (a SmolLM2 step took 20 min at load 8)


@dataclass
class Job:
    name: str
    command: list[str]
    log: Path
    budget_s: float | None = None  # SIGTERM this long after the start
    record: Path | None = None  # run.json
    cpu_budget_s: float | None = None  # SIGTERM when training CPU seconds reach this
    ledger: Path | None = None  # the runner's evaluation ledger (its evaluations' CPU)
    cpu_offset_s: float = 0.0  # a resumed run: its CPU seconds at the checkpoint it goes on from
    resumed_from_step: int | None = None
    core: int | None = None
    process: subprocess.Popen | None = None
    started: float = 0.0
    signalled: float | None = None
    info: dict = field(default_factory=dict)
    cpu: list = field(default_factory=list)  # [(seconds since start, process-tree CPU seconds so far)]
    at_signal: dict = field(default_factory=dict)
    code: str | None = None  # the commit the process started on (code_version)


def _stat(pid: int) -> list[str] | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def cpu_seconds(pid: int) -> float | None:
    """CPU time (user + system) a running process has used so far, from /proc (None where unreadable)."""
    fields = _stat(pid)
    try:
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK") if fields else None
    except (ValueError, IndexError):
        return None


def tree_cpu_seconds(pid: int) -> float | None:
    """CPU time of `pid` and all its live descendants, with the children each has waited for."""
    parents: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            fields = _stat(int(entry))
            if fields:
                parents.setdefault(int(fields[1]), []).append(int(entry))
    total, todo, seen = 0.0, [pid], False
    while todo:
        current = todo.pop()
        fields = _stat(current)
        if not fields:
            continue
        seen = True
        total += sum(int(fields[i]) for i in (11, 12, 13, 14))
        todo += parents.get(current, [])
    return total / os.sysconf("SC_CLK_TCK") if seen else None


def eval_cpu(ledger: Path | None, now_cpu: float | None) -> float:
    """CPU seconds the run's in-training evaluations used so far (an evaluation under way up to `now_cpu`)."""
    from head_to_head_ledger import read_ledger, spent

    return spent(read_ledger(ledger), now_cpu) if ledger is not None else 0.0


def code_version() -> str | None:
    """The repository's commit, with "+changes" when tracked files differ from it; None outside git."""
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True,
                                timeout=30, check=True).stdout.strip()
        changed = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO,
                                 capture_output=True, text=True, timeout=30, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return commit + ("+changes" if changed else "")


def _start(job: Job) -> None:
    command = (["taskset", "-c", str(job.core)] if job.core is not None else []) + job.command
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", TOKENIZERS_PARALLELISM="false",
               TRL_EXPERIMENTAL_SILENCE="1")
    env.pop(LEDGER_ENV, None)
    env.pop(CPU_OFFSET_ENV, None)
    if job.cpu_offset_s:
        env[CPU_OFFSET_ENV] = repr(job.cpu_offset_s)
    if job.ledger is not None:
        env[LEDGER_ENV] = str(job.ledger.resolve())
    job.log.parent.mkdir(parents=True, exist_ok=True)
    with job.log.open("w") as out:
        out.write("$ " + " ".join(command) + "\n")
        out.flush()
        job.code = code_version()
        job.started = time.time()
        job.process = subprocess.Popen(command, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT)
    print(f"started {job.name}" + (f" on core {job.core}" if job.core is not None else ""), flush=True)


def _finish(job: Job, status: int, usage) -> None:
    code = os.waitstatus_to_exitcode(status)
    job.info = {"command": job.command, "launched": job.started, "ended": time.time(),
                "wall_seconds": round(time.time() - job.started, 1), "exit_code": code,
                "signalled_after_s": round(job.signalled - job.started, 1) if job.signalled else None,
                "peak_rss_mib": round(usage.ru_maxrss / 1024, 1), "budget_s": job.budget_s,
                "cpu_budget_s": job.cpu_budget_s, "core": job.core, "resumed_from_step": job.resumed_from_step,
                "cpu_offset_s": job.cpu_offset_s, "code": job.code,
                "cpu_seconds": round(usage.ru_utime + usage.ru_stime, 1), "load_average": os.getloadavg(),
                "eval_cpu_seconds": round(eval_cpu(job.ledger, None), 1), **job.at_signal,
                "cpu_timeline": job.cpu}
    if job.record is not None:
        job.record.write_text(json.dumps(job.info, indent=1) + "\n")
    # A budget stop exits 143 (aitrain: "stopped by SIGTERM") or 0 (TRL).
    job.info["ok"] = code == 0 or (job.signalled is not None and code == 128 + signal.SIGTERM)
    print(f"{'finished' if job.info['ok'] else 'FAILED'} {job.name}: exit {code}, {job.info['wall_seconds']:.0f} s "
          f"({job.info['cpu_seconds']:.0f} s CPU), peak {job.info['peak_rss_mib']:.0f} MiB"
          + ("" if job.info["ok"] else f"; see {job.log}"), flush=True)


def _budget_reached(job: Job, now: float, used: float | None) -> tuple[bool, str]:
    if job.budget_s is not None and now - job.started >= job.budget_s:
        return True, f"after {now - job.started:.0f} s"
    if job.cpu_budget_s is not None and used is not None:
        spent = eval_cpu(job.ledger, used)
        if used - spent >= job.cpu_budget_s:
            job.at_signal = {"signal_train_cpu_s": round(used - spent, 1), "signal_eval_cpu_s": round(spent, 1)}
            return True, f"at {used - spent:.0f} CPU s of training ({spent:.0f} s evaluating)"
    return False, ""


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
            used = None
            if not job.cpu or now - job.started - job.cpu[-1][0] >= CPU_EVERY_S:
                used = tree_cpu_seconds(job.process.pid)
                if used is not None:
                    used += job.cpu_offset_s
                    job.cpu.append((round(now - job.started, 1), round(used, 2)))
            if job.signalled is None and (job.budget_s is not None or job.cpu_budget_s is not None):
                reached, why = _budget_reached(job, now, used)
                if reached and TRAINING_STARTED in job.log.read_text(errors="replace"):
                    job.process.send_signal(signal.SIGTERM)
                    job.signalled = now
                    print(f"budget: SIGTERM to {job.name} {why}", flush=True)
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
