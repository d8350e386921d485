"""The shared-prefix passes (training/step/shared_prefix.py) are exact: a pass's rows as one prefix tree give the
plain path's per-token log-probs, entropies, loss and gradients, with LoRA and with full fine-tuning, on
groups whose prompts differ in length (left padding), whose multi-turn completions have environment
tokens masked out of the loss, and (`rewritten_batch`) on an episode's sequences after a rewrite and
episodes that open alike. Also: the tiny model moves by more than the tolerance when a position is off
by one, in the plain path and in the tree (so these comparisons would catch it), a model that ignores
the tree's positions is caught and falls back, a prompt's episodes are kept in one micro-batch, and a
real step trains the same with sharing on."""

from __future__ import annotations

import dataclasses
import logging

import pytest
import torch
from trl.trainer.utils import use_adapter

from aitrain_grpo import RunConfig
from aitrain_grpo.training.step.micro_batches import keep_prompts_together
from aitrain_grpo.training.step.prefix_tree import build_tree, cost_ratio
from aitrain_grpo.training.step.shared_prefix import SharedPrefix, shared_logps
from aitrain_grpo.training.trainer import build_trainer
from envs.letters import LetterEnv
from helpers.prefix_batches import episode_batch, joined, make_trainer, rewritten_batch

pytestmark = pytest.mark.integration

ATOL = 1e-5  # float32 log-probs of the same sums in another order differ by ~2e-6 here


@pytest.fixture(scope="module")
def lora_trainer(tiny_model_dir, tmp_path_factory):
    return make_trainer(tiny_model_dir, tmp_path_factory.mktemp("lora"), peft=True)


@pytest.fixture(scope="module")
def full_trainer(tiny_model_dir, tmp_path_factory):
    return make_trainer(tiny_model_dir, tmp_path_factory.mktemp("full"), peft=False)


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


def test_the_tree_shares_kept_histories_and_openings_exactly(lora_trainer):
    batch = rewritten_batch()
    ids, mask, keep = joined(batch)
    tree = build_tree(ids, mask, keep)
    prompts_once = tree.row_tokens - 5 * 10 + 10  # P's 10 tokens once instead of five times
    assert tree.nodes < prompts_once - 20  # the kept histories, the shared opening and the copy besides
    plain_logps, plain_entropy, _ = logps(lora_trainer, "off", batch)
    shared_logps_, shared_entropy, state = logps(lora_trainer, "on", batch)
    assert state.shared_chunks == 1 and state.broken is None
    assert plain_logps[batch["completion_mask"] == 1].abs().min() > 0
    torch.testing.assert_close(shared_logps_, plain_logps, atol=ATOL, rtol=0)
    torch.testing.assert_close(shared_entropy, plain_entropy, atol=ATOL, rtol=0)
    batch["ref_per_token_logps"] = plain_logps - 0.05
    plain_loss, plain_grads, _ = loss_and_grads(lora_trainer, "off", batch)
    shared_loss, shared_grads, _ = loss_and_grads(lora_trainer, "on", batch)
    torch.testing.assert_close(shared_loss, plain_loss, atol=ATOL, rtol=1e-5)
    assert plain_grads.keys() == shared_grads.keys() and plain_grads
    for name, grad in plain_grads.items():
        assert (shared_grads[name] - grad).abs().max() / grad.abs().max().clamp(min=1e-8) < 1e-4, name


def test_an_off_by_one_in_the_tree_would_be_caught(lora_trainer):
    # The tree's own positions one further along from the first completion token on: log-probs move by far
    # more than ATOL, so the comparisons above would catch a depth counted wrong.
    from aitrain_grpo.training.step.shared_prefix import _tree_forward, _trained

    batch = rewritten_batch()
    ids, mask, keep = joined(batch)
    tree = build_tree(ids, mask, keep)
    causal = _trained(lora_trainer.accelerator, lora_trainer.model)
    shifted = dataclasses.replace(tree, positions=tree.positions + (tree.positions >= 10).long())
    with torch.no_grad():
        right = _tree_forward(lora_trainer.accelerator, lora_trainer.model, causal, tree, False)[0]
        wrong = _tree_forward(lora_trainer.accelerator, lora_trainer.model, causal, shifted, False)[0]
    assert (right - wrong).abs().max() > 100 * ATOL


