"""The optimizer, activation checkpointing and LoRA's variants as options (TRL's, axolotl's and peft's
names): `--optim` with Adam's constants, `--activation-checkpointing`, `--use-rslora`, `--use-dora` and
`--lora-modules-to-save`. What a user sees: the optimizer asked for is the one whose state the checkpoint
holds; checkpointing recomputes the layers and trains the same step; the adapter saved is the variant
asked for, trains, and evaluates; an optimizer whose package is missing, or a module the model does not
have, is refused in one line before anything is written."""

from __future__ import annotations

import importlib.util
import json

import pytest
import torch

from aitrain_grpo.config import RunConfig
from aitrain_grpo.errors import ConfigError
from aitrain_grpo.option_effects import unused_option_notes
from aitrain_grpo.training.rollout.weight_sync import choose_sync_method
from aitrain_grpo.training.trainer import train
from envs.letters import LetterEnv
from helpers import REPO
from helpers.cli import refused

LETTERS = ["--rl-env-module", "envs.letters", "--rl-env-class", "LetterEnv"]
ONE_STEP = dict(rl_env_module="envs.letters", rl_env_class="LetterEnv", max_steps=1, lr=3e-2, seed=1,
                rl_max_new_tokens=8, use_vllm=False)


def one_step(out, **options) -> dict:
    train(RunConfig(**ONE_STEP, output_dir=str(out), **options), env=LetterEnv(turns=1, num_tasks=8))
    return json.loads((out / "metrics.jsonl").read_text().splitlines()[0])


# ----------------------------------------------------------------------------- refused or noted early


def test_an_unknown_optimizer_or_one_whose_package_is_missing_is_refused_before_anything_loads(tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)
    refused(["grpo", *LETTERS, "--output-dir", str(tmp_path / "run"), "--optim", "adamw_fast"], tmp_path,
            "--optim 'adamw_fast' is not an optimizer transformers knows", "adamw_torch_fused", "sgd")
    if importlib.util.find_spec("bitsandbytes") is None:  # not in README's install
        refused(["grpo", *LETTERS, "--output-dir", str(tmp_path / "run"), "--optim", "adamw_8bit"], tmp_path,
                "--optim adamw_8bit cannot be built here", "pip install -U bitsandbytes")
    else:
        RunConfig(rl_env_module="envs.letters", rl_env_class="LetterEnv", optim="adamw_8bit").validate()


def test_a_peers_config_keys_for_these_options_are_answered_with_ours(tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)
    config = tmp_path / "axolotl.yaml"
    config.write_text("rl-env-module: envs.letters\nrl-env-class: LetterEnv\ngradient_checkpointing: true\n"
                      "optimizer: adamw_torch\npeft_use_dora: true\n")
    refused(["grpo", "--config", str(config)], tmp_path, "unknown option(s): gradient_checkpointing",
            "aitrain's is activation_checkpointing", "optimizer (axolotl's name; aitrain's is optim",
            "peft_use_dora (axolotl's name; aitrain's is use_dora)")


def test_options_that_the_optimizer_or_full_fine_tuning_ignore_get_a_note():
    notes = unused_option_notes(RunConfig(optim="sgd", adam_beta2=0.95, use_dora=True, peft=False), ["keep"])
    assert notes == [
        "note: --adam-beta2 does nothing with --optim sgd, which transformers builds without it; leave it out, or "
        "choose an Adam optimizer (adamw_torch_fused)",
        "note: --use-dora does nothing with --no-peft, which trains every weight and no adapter; leave it out, or "
        "drop --no-peft"]
    assert unused_option_notes(RunConfig(optim="adamw_torch", adam_beta2=0.95, adam_epsilon=1e-6), ["keep"]) == []


def test_an_adapter_vllm_cannot_apply_reaches_it_merged():
    """vLLM applies no DoRA adapter and no module saved in full: `--vllm-sync auto` sends merged weights
    (disk on a CPU, NCCL on CUDA), and `--vllm-sync lora` is refused with the fix."""
    assert choose_sync_method("auto", peft=True, cuda=False, adapter_for_vllm=RunConfig().adapter_for_vllm) == "lora"
    for options in (dict(use_dora=True), dict(lora_modules_to_save="lm_head")):
        config = RunConfig(**options)
        assert choose_sync_method("auto", peft=True, cuda=False, adapter_for_vllm=config.adapter_for_vllm) == "disk"
        assert choose_sync_method("auto", peft=True, cuda=True, adapter_for_vllm=config.adapter_for_vllm) == "nccl"
        with pytest.raises(ConfigError, match="use --vllm-sync disk"):
            RunConfig(rl_env_module="envs.letters", rl_env_class="LetterEnv", vllm_sync="lora", **options).validate()


@pytest.mark.integration
def test_a_module_to_save_the_model_does_not_have_is_refused_before_anything_is_written(tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)
    refused(["grpo", *LETTERS, "--output-dir", str(tmp_path / "run"), "--lora-modules-to-save", "lm_head,score"],
            tmp_path, "--lora-modules-to-save score names no module", "embed_tokens", "lm_head", "norm")


