"""Every sequence of an episode trains (training/step/records.py, step/batch.py): real TRL steps on the tiny model, whose
episodes are cut into two sequences after playing (the first model turn, then the rest on a prompt that
holds it), as a history rewrite cuts them. A causal model scores each sampled token the same with or
without the cut, so with a token-level loss a step over the cut episodes must be the step over the
uncut ones: that holds only if every earlier sequence is a row with exactly its sampled tokens and its
episode's advantage."""

from __future__ import annotations

import copy
import math

import pytest
import torch

from aitrain_grpo import Environment, RunConfig
from aitrain_grpo.env.base import Episode
from aitrain_grpo.training.trl import hooks as trl_hooks
from aitrain_grpo.training.step.scoring import importance_ratio
from aitrain_grpo.training.trainer import build_trainer
from envs_fixtures.agents import SummarisingAgent
from envs_fixtures.turn_rewards import TurnRewardEnv
from helpers.rollouts import as_on_a_vllm_server


class TwoTurnFlatEnv(Environment):
    """Two model turns; even tasks always score 0.5 (a flat group), odd ones by the last turn's length."""

    max_turns = 2

    def build_dataset(self, tokenizer):
        return [{"prompt": [{"role": "user", "content": f"Say something about {i}."}], "task": i} for i in range(8)]

    def step(self, episode: Episode, completion: str):
        return "Now say more." if episode.turns < 2 else None

    def score_episode(self, episode: Episode) -> float:
        return 0.5 if episode.row["task"] % 2 == 0 else (len(episode.last_completion) % 5) / 4


def cut(trace):
    """(the first model turn's sequence, the rest on a prompt holding it); None for a one-turn trace."""
    if len(trace.turn_starts) < 2:
        return None
    at = trace.turn_starts[1]
    first, rest = copy.copy(trace), copy.copy(trace)
    first.completion_ids, first.logprobs, first.env_mask = (v[:at] for v in (trace.completion_ids, trace.logprobs, trace.env_mask))
    rest.prompt_ids = trace.prompt_ids + trace.completion_ids[:at]
    rest.completion_ids, rest.logprobs, rest.env_mask = (v[at:] for v in (trace.completion_ids, trace.logprobs, trace.env_mask))
    first.turn_starts, rest.turn_starts = trace.turn_starts[:1], [s - at for s in trace.turn_starts[1:]]
    if hasattr(trace, "turn_numbers"):
        first.turn_numbers, rest.turn_numbers = trace.turn_numbers[:1], trace.turn_numbers[1:]
    return first, rest


def cutting(run, which, keep_earlier=True):
    """`engine.run` whose episodes in `which` (indexes) come back as two sequences."""
    def play(rows):
        batch = run(rows)
        batch.earlier = [[] for _ in batch.traces]
        for i in which:
            parts = cut(batch.traces[i]) if i < len(batch.traces) else None
            if parts:
                batch.earlier[i] = [parts[0]] if keep_earlier else []
                batch.traces[i] = parts[1]
        return batch
    return play


def one_step(tiny_model_dir, out, env, which=(), keep_earlier=True, prepare=None, **options):
    config = RunConfig(model=tiny_model_dir, output_dir=str(out), **{
        "max_steps": 1, "batch_size": 8, "rl_num_generations": 4, "rl_max_new_tokens": 10, "seed": 5, **options})
    trainer = build_trainer(config, env)
    if prepare is not None:
        prepare(trainer)
    if which:
        engine = trainer.rollout.engine
        engine.run = cutting(engine.run, which, keep_earlier)
    scored = []
    step = trl_hooks.generation_batch  # the step's batch, as the trainer splits it into micro-batches
    trl_hooks.generation_batch = lambda *args: scored.append(step(*args)) or scored[-1]
    try:
        trainer.train()
    finally:
        trl_hooks.generation_batch = step
    (log,) = [h for h in trainer.state.log_history if "loss" in h]
    return trainer, log, scored[0]


def rows_of(scored, index):
    """Row `index` of TRL's scored batch: (prompt tokens, completion tokens, loss mask, sampling log-probs)."""
    prompt = scored["prompt_ids"][index][scored["prompt_mask"][index].bool()].tolist()
    length = int(scored["completion_mask"][index].sum())
    return (prompt, scored["completion_ids"][index, :length].tolist(), scored["tool_mask"][index, :length].tolist(),
            scored["sampling_per_token_logps"][index, :length].tolist())


@pytest.fixture(scope="module")
def cut_run(tiny_model_dir, tmp_path_factory):
    """One step over TurnRewardEnv's episodes 0, 3 and 6 cut in two (LoRA, TRL's default dapo loss, KL on)."""
    return one_step(tiny_model_dir, tmp_path_factory.mktemp("cut"), TurnRewardEnv(flat_score=None), which=(0, 3, 6))