def test_a_model_that_ignores_the_trees_positions_falls_back(tiny_model_dir, tmp_path, caplog):
    # A stand-in for a model whose forward drops custom position ids: the run's first shared chunk is
    # checked against the plain path, found off, and every pass after takes the plain path.
    trainer = make_trainer(tiny_model_dir, tmp_path, peft=True)
    backbone = trainer.model.get_base_model().model
    handle = backbone.register_forward_pre_hook(
        lambda module, args, kwargs: (args, {k: v for k, v in kwargs.items() if k != "position_ids"}),
        with_kwargs=True)
    try:
        batch = rewritten_batch()
        plain_logps, _, _ = logps(trainer, "off", batch)
        with caplog.at_level(logging.WARNING, logger="aitrain_grpo.training.step.shared_prefix"):
            got, _, state = logps(trainer, "on", batch)
    finally:
        handle.remove()
    assert state.broken and "ignores a custom attention mask or position ids" in caplog.text
    assert state.shared_chunks == 0
    torch.testing.assert_close(got, plain_logps, atol=ATOL, rtol=0)


def test_each_chunk_is_one_forward_of_the_wrapped_model(lora_trainer):
    # Under DDP a forward of the wrapper is a collective (it broadcasts the buffers), and one process checks
    # its first shared chunk against the plain path where another may not: the check goes to the model
    # under the wrapper, or the processes' collectives part and the run hangs (it did: two processes on one
    # vLLM server). DataParallel stands in for DDP: accelerate unwraps both, and it needs no process group.
    wrapped = torch.nn.DataParallel(lora_trainer.model)
    forwards = []
    handle = wrapped.register_forward_pre_hook(lambda module, args: forwards.append(len(forwards)))
    batch = rewritten_batch()
    ids, mask, keep = joined(batch)
    lora_trainer.run.shared_prefix = state = SharedPrefix("on")
    try:
        with torch.no_grad():
            got = lora_trainer._get_per_token_logps_and_entropies(wrapped, ids, mask, keep, batch_size=3)[0]
    finally:
        handle.remove()
    assert state.checked and state.broken is None and state.shared_chunks >= 1
    assert len(forwards) == state.shared_chunks + state.plain_chunks == 2
    torch.testing.assert_close(got, logps(lora_trainer, "off", batch, chunk=3)[0], atol=ATOL, rtol=0)


def test_trees_share_only_where_they_cost_less(lora_trainer, caplog):
    # The whole batch in one chunk: 3 prompts of 14 columns for 8 episodes. With 11 completion columns the
    # tree is 92 of the rows' 143 tokens, an estimated 0.52 of the plain path's cost: both modes share.
    # With 51, 413 of 463: its dense mask would hold 5x the 8 rows' attention scores, which neither mode
    # computes (and auto's estimate, 1.32, would have declined it too).
    for longer, shares in ((0, 1), (40, 0)):
        batch = episode_batch(longer=longer)
        with caplog.at_level(logging.WARNING, logger="aitrain_grpo.training.step.shared_prefix"):
            _, _, on = logps(lora_trainer, "on", batch)
        _, _, auto = logps(lora_trainer, "auto", batch)
        assert (on.shared_chunks, auto.shared_chunks) == (shares, shares), longer
    assert "attention scores" in caplog.text
    ids = torch.tensor([[0, 5, 6, 7, 8], [0, 5, 6, 7, 9]])
    mask = (ids != 0).long()
    tree = build_tree(ids, mask, logits_to_keep=1)
    # 5, 6, 7 once; 8 and 9 each; and a copy of 7, which predicts 8 for one row and 9 for the other
    assert (tree.nodes, tree.row_tokens) == (6, 8)
    assert tree.labels.tolist() == [-100, -100, 8, -100, -100, 9]
    assert cost_ratio(tree, plain_tokens=10, plain_width=5, weights_per_token=1, attention_per_key=0) == 0.6
    assert cost_ratio(tree, plain_tokens=10, plain_width=5, weights_per_token=0, attention_per_key=1) == 36 / 50


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
        assert "drawn once for all its rows" in caplog.text