# --------------------------------------------------------------------------------------- training


@pytest.mark.integration
def test_the_optimizer_asked_for_is_the_one_the_checkpoint_holds(tmp_path):
    """The checkpoint's optimizer.pt is what a resumed run continues from: its parameter groups carry the
    optimizer's own constants."""
    one_step(tmp_path / "adam", optim="adamw_torch", adam_beta2=0.95, adam_epsilon=1e-6, save_steps=1)
    adam = torch.load(tmp_path / "adam" / "checkpoint-1" / "optimizer.pt", weights_only=True)["param_groups"][0]
    assert tuple(adam["betas"]) == (0.9, 0.95) and adam["eps"] == 1e-6
    one_step(tmp_path / "sgd", optim="sgd", save_steps=1)
    sgd = torch.load(tmp_path / "sgd" / "checkpoint-1" / "optimizer.pt", weights_only=True)["param_groups"][0]
    assert "momentum" in sgd and "betas" not in sgd


@pytest.mark.integration
def test_activation_checkpointing_recomputes_the_layers_and_trains_the_same_step(tmp_path):
    """Each decoder layer runs again in the backward pass (the memory it saves is the activations it did
    not keep), and the step's loss and gradient are those of the run without it. Counted at the layers'
    MLPs: transformers re-runs a layer's own `forward`, past the module hooks of the layer itself."""
    calls = {}

    def count(module, args):
        if type(module).__name__.endswith("MLP"):
            calls[run] = calls.get(run, 0) + 1

    hook = torch.nn.modules.module.register_module_forward_pre_hook(count)
    try:
        records = {}
        for run, checkpointing in (("kept", False), ("recomputed", True)):
            records[run] = one_step(tmp_path / run, activation_checkpointing=checkpointing)
    finally:
        hook.remove()
    assert calls["recomputed"] - calls["kept"] >= 8  # two layers in each of the four loss passes, again
    assert records["recomputed"]["reward"] == records["kept"]["reward"]  # the same episodes
    assert records["recomputed"]["loss"] == pytest.approx(records["kept"]["loss"], rel=1e-4, abs=1e-6)
    assert records["recomputed"]["grad_norm"] == pytest.approx(records["kept"]["grad_norm"], rel=1e-3)


@pytest.mark.integration
def test_dora_rslora_and_a_module_saved_in_full_train_save_and_evaluate(tmp_path):
    from peft import PeftModel

    from aitrain_grpo.evaluation.evaluate import open_backend
    from aitrain_grpo.models.loading import load_causal_lm, resolve_source

    out = tmp_path / "variants"
    one_step(out, use_dora=True, use_rslora=True, lora_modules_to_save="norm", lora_r=4, lora_alpha=8)
    saved = json.loads((out / "adapter_config.json").read_text())
    assert saved["use_dora"] and saved["use_rslora"] and saved["modules_to_save"] == ["norm"]
    source = resolve_source(str(out))
    base = load_causal_lm(source.weights)
    adapter = PeftModel.from_pretrained(load_causal_lm(source.weights), str(out))
    layer = adapter.base_model.model.model.layers[0].self_attn.q_proj
    assert layer.scaling["default"] == pytest.approx(8 / 4 ** 0.5)  # rsLoRA's alpha/sqrt(r), not alpha/r = 2
    assert any(name.endswith("lora_magnitude_vector.default.weight") for name, _ in adapter.named_parameters())
    # The norm trained in full and reaches evaluation with the merged adapter.
    _, _, merged = open_backend(source)
    assert not torch.equal(merged.model.norm.weight.cpu(), base.model.norm.weight)
    assert torch.equal(merged.model.norm.weight.cpu(), adapter.merge_and_unload().model.norm.weight)


@pytest.mark.integration
def test_sft_takes_the_same_optimizer_and_adapter_options(tmp_path, monkeypatch):
    """`aitrain sft`, the warm start, trains the adapter variant and optimizer the grpo run after it names."""
    from helpers import in_process_cli

    out = tmp_path / "hotel-sft"
    result = in_process_cli(monkeypatch, REPO)(
        "sft", "--rl-env-module", "envs.hotel", "--rl-env-class", "HotelEnv", "--episodes", "4", "--max-steps", "1",
        "--batch-size", "4", "--output-dir", out, "--use-dora", "--optim", "adamw_torch", "--adam-beta2", "0.95")
    assert result.exit_code == 0, result.stdout[-2000:] + result.stderr[-2000:] + repr(result.exception)
    assert json.loads((out / "adapter_config.json").read_text())["use_dora"]
    recorded = json.loads((out / "run_config.json").read_text())
    assert (recorded["optim"], recorded["adam_beta2"], recorded["use_dora"]) == ("adamw_torch", 0.95, True)
