"""The shared-prefix loss (training/step/shared_prefix.py) is exact: each distinct prompt forwarded once and its
episodes' continuations on it give the plain path's per-token log-probs, entropies, loss and gradients,
with LoRA and with full fine-tuning, on groups whose prompts differ in length (left padding) and whose
multi-turn completions have environment tokens masked out of the loss. Also: the tiny model moves by
more than the tolerance when a position is off by one (so these comparisons would catch it), a
prompt's episodes are kept in one micro-batch, and a real step trains the same with sharing on."""

from __future__ import annotations

import logging

import pytest
import torch
from trl.trainer.utils import use_adapter

from aitrain_grpo import RunConfig
from aitrain_grpo.training.step.micro_batches import keep_prompts_together
from aitrain_grpo.training.step.shared_prefix import SharedPrefix, saved_share, shared_logps
from aitrain_grpo.training.trainer import build_trainer
from envs.letters import LetterEnv

pytestmark = pytest.mark.integration

ATOL = 1e-5  # float32 log-probs of the same sums in another order differ by ~2e-6 here


def make_trainer(tiny_model_dir, out, *, peft: bool, mode: str = "off", **options):
    options.setdefault("lora_dropout", 0.0)  # both paths deterministic, so comparable
    config = RunConfig(model=tiny_model_dir, output_dir=str(out), rl_env_module="envs.letters",
                       rl_env_class="LetterEnv", peft=peft, max_steps=1, batch_size=8,
                       rl_num_generations=4, rl_kl_coef=0.1, seed=3, shared_prefix_loss=mode, **options)
    trainer = build_trainer(config, LetterEnv(num_tasks=8))
    if peft:  # LoRA's B starts at zero: give the adapter a say, and A a gradient
        generator = torch.Generator().manual_seed(0)
        for name, parameter in trainer.model.named_parameters():
            if "lora_B" in name:
                parameter.data = torch.randn(parameter.shape, generator=generator) * 0.05
    trainer.current_gradient_accumulation_steps = 1  # set by Trainer.train, read by TRL's loss
    return trainer


@pytest.fixture(scope="module")
def lora_trainer(tiny_model_dir, tmp_path_factory):
    return make_trainer(tiny_model_dir, tmp_path_factory.mktemp("lora"), peft=True)


@pytest.fixture(scope="module")
def full_trainer(tiny_model_dir, tmp_path_factory):
    return make_trainer(tiny_model_dir, tmp_path_factory.mktemp("full"), peft=False)


def episode_batch(seed: int = 0, longer: int = 0, unused: int = 0) -> dict[str, torch.Tensor]:
    """Three prompts of 9, 14 and 5 tokens (left-padded to 14) in groups of 4, 3 and 1, shuffled;
    completions of 2-11 tokens (right-padded to 11), each `longer` more, with two environment tokens
    masked from the loss; then `unused` padding columns no row uses (as a chunk of a longer batch has)."""
    g = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(5, 1000, (n,), generator=g) for n in (9, 14, 5)]
    members = [0] * 4 + [1] * 3 + [2]
    width, length = 14, 11 + longer + unused
    prompt_ids = torch.stack([torch.cat([torch.zeros(width - len(prompts[m]), dtype=torch.long), prompts[m]])
                              for m in members])
    prompt_mask = torch.stack([(torch.arange(width) >= width - len(prompts[m])).long() for m in members])
    sizes = torch.tensor([11, 7, 2, 9, 11, 4, 6, 10]) + longer
    completion_mask = (torch.arange(length)[None, :] < sizes[:, None]).long()
    completion_ids = torch.randint(5, 1000, (8, length), generator=g).masked_fill(completion_mask == 0, 0)
    tool_mask = torch.ones_like(completion_mask)
    tool_mask[:, 3:5] = 0  # an environment reply between two turns
    order = torch.randperm(8, generator=g)
    batch = {"prompt_ids": prompt_ids, "prompt_mask": prompt_mask, "completion_ids": completion_ids,
             "completion_mask": completion_mask, "tool_mask": tool_mask,
             "advantages": torch.randn(8, generator=g)}
    batch = {key: value[order] for key, value in batch.items()}
    batch["num_items_in_batch"] = (completion_mask * tool_mask).sum()
    return batch


def joined(batch):
    return (torch.cat([batch["prompt_ids"], batch["completion_ids"]], 1),
            torch.cat([batch["prompt_mask"], batch["completion_mask"]], 1), batch["completion_ids"].size(1))


def logps(trainer, mode: str, batch, chunk: int | None = None):
    trainer.run.shared_prefix = SharedPrefix(mode)
    ids, mask, keep = joined(batch)
    with torch.no_grad():
        got, entropy, _ = trainer._get_per_token_logps_and_entropies(trainer.model, ids, mask, keep, batch_size=chunk,
                                                                     compute_entropy=True)
    return got, entropy, trainer.run.shared_prefix


