"""Several vLLM servers against one, and how fast a server that returns serves again (issue 23).

    OMP_NUM_THREADS=1 VLLM_CPU_KVCACHE_SPACE=1 python benchmarks/servers.py

1. Throughput at a fixed number of cores: one `aitrain vllm-serve` of the tiny model bound to all the
   cores (`VLLM_CPU_OMP_THREADS_BIND=0-N`) against two servers bound to half of them each, both behind
   the run's `ServerPool`. The workload is the engine's continuous schedule without an environment:
   `--episodes` episodes of `--turns` turns of `--tokens` tokens each, every episode's turns on its own
   server, all episodes in flight at once. Reported: wall seconds and generated tokens per second,
   the median of `--repeats` runs, after one warm-up run.
2. Return to service: one server is SIGKILLed while episodes are in flight; it is started again on its
   port; the pool's wait readmits it (base weights reloaded) and the episodes are replayed. Reported:
   seconds from its /health answering again to its first answered request (the pool's
   `return_to_first_request_s`), and the restart itself (process start to /health), which dominates.

Writes its table to stdout; the recorded results are in SERVERS.md.
Left out: GPUs, a training step around the requests (tests/test_vllm_servers.py runs those), more
servers than cores.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path


REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))  # the tests' helpers start and stop servers the same way

from aitrain_grpo.engine.backends.base import ReplayEpisode, SamplingParams  # noqa: E402
from aitrain_grpo.engine.backends.server_pool import ServerPool, Weights  # noqa: E402
from aitrain_grpo.engine.backends.vllm_server import VLLMServerClient  # noqa: E402
from helpers.vllm import kill_hard, stop  # noqa: E402


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def serve(model: str, cores: str, log: Path, port: int | None = None) -> tuple[subprocess.Popen, str, float]:
    """`aitrain vllm-serve` bound to `cores`, once healthy: (process, url, seconds to healthy)."""
    port = port or free_port()
    env = dict(os.environ, OMP_NUM_THREADS="1", VLLM_CPU_KVCACHE_SPACE="1", VLLM_CPU_OMP_THREADS_BIND=cores)
    started = time.monotonic()
    with open(log, "ab") as sink:
        process = subprocess.Popen([sys.executable, "-m", "aitrain_grpo", "vllm-serve", "--model", model, "--port",
                                    str(port), "--enforce-eager"], stdout=sink, stderr=subprocess.STDOUT, env=env, cwd=REPO)
    url = f"http://127.0.0.1:{port}"
    client = VLLMServerClient(url, retries=0)
    while not client.is_healthy():
        if process.poll() is not None or time.monotonic() - started > 300:
            stop(process)
            raise SystemExit(f"server on {url} did not start; see {log}")
        time.sleep(0.25)
    return process, url, time.monotonic() - started


def play(pool: ServerPool, prompt: list[int], episodes: int, turns: int, tokens: int) -> tuple[float, int]:
    """Every episode's turns, each turn appended to its prompt; returns (seconds, tokens generated)."""
    sampling = SamplingParams(temperature=1.0, top_k=0)
    generated = 0

    async def episode(k: int) -> None:
        nonlocal generated
        while True:
            ids = list(prompt)
            try:
                for _ in range(turns):
                    sample = await pool.generate_one(ids, tokens, sampling, episode=k)
                    ids += sample.token_ids
                    generated += len(sample.token_ids)
                return
            except ReplayEpisode:  # its server was lost: played again from its start, as the engine does
                continue

    async def all_episodes() -> None:
        try:
            await asyncio.wait_for(asyncio.gather(*(episode(k) for k in range(episodes))), 600)
        finally:
            for server in pool.servers:  # the per-turn sessions close on their own loop
                server.client.close_session()
            await asyncio.sleep(0.1)

    started = time.perf_counter()
    with pool.rollout_session():
        asyncio.run(all_episodes())
    return time.perf_counter() - started, generated


