"""Overlap of generation and training: `--rl-async-steps 1` against 0 (on-policy), same seed, same work.

A vLLM server (`aitrain vllm-serve`) and the trainer each run pinned to one CPU core (`taskset`), the
trainer reaching the server over HTTP with LoRA weight sync, as in a GPU deployment with one generation
GPU and one training GPU. The workload is SmolLM2-135M-Instruct on `envs.letters` (two turns, score
= share of one letter in the model's words), sized so that a step's generation and its training take
similar time: that is where overlap can help most (the step becomes max(generate, train), not the sum).

Reported per variant: seconds per step (steps 2..N; step 1 cannot overlap and carries warm-up), the
whole run, how long the trainer waited for episodes (`async/wait_seconds`), staleness, the
importance-sampling ratio, and the score curve, with the difference of the two runs' mean scores
against its standard error (from every episode's score in scores.jsonl). The load average before and
after goes with the figures: the machine is shared.

    OMP_NUM_THREADS=1 VLLM_CPU_KVCACHE_SPACE=1 python benchmarks/overlap.py            # appends to RESULTS.md
    python benchmarks/overlap.py --steps 4 --results -                                  # smoke run, prints

Left out: GPUs (the same script runs there with `--model` a hub id and without taskset cores that do
not exist), and more than one seed (one pair of runs takes most of half an hour here).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from aitrain_grpo.engine.backends.vllm_server import VLLMServerClient  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pinned(core: str | None, command: list[str]) -> list[str]:
    return ["taskset", "-c", core, *command] if core else command


def start_server(model: str, core: str | None, log: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    env = dict(os.environ, OMP_NUM_THREADS="1", VLLM_CPU_KVCACHE_SPACE=os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"))
    with open(log, "wb") as sink:
        process = subprocess.Popen(
            pinned(core, [sys.executable, "-m", "aitrain_grpo", "vllm-serve", "--model", model, "--port", str(port),
                          "--enable-lora", "--enforce-eager"]),
            stdout=sink, stderr=subprocess.STDOUT, env=env, cwd=str(REPO),
        )
    url = f"http://127.0.0.1:{port}"
    client = VLLMServerClient(url, retries=0)
    deadline = time.monotonic() + 600
    while not client.is_healthy():
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            raise SystemExit(f"vllm-serve did not come up:\n{log.read_text()[-3000:]}")
        time.sleep(2)
    return process, url


def train_run(args, url: str, async_steps: int, out: Path) -> dict:
    command = [
        sys.executable, "-m", "aitrain_grpo", "grpo", "--model", args.model,
        "--rl-env-module", args.env_module, "--rl-env-class", args.env_class, "--rl-env-config", args.env_config,
        "--max-steps", str(args.steps), "--batch-size", "8", "--rl-num-generations", "4",
        "--rl-max-new-tokens", str(args.max_new_tokens), "--lr", "5e-4", "--rl-kl-coef", "0",
        "--rl-temperature", "1.0", "--rl-top-k", "0", "--seed", str(args.seed),
        "--use-vllm", "--vllm-mode", "server", "--vllm-server-url", url, "--vllm-sync", "lora",
        "--rl-async-steps", str(async_steps), "--output-dir", str(out), "--overwrite",
    ]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    started = time.perf_counter()
    result = subprocess.run(pinned(args.trainer_core, command), cwd=str(REPO), env=env, capture_output=True, text=True)
    wall = time.perf_counter() - started
    if result.returncode != 0:
        raise SystemExit(f"training with --rl-async-steps {async_steps} failed:\n{result.stderr[-3000:]}")
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    scores = [json.loads(line)["scores"] for line in (out / "scores.jsonl").read_text().splitlines()]
    summary = json.loads((out / "run_summary.json").read_text())
    return {"records": records, "scores": scores, "process_wall": wall, "train_seconds": summary["runtime_seconds"]}


def mean(values: list[float]) -> float:
    values = [v for v in values if v is not None and not math.isnan(v)]
    return sum(values) / len(values) if values else float("nan")


def figures(run: dict) -> dict:
    later = [r for r in run["records"] if r["step"] >= 2]
    flat_scores = [s for step in run["scores"] for s in step]
    return {
        "step_s": mean([r.get("time/step_s") for r in later]),
        "rollout_s": mean([r.get("time/rollout_s") for r in later]),
        # The step outside the rollout (was `time/optimizer_s`, now split into phases: step/phases.py).
        "optimizer_s": mean([r["time/step_s"] - r["time/rollout_s"] for r in later if "time/step_s" in r]),
        "wait_s": mean([r.get("async/wait_seconds") for r in later]),
        "staleness": mean([r.get("async/staleness_mean") for r in later]),
        "is_ratio": mean([r.get("sampling/importance_sampling_ratio/mean") for r in run["records"]]),
        "is_masked": mean([r.get("sampling/is_masked_frac") for r in run["records"]]),
        "train_seconds": run["train_seconds"],
        "score_mean": mean(flat_scores),
        "score_var": mean([(s - mean(flat_scores)) ** 2 for s in flat_scores]),
        "episodes": len(flat_scores),
        "curve": [round(r.get("env/score_mean", float("nan")), 3) for r in run["records"]],
    }


def load_average() -> str:
    return " / ".join(f"{x:.1f}" for x in os.getloadavg())


def table(args, runs: dict[int, dict], load_before: str, load_after: str) -> str:
    on, off = runs[0], runs[1]
    ratio = off["step_s"] / on["step_s"]
    diff = off["score_mean"] - on["score_mean"]
    stderr = math.sqrt(on["score_var"] / on["episodes"] + off["score_var"] / off["episodes"])
    lines = [
        f"## Overlap: --rl-async-steps 1 vs 0 ({time.strftime('%Y-%m-%d %H:%M', time.gmtime())} UTC)",
        "",
        f"`python benchmarks/overlap.py` ({args.steps} steps, {args.model}, {args.env_module} {args.env_config}, batch 8, group 4, "
        f"{args.max_new_tokens} new tokens a turn, seed {args.seed}; server on core {args.server_core}, trainer on "
        f"core {args.trainer_core}; LoRA sync). CPU figures: no GPU here. Load average (1/5/15 min) before "
        f"{load_before}, after {load_after} (2 cores, shared with other work).",
        "",
        "| --rl-async-steps | s/step (steps 2+) | rollout s | optimizer s | waited for episodes s | staleness | IS ratio | IS-masked tokens | run s | mean score |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for steps_ahead, f in sorted(runs.items()):
        lines.append(
            f"| {steps_ahead} | {f['step_s']:.2f} | {f['rollout_s']:.2f} | {f['optimizer_s']:.2f} | {f['wait_s']:.2f} | "
            f"{f['staleness']:.2f} | {f['is_ratio']:.3f} | {f['is_masked']:.3f} | {f['train_seconds']:.0f} | {f['score_mean']:.3f} |"
        )
    lines += [
        "",
        f"Wall time per step, async / on-policy: **{ratio:.2f}x** (target <= 0.7x, bound 0.5x). "
        f"Mean score difference {diff:+.3f} with standard error {stderr:.3f} "
        f"({'within' if abs(diff) <= 2 * stderr else 'outside'} two standard errors).",
        "",
        f"Score per step, on-policy: {on['curve']}",
        f"Score per step, async 1:   {off['curve']}",
        "",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--max-new-tokens", type=int, default=24)
    parser.add_argument("--env-module", default="envs.letters")
    parser.add_argument("--env-class", default="LetterEnv")
    parser.add_argument("--env-config", default='{"letter": "a", "turns": 2}')
    parser.add_argument("--variants", default="0,1", help="--rl-async-steps values to run, in order")
    parser.add_argument("--server-core", default="0")
    parser.add_argument("--trainer-core", default="1")
    parser.add_argument("--work-dir", default="/tmp/aitrain-overlap")
    parser.add_argument("--results", default=str(REPO / "benchmarks" / "RESULTS.md"), help="file to append to, or - to print")
    args = parser.parse_args()
    work = Path(args.work_dir)
    work.mkdir(parents=True, exist_ok=True)
    load_before = load_average()
    server, url = start_server(args.model, args.server_core, work / "server.log")
    runs: dict[int, dict] = {}
    try:
        for steps_ahead in [int(v) for v in args.variants.split(",")]:
            runs[steps_ahead] = figures(train_run(args, url, steps_ahead, work / f"async{steps_ahead}"))
            print(f"--rl-async-steps {steps_ahead}: {runs[steps_ahead]}", flush=True)
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(timeout=120)
        except subprocess.TimeoutExpired:
            server.kill()
    if not {0, 1} <= set(runs):
        return
    text = table(args, runs, load_before, load_average())
    if args.results == "-":
        print(text)
    else:
        with open(args.results, "a", encoding="utf-8") as results:
            results.write("\n" + text)
        print(text)


if __name__ == "__main__":
    main()
