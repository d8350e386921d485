"""Rollout benchmark: the engine's overhead, batching, latency hiding, throughput per backend, and one
GRPO training step against TRL's own tool loop, all measured side by side in one process and one run.

    OMP_NUM_THREADS=1 VLLM_CPU_KVCACHE_SPACE=1 python benchmarks/rollout.py [--quick] [--label NAME]

prints a table and appends it, with the machine, the versions, the load average and the command, to
benchmarks/RESULTS.md. Every figure is a ratio or a rate from variants run in turn (A, B, A, B, ...)
after a warm-up; the reported value is the median over the repetitions.

Workloads (benchmarks/workloads.py): A, 64 episodes x 4 model turns x 32 new tokens with ~20-token
environment replies; B, the same with every `step` sleeping 50 ms (sync and async); C, a tool-calling
environment run by aitrain-grpo and by TRL's `GRPOTrainer(environment_factory=...)` (trl_step.py).
Figures:
1. overhead = (rollout wall time - time inside the backend's generate calls) / rollout wall time (A);
2. speed-up of the batched engine over playing the same episodes one at a time, same backend (A);
3. one full training step of aitrain-grpo / one of TRL's environment_factory (C);
4. latency hiding = environment wall time per turn / 50 ms (B, sync and async);
5. sampled tokens per second of the hf backend, of hf without its key-value cache carried across
   turns, and of the vLLM colocate and vLLM server backends where vLLM is installed (`--skip-vllm`
   leaves them out), on A (all lockstep, as before continuous rollouts, so the rows stay comparable);
6. the peak resident memory of `aitrain grpo` on HotelEnv with the tiny model, 5 steps;
7. continuous / lockstep episodes per second on the straggler workload S (one episode in eight plays
   four times the turns, environment latency 0-100 ms), on the vLLM server and on colocated vLLM, with
   the engine's default bound on episodes in play (all 64 at once), and with 16 in play (lockstep:
   waves of 16);
8. the hf backend's first-turn prefill time (a generate call for one new token) with each GRPO
   group's prompt prefilled once, against every row prefilled, on P (8 prompts x 8 generations).

Left out: GPUs (the figures are for this CPU machine and the tiny model; the table says so) and any
pass/fail exit status: the table says which targets were met.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")  # before torch: two threads on two cores are 10x slower
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

import argparse
import importlib.util
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))

import torch  # noqa: E402

torch.set_num_threads(1)

import results_table  # noqa: E402
import workloads as W  # noqa: E402
from aitrain_grpo.engine.backends.base import SamplingParams  # noqa: E402
from aitrain_grpo.engine.rollout import RolloutEngine  # noqa: E402
from aitrain_grpo.engine.settings import EpisodeSettings  # noqa: E402

LATENCY = 0.05
SAMPLING = SamplingParams(temperature=1.0, top_k=0, top_p=1.0)


def interleaved(variants: dict[str, Callable[[list], dict]], rows: list, reps: int, warmup_rows: int) -> dict[str, list[dict]]:
    """Run every variant once per repetition, in turn; the warm-up pass (a few rows) is discarded."""
    for run in variants.values():
        run(rows[:warmup_rows])
    results: dict[str, list[dict]] = {name: [] for name in variants}
    for _ in range(reps):
        for name, run in variants.items():
            results[name].append(run(rows))
    return results


def check_work(batch, turns: int = W.TURNS) -> None:
    """Every episode must have done the full workload, or the figures compare different work."""
    for ep in batch.episodes:
        if ep.error or ep.truncated or ep.turns != turns:
            raise RuntimeError(f"an episode did not play its {turns} turns: turns={ep.turns} error={ep.error} truncated={ep.truncated}")


SLOTS = 16  # episodes in play at once on workload S


def make_engine(env, tokenizer, backend, schedule: str = "lockstep", slots: int = 256) -> RolloutEngine:
    # 256 in play: the engine's default, so every episode of a 64-episode rollout starts at once.
    return RolloutEngine(env, tokenizer, backend, EpisodeSettings(
        max_new_tokens=W.NEW_TOKENS, max_completion_length=1024, sampling=SAMPLING, env_timeout=60.0, schedule=schedule,
        max_concurrent_episodes=slots))


def timed_env_phases(engine: RolloutEngine) -> list[float]:
    """Record the wall time of each environment phase of the engine (reset, each turn, score)."""
    phases: list[float] = []
    gather = engine.runner.gather

    def timed(coroutines):
        started = time.perf_counter()
        try:
            return gather(coroutines)
        finally:
            phases.append(time.perf_counter() - started)

    engine.runner.gather = timed
    return phases


def batched_run(engine: RolloutEngine, backend: W.FullLengthTurns) -> Callable[[list], dict]:
    phases = timed_env_phases(engine)

    def run(rows: list) -> dict:
        before = backend.sampled_tokens
        phases.clear()
        batch = engine.run(rows)
        check_work(batch)
        turn_phases = phases[1:-1]  # the first is reset, the last score_episode
        return {"wall": batch.wall_seconds, "generate": batch.generate_seconds, "env": batch.env_seconds,
                "env_per_turn": sum(turn_phases) / len(turn_phases), "tokens": backend.sampled_tokens - before}
    return run


def sequential_run(engine: RolloutEngine, backend: W.FullLengthTurns) -> Callable[[list], dict]:
    def run(rows: list) -> dict:
        before, started, generate = backend.sampled_tokens, time.perf_counter(), 0.0
        for row in rows:
            batch = engine.run([row])
            check_work(batch)
            generate += batch.generate_seconds
        return {"wall": time.perf_counter() - started, "generate": generate, "tokens": backend.sampled_tokens - before}
    return run


def overhead(run: dict) -> float:
    return (run["wall"] - run["generate"]) / run["wall"]


# ------------------------------------------------------------------------------------ measurements


def measure_memory(steps: int = 5) -> dict:
    """Peak RSS of `aitrain grpo` on HotelEnv (tiny model), read from the kernel's child accounting in a
    wrapper process, so nothing else this benchmark runs is counted."""
    with tempfile.TemporaryDirectory(prefix="aitrain-bench-") as out:
        command = [sys.executable, "-m", "aitrain_grpo", "grpo", "--rl-env-module", "envs.hotel",
                   "--rl-env-class", "HotelEnv", "--max-steps", str(steps), "--output-dir", out, "--overwrite"]
        wrapper = ("import resource, subprocess, sys; r = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL); "
                   "print(r.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)")
        done = subprocess.run([sys.executable, "-c", wrapper, *command], cwd=REPO, capture_output=True, text=True, check=True)
    code, rss_kib = (int(x) for x in done.stdout.split()[-2:])
    if code != 0:
        raise RuntimeError(f"the hotel run failed with exit code {code}: {done.stderr[-500:]}")
    return {"peak_rss_mib": rss_kib / 1024, "command": "aitrain " + " ".join(command[3:-3])}


def measure_rollouts(model, tokenizer, episodes: int, reps: int) -> dict:
    """Figures 1, 2 (workload A) and 4 (workload B) with the hf backend."""
    backend = W.FullLengthTurns(W.HFNoStop.for_model(model, tokenizer), tokenizer.eos_token_id)
    engine_a = make_engine(W.ChatterEnv(episodes), tokenizer, backend)
    rows = engine_a.env.build_dataset(tokenizer)
    ab = interleaved({"batched": batched_run(engine_a, backend), "sequential": sequential_run(engine_a, backend)},
                     rows, reps, warmup_rows=8)
    engines_b = {
        "sync": make_engine(W.ChatterEnv(episodes, latency=LATENCY), tokenizer, backend),
        "async": make_engine(W.AsyncChatterEnv(episodes, latency=LATENCY), tokenizer, backend),
    }
    b = interleaved({name: batched_run(engine, backend) for name, engine in engines_b.items()}, rows, reps, warmup_rows=8)
    for engine in (engine_a, *engines_b.values()):
        engine.close()
    return {
        "A": ab,
        "overhead": [overhead(r) for r in ab["batched"]],
        "speedup": [s["wall"] / r["wall"] for r, s in zip(ab["batched"], ab["sequential"])],
        "B": b,
        "hiding": {name: [r["env_per_turn"] / LATENCY for r in runs] for name, runs in b.items()},
    }


def straggler_run(engine: RolloutEngine, engine_steps: Callable[[], float] | None = None) -> Callable[[list], dict]:
    def run(rows: list) -> dict:
        steps_before = engine_steps() if engine_steps else None
        batch = engine.run(rows)
        for ep in batch.episodes:
            if ep.error or ep.truncated or ep.turns != W.StragglerEnv.turns(ep.row["task"]):
                raise RuntimeError(f"a straggler-workload episode did not play its turns: {ep.turns} {ep.error}")
        out = {"wall": batch.wall_seconds, "episodes_per_s": len(rows) / batch.wall_seconds,
               "requests": batch.generate_calls}
        if engine_steps:
            out["engine_steps"] = engine_steps() - steps_before
        return out
    return run


def server_engine_steps(url: str) -> Callable[[], float]:
    """The vLLM server's count of engine steps so far (its `iteration_tokens_total` histogram)."""
    import re
    import urllib.request

    def count() -> float:
        text = urllib.request.urlopen(f"{url}/metrics", timeout=30).read().decode()
        return sum(float(v) for v in re.findall(r"^vllm:iteration_tokens_total_count\{[^}]*\} (\S+)", text, re.M))
    return count


