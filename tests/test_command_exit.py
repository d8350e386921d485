"""How `aitrain grpo` ends its process: it waits briefly for its own environment calls, then exits without
the ones stuck for good (tests/faults/test_faults.py plays that case). Here the command runs inside a
longer-lived Python process, as from a notebook or a test, after an earlier run left a pool behind: idle
threads, and a call that timed out and sleeps on. Neither is this command's, so it must return to its
caller instead of ending the process (it did: the caller, a pytest worker, died with it)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from helpers import REPO

SCRIPT = textwrap.dedent(
    """
    import os, sys, time
    from typer.testing import CliRunner
    from aitrain_grpo.commands.cli import app
    from aitrain_grpo.engine.env_threads import EnvCallPool

    earlier_idle = EnvCallPool(4)  # an earlier run's pool, never shut down: idle threads
    earlier_idle.submit(time.sleep, 0).result()
    earlier_stuck = EnvCallPool(1)  # an earlier run's call that timed out and sleeps on
    earlier_stuck.submit(time.sleep, 3600)

    model, out = sys.argv[1], sys.argv[2]
    result = CliRunner().invoke(app, [
        "grpo", "--model", model, "--rl-env-module", "envs.letters", "--rl-env-class", "LetterEnv",
        "--rl-env-config", '{"turns": 1, "num_tasks": 4}', "--batch-size", "4", "--rl-num-generations", "2",
        "--rl-max-new-tokens", "8", "--max-steps", "1", "--output-dir", out,
    ])
    print(result.output)
    print(f"returned to its caller with exit code {result.exit_code}", flush=True)
    os._exit(0)  # the earlier call sleeps for an hour; this check is done
    """
)


def test_grpo_in_a_longer_lived_process_returns_to_its_caller_despite_an_earlier_runs_threads(tmp_path, tiny_model_dir):
    result = subprocess.run([sys.executable, "-c", SCRIPT, tiny_model_dir, str(tmp_path / "run")], cwd=REPO,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "returned to its caller with exit code 0" in result.stdout, (result.stdout[-2000:], result.stderr[-3000:])
    assert "done: 1 steps" in result.stdout
    assert "still running" not in result.stdout + result.stderr  # the earlier run's call is not this run's
