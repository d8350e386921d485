"""A difficulty curriculum: prompts whose recent groups all succeeded or all failed are drawn less
(`--rl-curriculum pools`).

A group whose episodes all score the same has zero advantage: GRPO learns nothing from it, yet it costs
the step's time. Like prime-rl's difficulty pools, each prompt (a dataset row index) keeps the rewards
of its last `--rl-curriculum-history` groups (each group's mean of the reward TRL trains on: the
environment's score and any reward functions, weighted), and is, as of a given step:
- easy: every remembered group's reward is at least `--rl-curriculum-easy` (default 1: all succeeded);
- hard: every remembered group's reward is at most `--rl-curriculum-hard` (default 0: all failed);
- normal: anything else, and every prompt not played yet.

Drawing (`Curriculum.draw`): each batch starts from the prompts TRL's own sampler would give it (its
permutation of the epoch, seeded as checkpoints.ResumableRepeatSampler does) and walks that permutation
from there: a normal prompt is taken, an easy or hard one only with probability `--rl-curriculum-revisit`
(a coin seeded by the seed and the batch number alone), until the batch is full; each environment of a
mixture (env/adapters/mixture.py's `aitrain_env` column) keeps the number of prompts the uniform batch
gave it, so pools move prompts within an environment, never the mixture's weights. With no prompt in a
pool the batch is TRL's. A prompt may so come back before others of its epoch have been seen; an epoch
is only a count of batches (HF Trainer's, so resuming still skips the right number).

When the state is read: a batch is drawn before the step before it has played (the data loader fetches
one batch ahead), and with `--rl-async-steps N` N steps ahead. So batch c is drawn from the groups of the
batches up to c - 1 - max(1, N), whenever it is drawn: the same prompts in an uninterrupted run, a resumed
one, every process of a multi-process run (each records the rewards TRL gathered from all of them), and
the async plan that plays the batch ahead. The played-ahead batches are therefore drawn from a state N
steps old.

Saved in each checkpoint's aitrain_state.json (run/checkpoints.py): the recorded groups and their count.
Metrics per step (`record`): `curriculum/easy`, `curriculum/normal`, `curriculum/hard` (prompts in each
pool after the step; `curriculum/<env>/...` per environment of a mixture), `curriculum/sampled_easy` and
`curriculum/sampled_hard` (prompts of the step's batch drawn from those pools), and
`curriculum/sampled_reward` (the mean recent reward of the batch's prompts that had been played: lower is
harder).

Left out: `--rl-zero-std-groups refill` (it replaces the flat groups the pools learn from: refused in
config.py), weighting by anything but the pools, and `num_iterations` > 1 (the run never sets it).
"""

from __future__ import annotations

import math
import random
from collections import Counter
from typing import Any, Sequence

import torch

from aitrain_grpo.training.run.checkpoints import ResumableRepeatSampler

ENV_COLUMN = "aitrain_env"  # a mixture's rows name their environment (env/adapters/mixture.py)
POOLS = ("easy", "normal", "hard")