def test_each_earlier_sequence_is_a_row_with_its_sampled_tokens_and_its_episodes_advantage(cut_run):
    trainer, log, scored = cut_run
    batch = trainer.rollout.last_batch
    earlier = [(i, t) for i, seqs in enumerate(batch.earlier) for t in seqs]
    assert [i for i, _ in earlier] == [0, 3, 6]
    # 8 episodes and 3 earlier sequences; 1 blank row makes 12, four micro-batches of 3.
    assert scored["advantages"].shape[0] == 12 and log["sequences/extra_rows"] == 3
    assert log["sequences/per_episode"] == pytest.approx(11 / 8) and log["sequences/blank_rows"] == 1
    for row, (i, trace) in enumerate(earlier, start=8):
        prompt, completion, mask, logprobs = rows_of(scored, row)
        assert prompt == trace.prompt_ids and completion == trace.completion_ids and mask == trace.env_mask
        assert logprobs == pytest.approx(trace.logprobs)
        assert scored["advantages"][row, 0] == scored["advantages"][i, 0] != 0
    assert int(scored["completion_mask"][11].sum()) == 0 and scored["advantages"][11, 0] == 0  # the blank row
    # TRL's token count, dapo's normaliser, counts the earlier sequences' model tokens.
    tokens = sum(sum(t.env_mask) for seqs in batch.earlier + [[t] for t in batch.traces] for t in seqs)
    assert int(scored["num_items_in_batch"]) == tokens


def test_a_cut_episode_trains_as_the_uncut_one(cut_run, tiny_model_dir, tmp_path):
    # dapo (TRL's default) weighs every model token alike, and a causal model scores a token the same
    # on either side of the cut: the same loss and gradient, the KL's reference pass (LoRA) included.
    _, whole, _ = one_step(tiny_model_dir, tmp_path / "whole", TurnRewardEnv(flat_score=None))
    _, cut_up, _ = cut_run
    _, last_only, _ = one_step(tiny_model_dir, tmp_path / "last", TurnRewardEnv(flat_score=None), which=(0, 3, 6),
                               keep_earlier=False)
    assert whole["grad_norm"] > 0
    assert cut_up["loss"] == pytest.approx(whole["loss"], rel=1e-4, abs=1e-6)
    assert cut_up["grad_norm"] == pytest.approx(whole["grad_norm"], rel=1e-3)
    assert last_only["grad_norm"] != pytest.approx(whole["grad_norm"], rel=1e-2)  # today's: earlier ones untrained


def test_turn_credit_reaches_each_sequence_of_an_episode(tiny_model_dir, tmp_path):
    # Every episode scores 0.5: only the turns' credit moves the policy, turn 1's on the earlier row.
    options = dict(rl_advantage="turn", peft=False, rl_kl_coef=0.0)
    _, whole, _ = one_step(tiny_model_dir, tmp_path / "whole", TurnRewardEnv(), **options)
    _, cut_up, scored = one_step(tiny_model_dir, tmp_path / "cut", TurnRewardEnv(), which=range(8), **options)
    assert whole["grad_norm"] > 0 and scored["advantages"].shape[0] == 16
    assert cut_up["grad_norm"] == pytest.approx(whole["grad_norm"], rel=1e-3)


def test_the_importance_sampling_correction_covers_the_earlier_rows(tiny_model_dir, tmp_path):
    # The correction needs every row's ratio; on a batch trained once the loss pass gives it (no second
    # forward: the step's batch has no old log-probabilities), for the earlier rows as for the last ones.
    options = dict(peft=False, prepare=as_on_a_vllm_server)
    _, whole, _ = one_step(tiny_model_dir, tmp_path / "whole", TurnRewardEnv(flat_score=None), **options)
    _, cut_up, scored = one_step(tiny_model_dir, tmp_path / "cut", TurnRewardEnv(flat_score=None), which=(0, 3, 6),
                                 **options)
    assert "old_per_token_logps" not in scored and "importance_sampling_ratio" not in scored
    assert scored["advantages"].shape[0] == 12
    assert 0 < cut_up["sampling/importance_sampling_ratio/mean"] != 1 and cut_up["sampling/is_masked_frac"] == 0
    assert cut_up["grad_norm"] == pytest.approx(whole["grad_norm"], rel=1e-3)
    assert cut_up["loss"] == pytest.approx(whole["loss"], rel=1e-4, abs=1e-6)


def test_the_sequence_level_ratio_of_trls_default_mode_masks_a_row_out_of_bounds():
    # TRL's default (sequence_mask): one ratio per row over its model tokens, 0 outside [min, max].
    old, sampling = torch.tensor([[-1.0, -2.0, -3.0], [-1.0, -1.0, 0.0]]), torch.tensor([[-1.5, -2.0, -9.0], [-3.0, -1.0, 0.0]])
    ratio = importance_ratio(old, sampling, torch.tensor([[1, 1, 0], [1, 1, 0]]), mode="sequence_mask", low=0.5, high=3.0)
    assert ratio.shape == (2, 1) and ratio[0, 0] == pytest.approx(math.exp(0.5)) and ratio[1, 0] == 0