def throughput(model: str, prompt: list[int], stop_ids: list[int], binds: list[str], args, folder: Path) -> dict:
    servers = [serve(model, cores, folder / f"server-{i}.log") for i, cores in enumerate(binds)]
    try:
        pool = ServerPool([url for _, url, _ in servers], model, stop_ids)
        play(pool, prompt, args.episodes, args.turns, args.tokens)  # warm-up
        runs = [play(pool, prompt, args.episodes, args.turns, args.tokens) for _ in range(args.repeats)]
        pool.take_metrics()
        pool.close()
    finally:
        for process, _, _ in servers:
            stop(process)
    seconds = statistics.median(s for s, _ in runs)
    tokens = statistics.median(n / s for s, n in runs)
    return {"servers": len(binds), "binds": " + ".join(binds), "seconds": seconds, "tokens_per_s": tokens,
            "all": [round(s, 2) for s, _ in runs]}


def return_to_service(model: str, prompt: list[int], stop_ids: list[int], folder: Path, tries: int) -> list[dict]:
    """Kill the only server with episodes in flight, restart it on its port, time its return."""
    results = []
    process, url, _ = serve(model, "0-1", folder / "return.log")
    try:
        pool = ServerPool([url], model, stop_ids, wait_timeout=300)
        pool.publish(Weights(model), fresh=True)
        for _ in range(tries):
            import threading

            outcome: dict = {}

            def episodes() -> None:
                outcome["seconds"], outcome["tokens"] = play(pool, prompt, 8, 4, 32)

            worker = threading.Thread(target=episodes)
            worker.start()
            time.sleep(1.0)  # episodes in flight
            kill_hard(process)
            process, _, restart = serve(model, "0-1", folder / "return.log", port=int(url.rsplit(":", 1)[1]))
            worker.join()
            taken = pool.take_metrics()
            name = pool.servers[0].name
            results.append({"restart_s": restart, "return_to_first_request_s": taken.get(f"vllm/{name}/return_to_first_request_s")})
        pool.close()
    finally:
        stop(process)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--episodes", type=int, default=64)
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--returns", type=int, default=2, help="kill-and-restart tries")
    parser.add_argument("--skip-throughput", action="store_true", help="only the return-to-service part")
    args = parser.parse_args()
    from transformers import AutoTokenizer

    from aitrain_grpo.models.tiny import tiny_model_path

    model = str(tiny_model_path())
    tokenizer = AutoTokenizer.from_pretrained(model)
    text = tokenizer.apply_chat_template([{"role": "user", "content": "Task 3: write something with many as."}],
                                         tokenize=False, add_generation_prompt=True)
    prompt = tokenizer(text, add_special_tokens=False)["input_ids"]
    stop_ids = [tokenizer.eos_token_id]
    cores = os.cpu_count() or 2
    folder = Path(os.environ.get("TMPDIR", "/tmp")) / f"aitrain-servers-bench-{os.getpid()}"
    folder.mkdir(parents=True, exist_ok=True)
    half = cores // 2
    rows = [] if args.skip_throughput else [
        throughput(model, prompt, stop_ids, [f"0-{cores - 1}"], args, folder),
        throughput(model, prompt, stop_ids, [f"0-{half - 1}" if half > 1 else "0",
                                             f"{half}-{cores - 1}" if cores - half > 1 else str(half)], args, folder)]
    print(f"{args.episodes} episodes x {args.turns} turns x {args.tokens} tokens, {cores} cores, median of {args.repeats}")
    print("| servers | cores bound | wall s | tokens/s | runs (s) |\n| --- | --- | --- | --- | --- |")
    for row in rows:
        print(f"| {row['servers']} | {row['binds']} | {row['seconds']:.2f} | {row['tokens_per_s']:.0f} | {row['all']} |")
    print("\n| try | restart (process start to /health) s | /health to first answered request s |\n| --- | --- | --- |")
    for i, row in enumerate(return_to_service(model, prompt, stop_ids, folder, args.returns), 1):
        first = row["return_to_first_request_s"]
        print(f"| {i} | {row['restart_s']:.1f} | {'-' if first is None else f'{first:.2f}'} |")


if __name__ == "__main__":
    main()