def loss_and_grads(trainer, mode: str | SharedPrefix, batch):
    trainer.run.shared_prefix = mode if isinstance(mode, SharedPrefix) else SharedPrefix(mode)
    trainer.model.train()
    trainer.model.zero_grad(set_to_none=True)
    loss = trainer._compute_loss(trainer.model, dict(batch))
    loss.backward()
    grads = {name: p.grad.detach().clone() for name, p in trainer.model.named_parameters() if p.grad is not None}
    trainer.model.zero_grad(set_to_none=True)
    return loss.detach(), grads, trainer.run.shared_prefix


@pytest.mark.parametrize("chunk, unused", [(None, 0), (4, 0), (3, 0), (None, 3)])
def test_log_probs_and_entropies_equal_the_plain_path(lora_trainer, chunk, unused):
    batch = episode_batch(unused=unused)
    plain_logps, plain_entropy, _ = logps(lora_trainer, "off", batch, chunk)
    shared_logps, shared_entropy, state = logps(lora_trainer, "on", batch, chunk)
    assert state.shared_chunks > 0
    scored = (batch["completion_mask"] == 1)
    assert plain_logps[scored].abs().min() > 0  # real numbers were compared, not masked zeros
    torch.testing.assert_close(shared_logps, plain_logps, atol=ATOL, rtol=0)
    torch.testing.assert_close(shared_entropy, plain_entropy, atol=ATOL, rtol=0)


@pytest.mark.parametrize("which", ["lora", "full"])
def test_loss_and_gradients_equal_the_plain_path(lora_trainer, full_trainer, which):
    trainer = lora_trainer if which == "lora" else full_trainer
    batch = episode_batch(seed=1)
    batch["ref_per_token_logps"] = logps(trainer, "off", batch)[0] - 0.05  # a KL term with a gradient
    plain_loss, plain_grads, _ = loss_and_grads(trainer, "off", batch)
    shared_loss, shared_grads, state = loss_and_grads(trainer, "on", batch)
    assert state.shared_chunks == 1 and state.plain_chunks == 0
    torch.testing.assert_close(shared_loss, plain_loss, atol=ATOL, rtol=1e-5)
    assert plain_grads.keys() == shared_grads.keys() and plain_grads
    if which == "lora":
        assert all("lora" in name for name in plain_grads)
        assert any("lora_A" in name for name in plain_grads) and any("lora_B" in name for name in plain_grads)
    else:  # the embeddings and the first layer are reached only through the prompt's cache and the continuations
        assert any("embed_tokens" in name for name in plain_grads) and any("layers.0." in name for name in plain_grads)
    for name, grad in plain_grads.items():
        scale = grad.abs().max().clamp(min=1e-8)
        assert (shared_grads[name] - grad).abs().max() / scale < 1e-4, name


def test_an_off_by_one_position_would_be_caught(lora_trainer):
    # The tolerance above is tight enough: the completion's positions one further from the prompt's (what
    # a continuation counted from the wrong cache length would get) move the tiny model's log-probs by
    # far more than ATOL.
    batch = episode_batch()
    ids, mask, keep = joined(batch)
    labels = ids.masked_fill(mask == 0, -100)
    labels[:, :-keep] = -100
    with torch.no_grad():
        right = lora_trainer.model(input_ids=ids, attention_mask=mask, labels=labels, fused_lm_head=True).log_probs
        positions = torch.arange(ids.size(1))[None, :] + (torch.arange(ids.size(1)) >= ids.size(1) - keep).long()
        shifted = lora_trainer.model(input_ids=ids, attention_mask=mask, position_ids=positions, labels=labels,
                                     fused_lm_head=True).log_probs
    assert (right - shifted).abs().max() > 100 * ATOL


def test_auto_shares_only_where_it_leaves_out_enough_tokens(lora_trainer):
    # The whole batch in one chunk: 3 prompts of 14 columns for 8 episodes. With 11 completion columns
    # sharing leaves out 32% of the tokens; with 51, 12.5%: under AUTO_MIN_SAVED, `auto` leaves it be.
    for longer, auto_shares in ((0, 1), (40, 0)):
        batch = episode_batch(longer=longer)
        _, _, on = logps(lora_trainer, "on", batch)
        _, _, auto = logps(lora_trainer, "auto", batch)
        assert (on.shared_chunks, auto.shared_chunks) == (1, auto_shares), longer
    ids = torch.zeros(4, 100, dtype=torch.long)
    assert saved_share(ids, prompt_len=80, distinct=1) == pytest.approx(1 - (79 + 4 * 21) / 400)
    assert saved_share(ids, prompt_len=80, distinct=4) == 0  # no prompt repeats: nothing saved