def measure_stragglers(tokenizer, backends: dict[str, Any], episodes: int, reps: int,
                       engine_steps: dict[str, Callable[[], float]] | None = None) -> dict:
    """Figure 7: continuous vs lockstep on workload S, per vLLM backend, variants in turn (and, where
    `engine_steps` can count them, the engine steps each rollout took)."""
    out = {}
    for name, backend in backends.items():
        steps = (engine_steps or {}).get(name)
        engines = {
            "continuous": make_engine(W.StragglerEnv(episodes), tokenizer, backend, "continuous"),
            "lockstep": make_engine(W.StragglerEnv(episodes), tokenizer, backend, "lockstep"),
            f"continuous, {SLOTS} in play": make_engine(W.StragglerEnv(episodes), tokenizer, backend, "continuous", SLOTS),
            f"lockstep, waves of {SLOTS}": make_engine(W.StragglerEnv(episodes), tokenizer, backend, "lockstep", SLOTS),
        }
        rows = engines["continuous"].env.build_dataset(tokenizer)
        out[name] = interleaved({variant: straggler_run(engine, steps) for variant, engine in engines.items()}, rows, reps, warmup_rows=SLOTS)
        for engine in engines.values():
            engine.close()
    return out


def measure_group_prefill(model, tokenizer, prompts: int, reps: int) -> dict:
    """Figure 8: the first turn's prefill on P (`generate` for one new token), each group's prompt
    prefilled once against every row prefilled, in turn."""
    from aitrain_grpo.engine.backends.hf import HFBackend
    from aitrain_grpo.engine.chat import ChatRenderer

    rows = W.group_rows(prompts)
    prompt_ids = ChatRenderer(tokenizer).prompt_ids_many([row["prompt"] for row in rows])
    backends = {"shared": HFBackend.for_model(model, tokenizer), "per row": HFBackend.for_model(model, tokenizer)}
    backends["per row"].share_group_prompts = False

    def timed(backend):
        def run(ids: list) -> dict:
            started = time.perf_counter()
            with backend.rollout_session():
                backend.generate(ids, 1, SAMPLING)
            return {"prefill": time.perf_counter() - started}
        return run

    runs = interleaved({name: timed(backend) for name, backend in backends.items()}, prompt_ids, reps, warmup_rows=W.GROUP_SIZE)
    assert backends["shared"].shared_prefills > 0 and backends["per row"].shared_prefills == 0
    return {"runs": runs, "rows": len(rows), "prompt_tokens": sum(map(len, prompt_ids)) / len(prompt_ids)}


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def build_colocated_llm(model_path: str):
    """An in-process vLLM engine set up the way TRL's colocate mode builds its own."""
    from vllm import LLM

    os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1")
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(free_port()))
    return LLM(model=model_path, enforce_eager=True, gpu_memory_utilization=0.3, max_num_batched_tokens=4096,
               logprobs_mode="processed_logprobs", seed=0, distributed_executor_backend="external_launcher")


