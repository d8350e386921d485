"""No silent wait (issue 35) between the processes of one run: a process whose peer stalls stops at
`--ddp-timeout` with one line, and one whose peer is gone stops at once with one line; exit 1, no
traceback, the checkpoints already written kept.

Two real training processes on this host, gloo on the CPU, started as torchrun and `accelerate launch`
start their workers (RANK, WORLD_SIZE, MASTER_ADDR, ...: the worker's code path is the same), so that
what is checked is the worker's own output; a launcher adds its own summary of a failed worker below it.
A process whose peer never starts gives up at the bound too, with its own line. After step 1's
checkpoint, process 1 is stopped (SIGSTOP: a hung process, alive but silent): process 0
must give up at the bound. Then process 1 is let go and finds its peer gone: the connection closed (or,
when the collective it was stopped in passed its deadline meanwhile, the bound), one line at once.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from helpers import PORT_CLASH_MARKERS, REPO, free_port

BOUND = 6  # seconds: a few, yet more than a step's legitimate skew between the two processes here
MARGIN = 20  # seconds for the process to end once it gave up (the exit itself, on a loaded machine)


def start_two(model: str, out: Path, port: int, ranks: tuple[int, ...] = (0, 1)) -> list[tuple[subprocess.Popen, Path]]:
    started = []
    for rank in ranks:
        env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", RANK=str(rank), LOCAL_RANK=str(rank),
                   WORLD_SIZE="2", LOCAL_WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        log = out.parent / f"rank{rank}.log"
        with log.open("w") as sink:
            process = subprocess.Popen(
                [sys.executable, "-m", "aitrain_grpo", "grpo", "--model", model, "--rl-env-module", "envs.letters",
                 "--rl-env-class", "LetterEnv", "--max-steps", "50", "--save-steps", "1", "--batch-size", "4",
                 "--rl-max-new-tokens", "8", "--output-dir", str(out), "--ddp-timeout", str(BOUND)],
                cwd=REPO, env=env, stdout=sink, stderr=subprocess.STDOUT)
        started.append((process, log))
    return started


def after_first_checkpoint(model: str, out: Path) -> list[tuple[subprocess.Popen, Path]]:
    """Both processes, once checkpoint-1 is written (again on another port if the one picked was taken)."""
    for attempt in range(3):
        running = start_two(model, out, free_port())
        deadline = time.monotonic() + 300
        while not (out / "checkpoint-1").is_dir() and time.monotonic() < deadline:
            if any(process.poll() is not None for process, _ in running):
                break
            time.sleep(0.2)
        if (out / "checkpoint-1").is_dir() and all(process.poll() is None for process, _ in running):
            return running
        for process, _ in running:
            process.kill()
            process.wait()
        output = "".join(log.read_text() for _, log in running)
        if attempt == 2 or not any(marker in output for marker in PORT_CLASH_MARKERS):
            raise AssertionError(f"the two processes did not reach checkpoint-1:\n{output[-4000:]}")
    raise AssertionError("unreachable")


def one_error_line(log: Path) -> str:
    output = log.read_text()
    assert "Traceback" not in output, output[-4000:]
    errors = [line for line in output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, output[-4000:]
    return errors[0]


def test_a_stalled_process_stops_the_other_at_the_bound_and_a_gone_one_at_once(tiny_model_dir, tmp_path):
    out = tmp_path / "run"
    (first, first_log), (second, second_log) = after_first_checkpoint(tiny_model_dir, out)
    try:
        os.kill(second.pid, signal.SIGSTOP)  # hung: alive, never answering
        stalled = time.monotonic()
        assert first.wait(timeout=BOUND + MARGIN) == 1  # not torch's 30 minutes
        waited = time.monotonic() - stalled
        line = one_error_line(first_log)
        assert line.startswith("error: process 0 of 2 waited 6s for the other processes in a collective "), line
        assert f"--ddp-timeout {BOUND}" in line and "another process likely died or hangs: look at its output" in line
        # The newest checkpoint on disk: checkpoint-1, or a later one when step 2 ended before the stop landed.
        named = re.search(r"(\S*checkpoint-(\d+))\)?;? resume with --resume-from-checkpoint auto$", line)
        assert named and Path(named.group(1)).is_dir(), line
        assert int(named.group(2)) == max(int(path.name.split("-")[1]) for path in out.glob("checkpoint-*")), line

        os.kill(second.pid, signal.SIGCONT)  # it goes on, and finds process 0 gone
        resumed = time.monotonic()
        assert second.wait(timeout=MARGIN) == 1
        gone = one_error_line(second_log)
        # Usually the closed connection; on a loaded machine the collective it was stopped in may have passed
        # its deadline while it was stopped, and it says that instead: either way one line, at once.
        assert gone.startswith(("error: process 1 of 2 lost the other processes in a collective ",
                                "error: process 1 of 2 waited 6s for the other processes in a collective ")), gone
        assert "another process likely died" in gone
    finally:
        for process in (first, second):
            if process.poll() is None:
                os.kill(process.pid, signal.SIGKILL)
                process.wait()
    print(f"gave up {waited:.1f}s after its peer stalled, {time.monotonic() - resumed:.1f}s after the peer was gone")
    checkpoint = out / "checkpoint-1"  # written before, still whole
    assert (checkpoint / "trainer_state.json").is_file() and (checkpoint / "adapter_model.safetensors").is_file()


def test_a_process_whose_peer_never_starts_stops_at_the_bound(tiny_model_dir, tmp_path):
    """Rank 0 of two, alone (its machine's peer failed on its way up): it gave up after 30 minutes before."""
    for _ in range(3):  # again on another port if another program took the one picked meanwhile
        ((process, log),) = start_two(tiny_model_dir, tmp_path / "run", free_port(), ranks=(0,))
        try:
            assert process.wait(timeout=120) == 1, log.read_text()[-4000:]
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
        line = one_error_line(log)
        if "could not open the rendezvous port" not in line:
            break
    assert line.startswith("error: process 0 of 2 waited 6s for the other processes to start and gave up "), line
    assert f"--ddp-timeout {BOUND}" in line and "look at its output" in line


def test_a_rendezvous_port_held_by_another_program_is_named(tiny_model_dir, tmp_path):
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        ((process, log),) = start_two(tiny_model_dir, tmp_path / "run", held.getsockname()[1], ranks=(0,))
        assert process.wait(timeout=120) == 1, log.read_text()[-4000:]
    line = one_error_line(log)
    assert line.startswith("error: process 0 of 2 could not open the rendezvous port 127.0.0.1:"), line
    assert "launch again with another port" in line
