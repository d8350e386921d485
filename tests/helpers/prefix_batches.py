"""Batches and trainers for the shared-prefix tests (tests/test_shared_prefix*.py): `make_trainer` on the tiny
model and envs.letters, `episode_batch` (groups with left padding and environment tokens), `rewritten_batch`
(an episode's sequences after a rewrite, and episodes that open alike), `joined` (TRL's forward inputs)."""

from __future__ import annotations

import torch

from aitrain_grpo import RunConfig
from aitrain_grpo.training.trainer import build_trainer
from envs.letters import LetterEnv


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


def rewritten_batch() -> dict[str, torch.Tensor]:
    """Rows that share more than a prompt: episodes 0 and 1 of prompt P trained as two sequences each (the
    second's prompt is the kept history: P, the first reply, a 2-token placeholder), episode 1 opening as
    episode 0 does for 3 tokens, episode 2 a copy of episode 0's first sequence, and one episode of
    another prompt Q; environment tokens masked from the loss; rows in shuffled order."""
    g = torch.Generator().manual_seed(7)

    def tokens(n):
        return torch.randint(5, 1000, (n,), generator=g).tolist()

    p, q, placeholder = tokens(10), tokens(6), tokens(2)
    a1, b1 = tokens(6), None
    b1 = a1[:3] + tokens(4)
    r, a2, b2, a3, b3, c1 = tokens(3), tokens(4), tokens(5), tokens(5), tokens(3), tokens(7)
    rows = [  # (prompt, completion, environment tokens within the completion)
        (p, a1 + r + a2, range(len(a1), len(a1) + 3)),
        (p + a1 + placeholder, a3, ()),
        (p, b1 + r + b2, range(len(b1), len(b1) + 3)),
        (p + b1 + placeholder, b3, ()),
        (p, a1 + r + a2, range(len(a1), len(a1) + 3)),
        (q, c1, ()),
    ]
    width, length = max(len(x) for x, _, _ in rows), max(len(c) for _, c, _ in rows)
    batch = {key: [] for key in ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask", "tool_mask")}
    for prompt, completion, env in rows:
        batch["prompt_ids"].append([0] * (width - len(prompt)) + prompt)
        batch["prompt_mask"].append([0] * (width - len(prompt)) + [1] * len(prompt))
        batch["completion_ids"].append(completion + [0] * (length - len(completion)))
        batch["completion_mask"].append([1] * len(completion) + [0] * (length - len(completion)))
        batch["tool_mask"].append([0 if i in env else 1 for i in range(length)])
    order = torch.randperm(len(rows), generator=g)
    batch = {key: torch.tensor(value)[order] for key, value in batch.items()}
    batch["advantages"] = torch.randn(len(rows), generator=g)
    batch["num_items_in_batch"] = (batch["completion_mask"] * batch["tool_mask"]).sum()
    return batch