def measure_backends(model, tokenizer, model_path: str, episodes: int, reps: int, use_vllm: bool, log_dir: Path) -> dict:
    """Figure 5: the same batched workload A on every backend, in turn."""
    eos = tokenizer.eos_token_id
    backends: dict[str, Any] = {
        "hf": W.FullLengthTurns(W.HFNoStop.for_model(model, tokenizer), eos),
        # The same backend without its key-value cache carried across turns: what that reuse buys.
        "hf, fresh prefill each turn": W.FullLengthTurns(W.HFNoStop.for_model(model, tokenizer), eos, sessions=False),
    }
    server = None
    engine_steps: dict[str, Callable[[], float]] = {}
    notes = []
    if use_vllm:
        from aitrain_grpo.engine.backends.vllm_server import VLLMServerBackend
        from aitrain_grpo.commands.vllm_serve import ServeOptions, start_server, stop_server, wait_until_ready

        # The server starts in its own process while the colocated engine is built here.
        server, url = start_server(ServeOptions(model=model_path, port=free_port(), enforce_eager=True),
                                   log_path=log_dir / "vllm-server.log")
        try:
            llm = build_colocated_llm(model_path)
            backends["vllm-colocate"] = W.FullLengthRequests(W.colocate_no_stop_class()(llm, [eos]), eos)
            wait_until_ready(server, url, timeout=400)
            client = W.server_no_stop_client(url)
            backends["vllm-server"] = W.FullLengthRequests(VLLMServerBackend(client, model_path, [eos]), eos)
            engine_steps["vllm-server"] = server_engine_steps(url)
        except Exception:
            stop_server(server)
            raise
        notes.append("vLLM: enforce_eager (compiled graphs start slower and were not faster here), "
                     "colocate built as TRL builds it (external_launcher, in this process), server via `aitrain vllm-serve`")
    try:
        engines = {name: make_engine(W.ChatterEnv(episodes), tokenizer, backend) for name, backend in backends.items()}
        rows = engines["hf"].env.build_dataset(tokenizer)
        runs = interleaved({name: batched_run(engines[name], backends[name]) for name in engines}, rows, reps, warmup_rows=8)
        for engine in engines.values():
            engine.close()
        vllm_backends = {name: backends[name] for name in ("vllm-server", "vllm-colocate") if name in backends}
        if vllm_backends:
            print(f"workload S: continuous vs lockstep on {', '.join(vllm_backends)} ...", flush=True)
        stragglers = measure_stragglers(tokenizer, vllm_backends, episodes, reps, engine_steps)
    finally:
        if server is not None:
            stop_server(server)
    return {"runs": runs, "notes": notes, "stragglers": stragglers}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="16 episodes and 3 repetitions: a smoke run, not a result")
    parser.add_argument("--reps", type=int, default=None, help="repetitions after the warm-up (default 5; 3 with --quick)")
    parser.add_argument("--label", default="", help="a name for this run in RESULTS.md (e.g. 'before tuning')")
    parser.add_argument("--skip-vllm", action="store_true", help="leave out the vLLM backends")
    parser.add_argument("--skip-trl", action="store_true", help="leave out the training-step comparison with TRL")
    parser.add_argument("--skip-memory", action="store_true", help="leave out the peak-memory run")
    parser.add_argument("--results", default=str(HERE / "RESULTS.md"), help="file to append to ('-' for none)")
    args = parser.parse_args(argv)
    episodes = 16 if args.quick else 64
    reps = args.reps or (3 if args.quick else 5)
    use_vllm = not args.skip_vllm and importlib.util.find_spec("vllm") is not None

    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    from aitrain_grpo.models.tiny import tiny_model_path

    hf_logging.disable_progress_bar()
    started, load_before = time.time(), os.getloadavg()
    model_path = str(tiny_model_path())
    results: dict[str, Any] = {"episodes": episodes, "reps": reps, "vllm_installed": importlib.util.find_spec("vllm") is not None}
    if not args.skip_memory:
        print("memory: aitrain grpo on HotelEnv, 5 steps ...", flush=True)
        results["memory"] = measure_memory()
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    model = AutoModelForCausalLM.from_pretrained(model_path).eval()
    print(f"workloads A and B: {episodes} episodes, {reps} repetitions ...", flush=True)
    results["rollouts"] = measure_rollouts(model, tokenizer, episodes, reps)
    if not args.skip_trl:
        import trl_step

        print("workload C: one training step, aitrain-grpo vs TRL environment_factory ...", flush=True)
        results["trl"] = trl_step.compare(model_path, episodes=episodes, reps=reps)
    print("workload P: hf group prefill ...", flush=True)
    results["group_prefill"] = measure_group_prefill(model, tokenizer, prompts=max(2, episodes // W.GROUP_SIZE), reps=reps)
    print("backends ...", flush=True)
    with tempfile.TemporaryDirectory(prefix="aitrain-bench-") as log_dir:
        results["backends"] = measure_backends(model, tokenizer, model_path, episodes, reps, use_vllm, Path(log_dir))
    results["straggler_slots"] = SLOTS
    results["straggler_bound"] = W.straggler_wait_bound(episodes)
    results["minutes"] = (time.time() - started) / 60
    results["load"] = (load_before, os.getloadavg())
    text = results_table.render(results, label=args.label, command=results_table.command_line(sys.argv))
    print(text)
    if args.results != "-":
        with open(args.results, "a") as fh:
            fh.write("\n" + text)
        print(f"appended to {args.results}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