class Curriculum:
    """The per-prompt group history and the draw (see the module docstring). `envs[i]` is row i's
    environment (None outside a mixture); `lag` the batches between a batch's draw and the groups it sees."""

    def __init__(self, envs: Sequence[str | None], *, easy: float, hard: float, revisit: float, history: int,
                 lag: int, seed: int):
        self.envs = list(envs)
        self.easy, self.hard, self.revisit, self.history = easy, hard, revisit, history
        self.lag, self.seed = max(1, lag), seed
        self.records: dict[int, list[tuple[int, float]]] = {}  # row -> [(batch number, group reward)], oldest first
        self.recorded = 0  # training batches recorded so far: the number of the next one
        self.drawn: dict[int, tuple[list[int], list[str], list[float]]] = {}  # batch -> rows, pools, past rewards

    @classmethod
    def for_run(cls, config, dataset) -> "Curriculum":
        envs = list(dataset[ENV_COLUMN]) if ENV_COLUMN in dataset.column_names else [None] * len(dataset)
        return cls(envs, easy=config.rl_curriculum_easy, hard=config.rl_curriculum_hard,
                   revisit=config.rl_curriculum_revisit, history=config.rl_curriculum_history,
                   lag=config.rl_async_steps, seed=config.seed)

    # ---------------------------------------------------------------------------------------- pools

    def recent(self, row: int, upto: float = math.inf) -> list[float]:
        """Row `row`'s last `history` group rewards among the batches numbered up to `upto`."""
        return [reward for batch, reward in self.records.get(row, ()) if batch <= upto][-self.history:]

    def pool(self, row: int, upto: float = math.inf) -> str:
        rewards = self.recent(row, upto)
        if rewards and all(r >= self.easy for r in rewards):
            return "easy"
        if rewards and all(r <= self.hard for r in rewards):
            return "hard"
        return "normal"

    # ----------------------------------------------------------------------------------------- draw

    def draw(self, batch: int, order: Sequence[int], start: int, size: int) -> list[int]:
        """The `size` rows of batch number `batch`: `order` (the epoch's permutation) walked from `start`,
        easy and hard rows kept at the revisit rate, each environment's count as in order[start:start+size]."""
        upto = batch - 1 - self.lag
        quotas = Counter(self.envs[i] for i in order[start:start + size])
        coin = random.Random(f"aitrain-curriculum/{self.seed}/{batch}")
        chosen: list[int] = []
        passed: list[int] = []
        for row in (order[(start + j) % len(order)] for j in range(len(order))):  # lazily: most batches stop early
            if len(chosen) == size:
                break
            if not quotas[self.envs[row]]:
                continue
            if self.pool(row, upto) != "normal" and coin.random() >= self.revisit:
                passed.append(row)
                continue
            chosen.append(row)
            quotas[self.envs[row]] -= 1
        for row in passed:  # every normal row of an environment taken: its pooled ones fill the batch
            if len(chosen) < size and quotas[self.envs[row]]:
                chosen.append(row)
                quotas[self.envs[row]] -= 1
        pasts = [self.recent(row, upto) for row in chosen]
        self.drawn[batch] = (chosen, [self.pool(row, upto) for row in chosen],
                             [sum(p) / len(p) if p else math.nan for p in pasts])
        return chosen

    # --------------------------------------------------------------------------------------- record

    def record(self, rewards: Sequence[float], group_size: int) -> dict[str, float]:
        """Record the next training batch's rewards (every episode of every process, in the sampler's
        order: TRL's gathered rewards) and return the step's metrics. A batch this curriculum did not draw
        (it cannot happen with its sampler in place) is counted and left out."""
        batch = self.recorded
        self.recorded += 1
        rows, pools, pasts = self.drawn.pop(batch, ([], [], []))
        for old in [b for b in self.drawn if b < batch]:
            del self.drawn[old]
        if not rows or len(rows) * group_size != len(rewards):
            return {"curriculum/unrecorded": 1.0}
        floor = self.recorded - 1 - self.lag  # the oldest state a batch drawn from now on reads
        for k, row in enumerate(rows):
            group = [r for r in rewards[k * group_size:(k + 1) * group_size] if not math.isnan(r)]
            if not group:
                continue
            entries = self.records.setdefault(row, [])
            entries.append((batch, sum(group) / len(group)))
            old = [e for e in entries if e[0] <= floor]
            self.records[row] = old[-self.history:] + [e for e in entries if e[0] > floor]
        metrics = self.pool_sizes()
        metrics["curriculum/sampled_easy"] = float(pools.count("easy"))
        metrics["curriculum/sampled_hard"] = float(pools.count("hard"))
        seen = [p for p in pasts if not math.isnan(p)]
        if seen:
            metrics["curriculum/sampled_reward"] = sum(seen) / len(seen)
        return metrics

    def pool_sizes(self) -> dict[str, float]:
        """Rows in each pool as of every recorded group, over all environments and per environment of a
        mixture (rows never played are normal)."""
        counts: Counter = Counter()
        for row in self.records:
            pool = self.pool(row)
            counts[(None, pool)] += 1
            if self.envs[row] is not None:
                counts[(self.envs[row], pool)] += 1
        totals = Counter(self.envs)
        names = sorted(name for name in totals if name is not None)
        metrics: dict[str, float] = {}
        for name in [None, *names]:
            size = len(self.envs) if name is None else totals[name]
            prefix = "curriculum/" if name is None else f"curriculum/{name}/"
            easy, hard = counts[(name, "easy")], counts[(name, "hard")]
            metrics.update({f"{prefix}easy": float(easy), f"{prefix}normal": float(size - easy - hard),
                            f"{prefix}hard": float(hard)})
        return metrics

    # ---------------------------------------------------------------------------------- checkpoints

    def state_dict(self) -> dict[str, Any]:
        return {"recorded": self.recorded,
                "records": {str(row): [[b, r] for b, r in entries] for row, entries in self.records.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.recorded = int(state.get("recorded", 0))
        self.records = {int(row): [(int(b), float(r)) for b, r in entries]
                        for row, entries in state.get("records", {}).items()}
        self.drawn = {}


class CurriculumSampler(ResumableRepeatSampler):
    """TRL's sampler (re-classed, keeping TRL's arguments: `curriculum_sampler`) whose batches the
    curriculum draws: each chosen row `mini_repeat_count` times, the batch `repeat_count` times, as TRL's."""

    curriculum: Curriculum

    def _permutation(self, epoch: int) -> list[int]:
        """The order TRL's sampler gives epoch `epoch` (ResumableRepeatSampler's draws)."""
        cache = self.__dict__.setdefault("_orders", {})
        if epoch not in cache:
            if not (self.shuffle and self.seed is not None):
                order = list(range(self.num_samples))
            else:
                generator = torch.Generator()
                generator.manual_seed(self.seed)
                for _ in range(epoch + 1):
                    order = torch.randperm(self.num_samples, generator=generator).tolist()
            for old in [e for e in cache if e < epoch - 1]:  # steps played ahead span two epochs at most
                del cache[old]
            cache[epoch] = order
        return cache[epoch]

    def batches_per_epoch(self) -> int:
        return max(self.num_samples // self.batch_size, 1)

    def batch_rows(self, batch: int) -> list[int]:
        """The rows of batch number `batch` (counted from the run's start), each once."""
        epoch, index = divmod(batch, self.batches_per_epoch())
        return self.curriculum.draw(batch, self._permutation(epoch), index * self.batch_size, self.batch_size)

    def step_indices(self, batch: int) -> list[int]:
        """Batch `batch` as the data loader yields it once (each row `mini_repeat_count` times): what
        async_rollout.PromptPlan plays ahead."""
        return [row for row in self.batch_rows(batch) for _ in range(self.mini_repeat_count)]

    def __iter__(self):
        if self.num_samples < self.batch_size:
            return
        first = self.epoch * self.batches_per_epoch()
        for batch in range(first, first + self.batches_per_epoch()):
            rows = self.batch_rows(batch)  # drawn when the loader reaches it, not before
            for _ in range(self.repeat_count):
                for row in rows:
                    for _ in range(self.mini_repeat_count):
                        yield row


def curriculum_of(run, dataset) -> Curriculum | None:
    """The run's curriculum (`run`: the RunContext; made on first use from its options and `dataset`, the
    trainer's), or None when it is off. A resumed run's saved groups are loaded into it."""
    if run.config.rl_curriculum == "off":
        return None
    if run.curriculum is None:
        run.curriculum = Curriculum.for_run(run.config, dataset)
        if run.resumed_curriculum is not None:  # read by checkpoints.AtomicCheckpoints.train
            run.curriculum.load_state_dict(run.resumed_curriculum)
    return run.curriculum


def curriculum_sampler(run, sampler, dataset):
    """`sampler` (a ResumableRepeatSampler) drawing from the run's curriculum; as it is when that is off.
    The step records each scored batch's rewards into it (step/flow.py)."""
    curriculum = curriculum_of(run, dataset)
    if curriculum is None or not isinstance(sampler, ResumableRepeatSampler):
        return sampler
    sampler.__class__ = CurriculumSampler
    sampler.curriculum = curriculum
    return sampler