def test_auto_leaves_devices_it_was_not_measured_on_to_the_plain_path(lora_trainer, caplog):
    ids = torch.zeros(2, 5, dtype=torch.long, device="meta")  # not a CPU tensor
    with caplog.at_level(logging.WARNING, logger="aitrain_grpo.training.step.shared_prefix"):
        got = shared_logps(lora_trainer.accelerator, SharedPrefix("auto"), lora_trainer.model, ids, ids, 2, None, False, False, {},
                           lambda i, m, b: "plain")
    assert got == "plain" and "auto shares on cpu only" in caplog.text


def test_auto_leaves_passes_with_dropout_to_the_plain_path(tiny_model_dir, tmp_path, caplog):
    # LoRA dropout would be drawn once per prompt instead of once per episode: not the plain path.
    trainer = make_trainer(tiny_model_dir, tmp_path, peft=True, lora_dropout=0.05)
    batch = episode_batch()
    batch["ref_per_token_logps"] = torch.zeros(8, batch["completion_ids"].size(1))
    with caplog.at_level(logging.WARNING, logger="aitrain_grpo.training.step.shared_prefix"):
        assert loss_and_grads(trainer, "auto", batch)[2].shared_chunks == 0
        assert "dropout is on" in caplog.text
        with use_adapter(trainer.model, None):  # the reference pass: the adapter and its dropout are off
            assert logps(trainer, "auto", batch)[2].shared_chunks == 1
        assert loss_and_grads(trainer, "on", batch)[2].shared_chunks == 1  # `on` shares, and says so
        assert "drawn once for its group" in caplog.text


def test_gradient_checkpointing_takes_the_plain_path_with_a_note(tiny_model_dir, tmp_path, caplog):
    trainer = make_trainer(tiny_model_dir, tmp_path, peft=False)
    trainer.model.gradient_checkpointing_enable()
    batch = episode_batch()
    batch["ref_per_token_logps"] = torch.zeros(8, batch["completion_ids"].size(1))
    with caplog.at_level(logging.WARNING, logger="aitrain_grpo.training.step.shared_prefix"):
        _, _, state = loss_and_grads(trainer, "on", batch)
        loss_and_grads(trainer, state, batch)
    assert state.shared_chunks == 0
    assert sum("gradient checkpointing" in r.message for r in caplog.records) == 1


def test_a_prompts_episodes_are_kept_in_one_micro_batch():
    batch = episode_batch()
    batch["note"] = [f"row {i}" for i in range(8)]
    parts = [{key: (value[i:i + 2] if key != "num_items_in_batch" else value) for key, value in batch.items()}
             for i in range(0, 8, 2)]
    grouped = keep_prompts_together(parts)
    assert [len(p["note"]) for p in grouped] == [2, 2, 2, 2]
    assert sorted(n for p in grouped for n in p["note"]) == sorted(batch["note"])
    assert all(p["num_items_in_batch"] is batch["num_items_in_batch"] for p in grouped)
    index = {note: i for i, note in enumerate(batch["note"])}
    prompts = []
    for part in grouped:
        for j, note in enumerate(part["note"]):  # every value moved with its row
            i = index[note]
            assert torch.equal(part["prompt_ids"][j], batch["prompt_ids"][i])
            assert part["advantages"][j] == batch["advantages"][i]
            prompts.append(tuple(batch["prompt_ids"][i].tolist()))
    runs = [prompts[0]] + [b for a, b in zip(prompts, prompts[1:]) if a != b]
    assert len(runs) == len(set(prompts))  # each prompt's episodes are contiguous


def test_a_training_step_is_the_same_with_sharing_on(tiny_model_dir, tmp_path):
    # The same episodes (same seed); `on` regroups them by prompt and shares; TRL's default loss (dapo)
    # weighs an episode the same in any micro-batch, so the step's loss and gradient norm agree.
    logs = {}
    for mode in ("off", "on"):
        config = RunConfig(model=tiny_model_dir, output_dir=str(tmp_path / mode), rl_env_module="envs.letters",
                           rl_env_class="LetterEnv", lora_dropout=0.0, max_steps=1, batch_size=8, micro_batch_size=2,
                           rl_num_generations=4, rl_max_new_tokens=12, seed=5, shared_prefix_loss=mode)
        trainer = build_trainer(config, LetterEnv(turns=2, num_tasks=8))
        trainer.train()
        (logs[mode],) = [h for h in trainer.state.log_history if "loss" in h]
        if mode == "on":
            # Every pass shared: the reference pass's 4 chunks of 2 (groups in order) and the loss's 4
            # micro-batches, each two episodes of one prompt once kept together.
            assert (trainer.run.shared_prefix.shared_chunks, trainer.run.shared_prefix.plain_chunks) == (8, 0)
    assert logs["on"]["grad_norm"] > 0
    for key in ("loss", "grad_norm", "reward"):  # per-micro-batch means (kl, entropy) depend on the split
        assert logs["on"][key] == pytest.approx(logs["off"][key], rel=1e-4, abs=1e-6), key
