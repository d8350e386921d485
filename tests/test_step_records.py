"""The rollout side of the step (training/step/): advantages by GRPO's rule, one typed record per
trained sequence, and the records as TRL's batch; no model, no trainer."""

from __future__ import annotations

import math

import pytest
import torch

from aitrain_grpo.engine.rollout import RolloutBatch
from aitrain_grpo.engine.traces import TokenTrace
from aitrain_grpo.env.base import Episode
from aitrain_grpo.training.step.advantages import group_advantages
from aitrain_grpo.training.step.batch import blank_record, blank_rows_needed, loss_mask, trl_batch
from aitrain_grpo.training.step.records import sequence_records


def test_advantages_are_each_episodes_reward_against_its_group():
    rewards = torch.tensor([[1.0], [0.0], [0.5], [0.5]])
    got = group_advantages(rewards, torch.tensor([1.0]), 2)
    std = math.sqrt(0.5)  # sample standard deviation of (1, 0)
    assert got.advantages.tolist() == pytest.approx([0.5 / (std + 1e-4), -0.5 / (std + 1e-4), 0.0, 0.0])
    assert got.zero_std.tolist() == [False, False, True, True]


def test_weights_sum_the_functions_and_an_abstaining_function_does_not_count():
    rewards = torch.tensor([[1.0, math.nan], [0.0, 1.0]])
    got = group_advantages(rewards, torch.tensor([1.0, 2.0]), 2)
    assert got.rewards.tolist() == pytest.approx([1.0, 2.0])
    assert got.advantages[0] < 0 < got.advantages[1]


def test_an_episode_every_function_abstained_on_gets_no_advantage():
    got = group_advantages(torch.tensor([[math.nan], [1.0], [0.0]]), torch.tensor([1.0]), 3)
    assert got.advantages[0] == 0 and math.isnan(got.rewards[0])
    assert got.advantages[1] > 0 > got.advantages[2]


def test_scale_none_leaves_the_spread_and_batch_divides_by_the_batchs():
    rewards = torch.tensor([[2.0], [0.0], [1.0], [1.0]])
    assert group_advantages(rewards, torch.tensor([1.0]), 2, scale="none").advantages.tolist() == [1, -1, 0, 0]
    batch = group_advantages(rewards, torch.tensor([1.0]), 2, scale="batch").advantages
    assert batch[0].item() == pytest.approx(1 / (torch.std(rewards).item() + 1e-4))


def trace(prompt, completion, mask, turn_starts=(0,)):
    t = TokenTrace(list(prompt))
    t.completion_ids, t.env_mask = list(completion), list(mask)
    t.logprobs = [-0.5 if m else 0.0 for m in mask]
    t.turn_starts, t.turn_numbers = list(turn_starts), list(range(len(turn_starts)))
    return t


def played(traces, earlier):
    episodes = [Episode(row={"task": i}, messages=[]) for i in range(len(traces))]
    return RolloutBatch(episodes=episodes, traces=traces, earlier=earlier)


def test_records_are_the_last_sequences_then_the_earlier_ones_with_their_episodes_advantage():
    batch = played([trace([1], [5, 6], [1, 0]), trace([2], [7], [1])],
                   [[trace([1], [3], [1]), trace([1], [4], [0])], []])
    records = sequence_records(batch, [0.7, -0.7], 2)
    assert [(r.episode, r.sequence, r.last) for r in records] == [(0, 2, True), (1, 0, True), (0, 0, False)]
    assert [r.advantage for r in records] == pytest.approx([0.7, -0.7, 0.7])
    assert records[2].completion_ids == (3,)  # the earlier sequence without a model token trains nothing: left out


def test_a_dropped_episode_keeps_its_last_row_masked_and_loses_its_earlier_ones():
    batch = played([trace([1], [5], [1]), trace([2], [7], [1])], [[trace([1], [3], [1])], []])
    records = sequence_records(batch, [0.0, 0.0], 2, dropped={0})
    assert [(r.episode, r.in_loss, r.env_mask) for r in records] == [(0, False, (0,)), (1, True, (1,))]


def test_turn_credit_rides_on_each_records_tokens():
    batch = played([trace([1], [5, 6, 7], [1, 0, 1], turn_starts=(0, 2)), trace([1], [5, 6, 7], [1, 0, 1], (0, 2))],
                   [])
    batch.episodes[0].turn_rewards, batch.episodes[1].turn_rewards = [1.0, 0.0], [0.0, 0.0]
    records = sequence_records(batch, [0.0, 0.0], 2, turn_credit=True)
    first = records[0].turn_credit
    assert first[0] == first[1] > 0 and first[2] == 0  # turn 1's tokens get its credit, turn 2's none
    out = trl_batch(records, pad_id=0, device="cpu")
    assert out["advantages"][0].tolist() == pytest.approx(list(first))


def test_the_batch_pads_prompts_left_and_completions_right_and_masks_what_does_not_train():
    records = sequence_records(played([trace([1, 2, 3], [5], [1]), trace([4], [6, 7, 8], [1, 0, 1])], []),
                               [1.0, -1.0], 2)
    out = trl_batch(records + [blank_record(3)], pad_id=0, device="cpu")
    assert out["prompt_ids"].tolist() == [[1, 2, 3], [0, 0, 4], [0, 0, 3]]
    assert out["completion_ids"].tolist() == [[5, 0, 0], [6, 7, 8], [0, 0, 0]]
    assert loss_mask(out).tolist() == [[1, 0, 0], [1, 0, 1], [0, 0, 0]]
    assert out["advantages"][:, 0].tolist() == [1.0, -1.0, 0.0]


def test_blank_rows_even_out_processes_and_fill_the_last_micro_batch():
    assert blank_rows_needed(8, 0, 0, 4) == 0  # no extra rows anywhere: TRL's split as it stands
    assert blank_rows_needed(8, 3, 3, 4) == 1  # 11 rows -> 12
    assert blank_rows_needed(8, 1, 3, 4) == 3  # another process has 3 extra: the same 12 rows here