def test_gradient_checkpointing_shares_and_equals_the_plain_path(tiny_model_dir, tmp_path):
    # One forward per backward: checkpointed layers recompute the tree as they would a plain row.
    trainer = make_trainer(tiny_model_dir, tmp_path, peft=False)
    trainer.model.gradient_checkpointing_enable()
    batch = episode_batch()
    batch["ref_per_token_logps"] = logps(trainer, "off", batch)[0] - 0.05  # a KL term of ordinary size
    plain_loss, plain_grads, _ = loss_and_grads(trainer, "off", batch)
    shared_loss, shared_grads, state = loss_and_grads(trainer, "on", batch)
    assert state.shared_chunks == 1 and state.broken is None
    torch.testing.assert_close(shared_loss, plain_loss, atol=ATOL, rtol=1e-5)
    for name, grad in plain_grads.items():
        assert (shared_grads[name] - grad).abs().max() / grad.abs().max().clamp(min=1e-8) < 1e-4, name


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


def test_layers_other_than_full_attention_take_the_plain_path(lora_trainer):
    # The tree's mask lets a token see every earlier token of its row: a sliding window or a
    # linear-attention layer would compute something else, so such models are declined, naming why.
    from transformers import MistralConfig, MistralForCausalLM, Qwen2Config, Qwen2ForCausalLM

    from aitrain_grpo.training.step.shared_prefix import unsupported

    small = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                 num_key_value_heads=1, vocab_size=100)
    mistral = MistralForCausalLM(MistralConfig(sliding_window=16, **small))
    hybrid = Qwen2ForCausalLM(Qwen2Config(layer_types=["full_attention", "sliding_attention"],
                                          use_sliding_window=True, sliding_window=16, **small))
    accelerator = lora_trainer.accelerator
    assert "sliding-window" in unsupported(accelerator, mistral, {}, False)
    assert "sliding_attention layers" in unsupported(accelerator, hybrid, {}, False)
    assert unsupported(accelerator, lora_trainer.model, {}, False) is None


def test_a_groups_sequences_are_kept_together_by_their_group_ids():
    # Split into 3 micro-batches of 2 in TRL's shuffled order, then regrouped: by group id (as the step's
    # batch carries them), an episode's two sequences and the copy of its first share micro-batches, so the
    # micro-batches' trees compute fewer tokens than when only equal prompts are kept together.
    batch = rewritten_batch()
    p_rows = batch["prompt_mask"].sum(1) >= 10  # P's 10 tokens or its kept histories; Q has 6
    batch["group_ids"] = (~p_rows).long()
    parts = [{key: (value[i:i + 2] if key != "num_items_in_batch" else value) for key, value in batch.items()}
             for i in range(0, 6, 2)]

    def tree_tokens(micro_batches):
        return sum(build_tree(*joined(part)).nodes for part in micro_batches)

    by_group = keep_prompts_together(parts)
    by_prompt = keep_prompts_together([{k: v for k, v in part.items() if k != "group_ids"} for part in parts])
    groups = [g for part in by_group for g in part["group_ids"].tolist()]
    assert groups == sorted(groups, key=groups.index)  # each group's rows contiguous
    assert tree_tokens(by_group) < tree_tokens(by_prompt)


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
