"""Micro-batches (`--micro-batch-size`): a step's episodes trained in pieces give the step one pass gives,
and each step's peak memory reaches the progress line and metrics.jsonl.

The equivalence runs one real GRPO step (tiny model, TRL's trainer) twice from the same seed: once with
the whole batch in one forward/backward pass, once in micro-batches of 2. Same seed, same episodes
(the rollout plays the whole step at once either way), so the reward, the loss and the gradient norm
before clipping must agree to float tolerance. LoRA dropout is off: its random masks are drawn per pass.
"""

from __future__ import annotations

import json

import pytest

from aitrain_grpo import RunConfig, train
from aitrain_grpo.errors import ConfigError
from aitrain_grpo.runlog.progress import metrics_line
from aitrain_grpo.training.step.micro_batches import micro_batch_size, trim_padding, trl_batch_arguments


def one_step(model: str, output_dir, micro: int, new_tokens: int = 12) -> dict:
    config = RunConfig(
        model=model, output_dir=str(output_dir), rl_env_module="envs.letters", rl_env_class="LetterEnv",
        rl_env_config={"letter": "a", "turns": 2}, max_steps=1, batch_size=8, rl_num_generations=4,
        micro_batch_size=micro, rl_max_new_tokens=new_tokens, lr=1e-3, lora_dropout=0.0, seed=3, rl_cut_turn="end",
        use_vllm=False,  # the test is of micro-batches; the engine stays the same on every machine
    )
    train(config)
    return json.loads((output_dir / "metrics.jsonl").read_text().splitlines()[0])


@pytest.mark.integration
def test_micro_batches_give_the_gradient_of_one_pass(tiny_model_dir, tmp_path):
    whole = one_step(tiny_model_dir, tmp_path / "whole", micro=8)
    pieces = one_step(tiny_model_dir, tmp_path / "pieces", micro=2)
    assert whole["reward"] == pytest.approx(pieces["reward"], abs=1e-6), "the two runs played different episodes"
    assert whole["grad_norm"] > 0
    assert pieces["grad_norm"] == pytest.approx(whole["grad_norm"], rel=1e-3)
    assert pieces["loss"] == pytest.approx(whole["loss"], rel=1e-3, abs=1e-6)
    for record in (whole, pieces):
        assert 0 < record["memory/peak_rss_gb"] < 24
        # The step's peak is its largest phase's: rollout, loss (forward and backward), optimizer.
        phases = [record[f"memory/{phase}_peak_rss_gb"] for phase in ("rollout", "loss", "optimizer")]
        assert record["memory/peak_rss_gb"] == pytest.approx(max(phases))


@pytest.mark.slow
def test_micro_batches_give_the_gradient_of_one_pass_on_smollm2(smollm2_model_dir, tmp_path):
    """The same on a real model (vocabulary 49,152, 30 layers), where rounding differs more between a
    pass of 8 and passes of 2: reward equal, loss and gradient norm within 1e-3 relative; and the
    passes of 2 peak lower in the loss phase. Turns of 96 tokens: TRL's LM head scores only the
    completion positions (training/trl/lm_head.py), so with the 12-token turns above a pass's activations
    are too small beside the model to show in the process's peak."""
    whole = one_step(smollm2_model_dir, tmp_path / "whole", micro=8, new_tokens=96)
    pieces = one_step(smollm2_model_dir, tmp_path / "pieces", micro=2, new_tokens=96)
    assert whole["reward"] == pytest.approx(pieces["reward"], abs=1e-6), "the two runs played different episodes"
    assert pieces["grad_norm"] == pytest.approx(whole["grad_norm"], rel=1e-3)
    assert pieces["loss"] == pytest.approx(whole["loss"], rel=1e-3, abs=1e-6)
    assert pieces["memory/loss_peak_rss_gb"] < whole["memory/loss_peak_rss_gb"]