def test_a_dropped_groups_earlier_sequences_leave_with_it(tiny_model_dir, tmp_path):
    options = dict(rl_zero_std_groups="drop", peft=False)
    _, whole, _ = one_step(tiny_model_dir, tmp_path / "whole", TwoTurnFlatEnv(), **options)
    trainer, cut_up, scored = one_step(tiny_model_dir, tmp_path / "cut", TwoTurnFlatEnv(), which=range(8), **options)
    batch = trainer.rollout.last_batch
    flat = [i for i, ep in enumerate(batch.episodes) if ep.row["task"] % 2 == 0]
    assert cut_up["groups/dropped_frac"] == 0.5 and len(flat) == 4
    # Rows: 8 episodes, then the earlier sequences of the 4 informative episodes only.
    informative = [i for i in range(8) if i not in flat]
    assert scored["advantages"].shape[0] == 12 and cut_up["sequences/extra_rows"] == 4
    for row, i in enumerate(informative, start=8):
        assert rows_of(scored, row)[0] == batch.earlier[i][0].prompt_ids
    assert cut_up["loss"] == pytest.approx(whole["loss"], rel=1e-4, abs=1e-6)
    assert cut_up["grad_norm"] == pytest.approx(whole["grad_norm"], rel=1e-3)


def test_refilled_groups_bring_their_own_earlier_sequences(tiny_model_dir, tmp_path):
    trainer, log, scored = one_step(tiny_model_dir, tmp_path, TwoTurnFlatEnv(), which=range(8), peft=False,
                                    rl_zero_std_groups="refill")
    batch = trainer.rollout.last_batch
    assert log["groups/refill_rollouts"] > 0 and all(ep.row["task"] % 2 for ep in batch.episodes)
    for (first,), last in zip(batch.earlier, batch.traces):  # each episode's own first part, not a replaced one's
        assert first.prompt_ids + first.completion_ids == last.prompt_ids
    assert log["sequences/extra_rows"] == 8 and scored["advantages"].shape[0] == 16


def test_an_agents_rewritten_history_trains_both_segments(tiny_model_dir, tmp_path):
    # The engine's own split: SummarisingAgent rewrites its history once, so each episode is two segments.
    trainer, log, scored = one_step(tiny_model_dir, tmp_path, SummarisingAgent(), batch_size=4, rl_num_generations=2,
                                    peft=False)
    batch = trainer.rollout.last_batch
    assert log["agent/history_rewrites"] == 4 and log["sequences/per_episode"] == 2.0
    assert scored["advantages"].shape[0] == 8 and log["sequences/blank_rows"] == 0
    for row, (i, seqs) in enumerate(enumerate(batch.earlier), start=4):
        (trace,) = seqs
        assert rows_of(scored, row)[:3] == (trace.prompt_ids, trace.completion_ids, trace.env_mask)
        assert "about hotels" in trainer.processing_class.decode(trace.prompt_ids)
        assert scored["advantages"][row, 0] == scored["advantages"][i, 0]


def test_one_sequence_episodes_add_nothing(tiny_model_dir, tmp_path):
    trainer, log, scored = one_step(tiny_model_dir, tmp_path, TurnRewardEnv(flat_score=None), peft=False)
    assert scored["advantages"].shape[0] == 8 and log["sequences/per_episode"] == 1.0
    assert log["sequences/extra_rows"] == 0 and log["sequences/blank_rows"] == 0
    assert isinstance(scored["num_items_in_batch"], torch.Tensor)


def test_the_reference_pass_takes_a_loss_passs_rows_at_once(tiny_model_dir, tmp_path):
    # 12 rows (8 episodes, 3 earlier sequences, 1 blank) in 4 loss passes of 3: the KL's reference forwards
    # take 3 rows each (4 forwards), not TRL's per_device_train_batch_size of 2 (6 forwards), so a pass's
    # shared-prefix tree holds an episode's sequences together as the loss pass's does.
    scoring: list[int] = []

    def count(trainer):
        def hook(module, args, kwargs):
            if kwargs.get("fused_lm_head") and not torch.is_grad_enabled():
                scoring.append(kwargs["input_ids"].size(0))
        trainer.model.register_forward_pre_hook(hook, with_kwargs=True)

    _, log, scored = one_step(tiny_model_dir, tmp_path, TurnRewardEnv(flat_score=None), which=(0, 3, 6),
                              prepare=count, shared_prefix_loss="off", micro_batch_size=2)
    assert scored["advantages"].shape[0] == 12 and log["kl"] >= 0
    assert scoring == [3, 3, 3, 3]
