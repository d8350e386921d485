"""benchmarks/gpu_check.py on a CPU: what can be checked without a GPU. It refuses in one line with exit
2, selects parts by name, skips a part whose package is missing (saying which), judges vLLM's
importance-sampling ratio, builds its table and exit status, and (rehearsing on the CPU) runs a real
part end to end into its JSON file. The GPU numbers themselves are recorded in docs/operations.md."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "gpu_check.py"


def load_check():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def run_check(*args: str, env: dict | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})})


@pytest.mark.integration
def test_without_cuda_it_says_so_in_one_line_and_exits_2(tmp_path):
    done = run_check("--json", str(tmp_path / "out.json"), env={"CUDA_VISIBLE_DEVICES": ""})
    assert done.returncode == 2, done.stderr
    assert done.stdout.strip().count("\n") == 0 and "no CUDA device" in done.stdout
    assert not (tmp_path / "out.json").exists()


def test_parts_are_selected_by_name_in_the_checks_order():
    check = load_check()
    assert [p.name for p in check.select_parts("fsdp2,hf-tiny")] == ["hf-tiny", "fsdp2"]
    assert len(check.select_parts(None)) == len(check.PARTS) >= 8
    with pytest.raises(SystemExit, match="unknown part nope; the parts are hf-tiny"):
        check.select_parts("hf-tiny,nope")


def test_a_part_whose_package_is_missing_is_named():
    check = load_check()
    part = check.Part("x", "needs a package", ("pytest", "no_such_package_here"), lambda ctx, name: None)
    assert check.missing_package(part) == "no_such_package_here"
    assert check.missing_package(check.Part("y", "", ("pytest",), lambda ctx, name: None)) is None


def test_importance_sampling_ratio_far_from_one_fails_the_part():
    check = load_check()
    key = "sampling/importance_sampling_ratio/mean"
    near = check.is_ratio_check(check.Result("vllm-colocate", "ok", extra={key: [1.01, 0.98]}))
    far = check.is_ratio_check(check.Result("vllm-colocate", "ok", extra={key: [1.01, 1.4]}))
    missing = check.is_ratio_check(check.Result("vllm-colocate", "ok"))
    assert near.status == "ok"
    assert far.status == "failed" and "out of range" in far.detail
    assert missing.status == "failed" and "no importance_sampling_ratio" in missing.detail


def test_table_and_exit_status_name_what_failed():
    check = load_check()
    results = [check.Result("hf-tiny", "ok", 12.0, 3, 0.5, 0.07),
               check.Result("fsdp2", "failed", 3.0, detail="exit 1: error: FSDP needs CUDA\nmore"),
               check.Result("vllm-colocate", "skipped", detail="vllm is not installed")]
    table = check.render_table(results, "NVIDIA H100")
    rows = {line.split()[0]: line for line in table.splitlines()[2:]}
    assert "0.50" in rows["hf-tiny"] and "0.07" in rows["hf-tiny"]
    assert "FSDP needs CUDA" in rows["fsdp2"] and "more" not in rows["fsdp2"]
    assert "vllm is not installed" in rows["vllm-colocate"]
    assert check.exit_status(results) == (1, "gpu_check: failed: fsdp2")
    assert check.exit_status(results[:1] + results[2:])[0] == 0


@pytest.mark.integration
def test_a_rehearsal_of_the_loss_pass_weights_part_passes_on_the_cpu(tmp_path, tiny_model_dir):
    out = tmp_path / "check.json"
    done = run_check("--rehearse-on-cpu", "--parts", "loss-pass-weights", "--work", str(tmp_path / "work"),
                     "--json", str(out), env={"OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads(out.read_text())["results"][0]
    assert result["part"] == "loss-pass-weights" and result["status"] == "ok", result
    assert "equal TRL's way on cpu" in result["detail"]


@pytest.mark.integration
@pytest.mark.parametrize("part, records", [("hf-tiny", 2), ("hf-tiny-iterations", 1),  # 2 steps, 1 batch trained twice
                                            ("hf-tiny-loss-options", 1), ("hf-tiny-adapter-variants", 2)])
def test_a_rehearsal_on_the_cpu_trains_a_part_and_writes_its_json(tmp_path, tiny_model_dir, part, records):
    out = tmp_path / "check.json"
    done = run_check("--rehearse-on-cpu", "--parts", part, "--steps", "2", "--work", str(tmp_path / "work"),
                     "--json", str(out), env={"OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads(out.read_text())["results"][0]
    assert result["part"] == part and result["status"] == "ok" and result["steps"] == records
    assert result["step_s"] > 0
    assert part in done.stdout and "gpu_check: no part failed" in done.stdout