def test_trl_gets_the_micro_batch_and_keeps_the_step_size():
    # 16 episodes a step in passes of 4: TRL accumulates 4 micro-batches into one optimizer step.
    assert trl_batch_arguments(16, 4, 1) == {"per_device_train_batch_size": 4, "gradient_accumulation_steps": 4}
    assert trl_batch_arguments(16, None, 2)["gradient_accumulation_steps"] == 2 * 16 // micro_batch_size(16, None)
    assert micro_batch_size(6, None) == 2 and micro_batch_size(9, None) == 1  # the default divides the batch
    assert micro_batch_size(8, 32) == 8  # larger than the step: the step
    with pytest.raises(ConfigError, match="--batch-size 12 is not a multiple of --micro-batch-size 5"):
        micro_batch_size(12, 5)


def test_trim_padding_cuts_only_columns_no_row_uses():
    import torch

    mask = torch.tensor([[1, 1, 0, 0, 0], [1, 0, 0, 0, 0]])
    inputs = {
        "completion_ids": torch.arange(10).view(2, 5), "completion_mask": mask,
        "old_per_token_logps": torch.zeros(2, 5), "advantages": torch.ones(2),
        "prompt_ids": torch.ones(2, 5, dtype=torch.long),  # as wide as the completion, but a prompt
    }
    out = trim_padding(inputs)
    assert out["completion_ids"].tolist() == [[0, 1], [5, 6]]
    assert out["old_per_token_logps"].shape == (2, 2) and out["advantages"].shape == (2,)
    assert out["prompt_ids"].shape == (2, 5)


def test_the_progress_line_says_the_steps_peak_memory():
    line = metrics_line(3, 10, {"reward": 0.5, "memory/peak_rss_gb": 3.14}, elapsed=30.0, steps_done=3)
    assert "mem 3.1G" in line


def test_a_step_that_may_not_fit_is_warned_about_with_the_flag_to_change():
    from aitrain_grpo.training.preflight.memory_check import memory_warning

    smollm2 = dict(parameters=134_515_008, vocab=49_152, tokens_per_episode=1024, batch_size=8)
    # 8 episodes a pass of up to 1024 tokens measured 18 GB; with 12 GB free the pass must shrink to a
    # divisor of the batch that fits (6 would fit, 4 divides 8).
    warning = memory_warning(**smollm2, micro_batch=8, available=12 * 2**30)
    assert warning.startswith("warning: a step may need up to 14.5 GB") and "lower --micro-batch-size to 4" in warning
    assert memory_warning(**smollm2, micro_batch=2, available=12 * 2**30) is None
    one = memory_warning(**smollm2, micro_batch=1, available=2 * 2**30)
    assert "lower --rl-max-completion-length" in one
    assert memory_warning(**smollm2, micro_batch=8, available=None) is None  # not Linux: no guess


def test_dropping_flat_groups_trains_the_step_in_one_pass():
    """drop/refill promise the informative groups the full step; TRL normalises each micro-batch alone,
    so those runs keep one pass (test_zero_std_groups.py checks the doubled gradient) and refuse less."""
    assert trl_batch_arguments(8, None, 1, whole_step=True) == {"per_device_train_batch_size": 8,
                                                               "gradient_accumulation_steps": 1}
    with pytest.raises(ConfigError, match="--micro-batch-size 2 with --rl-zero-std-groups drop or refill"):
        micro_batch_size(8, 2, whole_step=True)


@pytest.mark.integration
def test_a_large_step_trains_in_the_memory_of_its_rollout(tiny_model_dir, tmp_path):
    """The regression guard of issue 18, on the tiny model: 64 episodes in passes of 2 must not raise the
    step's memory more than 25 % above what the rollout already held (measured: 0.97x; the same step in
    one pass: 1.62x). A ratio within one run, so it holds on any machine."""
    train(RunConfig(
        model=tiny_model_dir, output_dir=str(tmp_path / "run"), rl_env_module="envs.letters", rl_env_class="LetterEnv",
        rl_env_config={"letter": "a", "turns": 3}, max_steps=1, batch_size=64, rl_num_generations=4,
        micro_batch_size=2, rl_max_new_tokens=96, rl_max_completion_length=300, lr=1e-3, seed=3,
    ))
    record = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[0])
    assert record["num_tokens"] > 3000  # enough tokens that one pass would stand out
    assert record["memory/loss_peak_rss_gb"] <= 1.25 * record["memory/rollout_peak_rss_gb"], record
