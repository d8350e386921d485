"""The shared-prefix tree against TRL's plain passes, on real episodes: the tokens each computes and the
CPU time of the loss and reference passes, measured in one run.

Per workload, one real training step (the package's trainer, its rollout and context strategy) is
played with `--shared-prefix-loss on`, and the micro-batches its loss pass received are kept (each
group's rows together, step/micro_batches.py). Then, alternating `--reps` times:

- loss: TRL's `_compute_loss` and `backward()` on every kept micro-batch, plain (`off`) and tree (`on`);
- ref: the reference log-prob pass (no gradient, adapter off) over the whole batch: plain in chunks of the
  micro-batch size (rows in the batch's order, as TRL chunks them), tree (rows in token order) in chunks
  of a loss pass's rows as a run takes them (step/micro_batches.py `scoring_chunk_rows`) and, as `ref at
  TRL's chunks`, in chunks of the micro-batch size (the way runs took them before).

Tokens, per pass: `plain` is what TRL's path computes (rows x the padded width, after the completion
columns no row uses are cut), `rows` the real tokens, `prompt once` what sharing only the group's prompt
would leave (each distinct prompt once, every completion in full, no padding: the previous shared-prefix
loss at its best), `tree` the tree's positions (copies included). CPU seconds are the process's own
(`time.process_time`, one torch thread), medians over the reps; the largest log-prob difference between
the two reference passes and the two summed losses are printed as a check (exactness itself is tested
in tests/test_shared_prefix.py).

    OMP_NUM_THREADS=1 python benchmarks/prefix_tree.py --model smollm2 --record benchmarks/PREFIX_TREE.md
    OMP_NUM_THREADS=1 python benchmarks/prefix_tree.py --model tiny --workloads rewrite --reps 1   # smoke

On a GPU the times are wall seconds after the device's queue drains, and `--check TOL` makes the run an
exactness check (benchmarks/gpu_check.py's `prefix-tree` part: the tree is `on` there, as `auto` shares on
a CPU only).

Left out: the rollout and the optimizer (the tree changes neither), and wall time on a CPU (a shared
machine's neighbours move it; CPU time does not).
"""

from __future__ import annotations

import argparse
import json
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

# name: (module, class, env config, options). Drop-tool-results stubs every tool result but the last, from
# the first rewrite on, so an episode of several tool calls trains several sequences.
DROP = {"rl_context": "drop-tool-results", "rl_context_keep_last": 1, "rl_context_threshold": 1}
WORKLOADS = {
    "stations": ("envs.stations", "StationEnv", {}, {**DROP, "rl_max_new_tokens": 48,
                                                      "rl_max_completion_length": 256}),
    "rewrite": ("envs.rewrite", "RewriteEnv", {}, {"rl_max_new_tokens": 48, "rl_max_completion_length": 192}),
    "longdocs": ("envs.longdocs", "LongDocsEnv", {"documents": 3, "page_words": 120},
                 {**DROP, "rl_max_new_tokens": 64, "rl_max_completion_length": 768}),
}


def play_one_step(model: str, workload: str, batch: int, micro: int, seed: int, out: Path):
    """The trainer after one real step, and the micro-batches its loss pass received."""
    from aitrain_grpo import RunConfig
    from aitrain_grpo.env.loading import load_environment
    from aitrain_grpo.training.trainer import build_trainer

    module, cls, env_config, options = WORKLOADS[workload]
    config = RunConfig(model=model, output_dir=str(out), rl_env_module=module, rl_env_class=cls,
                       rl_env_config=json.dumps(env_config), batch_size=batch, micro_batch_size=micro,
                       rl_num_generations=4, lora_dropout=0.0, max_steps=1, seed=seed, shared_prefix_loss="on",
                       **options)
    env = load_environment(module, cls, env_config)
    trainer = build_trainer(config, env)
    kept: list[dict] = []
    compute_loss = trainer._compute_loss

    def keep(model_, inputs):  # this benchmark's own trainer: keep what the loss pass is given
        kept.append({k: (v.detach().clone() if isinstance(v, torch.Tensor) else v) for k, v in inputs.items()})
        return compute_loss(model_, inputs)

    trainer._compute_loss = keep
    trainer.train()
    trainer._compute_loss = compute_loss
    return trainer, kept


def joined(part: dict) -> tuple[torch.Tensor, torch.Tensor, int]:
    return (torch.cat([part["prompt_ids"], part["completion_ids"]], 1),
            torch.cat([part["prompt_mask"], part["completion_mask"]], 1), part["completion_ids"].size(1))


def tokens(chunks: list[dict]) -> dict[str, int]:
    """What each way computes over these chunks (module docstring)."""
    from aitrain_grpo.training.step.micro_batches import trim_padding
    from aitrain_grpo.training.step.prefix_tree import build_tree

    counts = {"plain": 0, "rows": 0, "prompt_once": 0, "tree": 0}
    for part in chunks:
        part = trim_padding(part)
        ids, mask, keep = joined(part)
        counts["plain"] += ids.numel()
        counts["rows"] += int(mask.sum())
        prompts = {tuple(p[m.bool()].tolist()) for p, m in zip(part["prompt_ids"], part["prompt_mask"])}
        counts["prompt_once"] += sum(map(len, prompts)) + int(part["completion_mask"].sum())
        counts["tree"] += build_tree(ids, mask, keep).nodes
    return counts


def whole(parts: list[dict]) -> dict:
    return {k: (torch.cat([p[k] for p in parts]) if isinstance(v, torch.Tensor) and v.dim() else v)
            for k, v in parts[0].items()}


def ref_chunks(batch: dict, micro: int, tree: bool) -> list[dict]:
    from aitrain_grpo.training.step.shared_prefix import token_order

    ids, mask, _ = joined(batch)
    order = token_order(ids, mask) if tree else torch.arange(ids.size(0))
    rows = batch["prompt_ids"].size(0)
    return [{k: (v[order[i:i + micro]] if isinstance(v, torch.Tensor) and v.dim() else v) for k, v in batch.items()}
            for i in range(0, rows, micro)]


def clock(device: torch.device) -> float:
    """CPU seconds of this process on a CPU; on an accelerator, wall seconds after its queue drains."""
    if device.type == "cuda":
        torch.cuda.synchronize()
        return time.perf_counter()
    return time.process_time()


def time_loss(trainer, parts: list[dict]) -> tuple[float, float]:
    model = trainer.model
    model.train()
    model.zero_grad(set_to_none=True)
    started, total = clock(trainer.accelerator.device), 0.0
    for part in parts:
        loss = trainer._compute_loss(model, dict(part))
        loss.backward()
        total += loss.item()
    model.zero_grad(set_to_none=True)
    return clock(trainer.accelerator.device) - started, total


def time_ref(trainer, batch: dict, chunk: int) -> tuple[float, torch.Tensor]:
    from trl.trainer.utils import use_adapter

    ids, mask, keep = joined(batch)
    started = clock(trainer.accelerator.device)
    with torch.no_grad(), use_adapter(trainer.model, None):
        logps = trainer._get_per_token_logps_and_entropies(trainer.model, ids, mask, keep, batch_size=chunk)[0]
    return clock(trainer.accelerator.device) - started, logps


def measure(model: str, workload: str, batch: int, micro: int, reps: int, seed: int) -> dict:
    from aitrain_grpo.training.step.micro_batches import scoring_chunk_rows
    from aitrain_grpo.training.step.shared_prefix import SharedPrefix

    with tempfile.TemporaryDirectory() as tmp:
        trainer, parts = play_one_step(model, workload, batch, micro, seed, Path(tmp) / "run")
        data = whole(parts)
        pass_rows = scoring_chunk_rows(data["prompt_ids"].size(0), micro, len(parts))
        times: dict[tuple[str, str], list[float]] = {(p, m): [] for p in ("loss", "ref") for m in ("off", "on")}
        times[("ref_trl_chunks", "on")] = []
        losses, ref = {}, {}
        for rep in range(reps + 1):  # the first round warms up and is not counted
            for mode in ("off", "on"):
                trainer.run.shared_prefix = SharedPrefix(mode)
                seconds, losses[mode] = time_loss(trainer, parts)
                ref_seconds, ref[mode] = time_ref(trainer, data, micro if mode == "off" else pass_rows)
                if rep:
                    times[("loss", mode)].append(seconds)
                    times[("ref", mode)].append(ref_seconds)
            trainer.run.shared_prefix = SharedPrefix("on")
            trl_chunks_seconds, _ = time_ref(trainer, data, micro)
            if rep:
                times[("ref_trl_chunks", "on")].append(trl_chunks_seconds)
        times[("ref_trl_chunks", "off")] = times[("ref", "off")]
        sequences = int((data["prompt_mask"].sum(1) > 1).sum())
    scored = data["completion_mask"] == 1
    return {
        "workload": workload, "batch": batch, "micro": micro, "sequences": sequences, "ref_chunk_rows": pass_rows,
        "loss_tokens": tokens(parts), "ref_tokens": tokens(ref_chunks(data, pass_rows, tree=True)),
        "ref_trl_chunks_tokens": tokens(ref_chunks(data, micro, tree=True)),
        "ref_tokens_plain_order": tokens(ref_chunks(data, micro, tree=False)),
        **{f"{p}_{m}": statistics.median(v) for (p, m), v in times.items()},
        "sum_loss_off": losses["off"], "sum_loss_on": losses["on"],
        "ref_max_logp_diff": float((ref["off"] - ref["on"])[scored].abs().max()),
    }


def table(results: list[dict]) -> str:
    lines = ["| workload | rows (episodes) | pass | tokens: plain / rows / prompt once / tree | tree / plain | "
             "CPU s plain / tree | ratio |", "| --- | --- | --- | --- | --- | --- | --- |"]
    for r in results:
        for name in ("loss", "ref", "ref_trl_chunks"):
            t = r[f"{name}_tokens"]
            plain_t = t["plain"] if name == "loss" else r["ref_tokens_plain_order"]["plain"]
            label = {"ref_trl_chunks": "ref at TRL's chunks"}.get(name, name)
            lines.append(f"| {r['workload']} | {r['sequences']} ({r['batch']}) | {label} | {plain_t} / {t['rows']} / "
                         f"{t['prompt_once']} / {t['tree']} | {t['tree'] / plain_t:.2f} | {r[f'{name}_off']:.2f} / "
                         f"{r[f'{name}_on']:.2f} | **{r[f'{name}_off'] / r[f'{name}_on']:.2f}x** |")
    return "\n".join(lines)


def demo_tokens(path: Path, model: str, micro: int) -> dict:
    """The tokens a pass computes over an `aitrain sft` demonstrations file's sequences (an oracle's
    episodes as a context strategy cut them: each sequence's prompt is the kept history), an episode's
    sequences side by side in passes of `micro` rows, as the loss pass groups a group's rows. Tokens only:
    the oracle's episodes are the same in every sample, so they are not a GRPO group's to time."""
    from aitrain_grpo.models.loading import load_tokenizer, resolve_source

    tokenizer = load_tokenizer(resolve_source(model))
    rows = []
    for line in path.read_text().splitlines():
        demo = json.loads(line)
        for messages in [*demo.get("earlier_messages", []), demo["messages"]]:
            prompt = tokenizer.apply_chat_template(messages[:demo["prompt_length"]], add_generation_prompt=True,
                                                   tokenize=True, return_dict=False)
            whole = tokenizer.apply_chat_template(messages, tokenize=True, return_dict=False)
            rows.append((list(prompt), list(whole[len(prompt):])))
    parts = []
    for i in range(0, len(rows), micro):
        chunk = rows[i:i + micro]
        width, length = max(len(p) for p, _ in chunk), max(len(c) for _, c in chunk)
        parts.append({
            "prompt_ids": torch.tensor([[0] * (width - len(p)) + p for p, _ in chunk]),
            "prompt_mask": torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p, _ in chunk]),
            "completion_ids": torch.tensor([c + [0] * (length - len(c)) for _, c in chunk]),
            "completion_mask": torch.tensor([[1] * len(c) + [0] * (length - len(c)) for _, c in chunk]),
        })
    return {"demos": str(path), "sequences": len(rows), "micro": micro, "tokens": tokens(parts)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=list(WORKLOADS))
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--micro", type=int, default=4)
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--seed", type=int, default=3)
    parser.add_argument("--json", type=Path, help="also write the raw results here")
    parser.add_argument("--record", type=Path, help="append the table to this markdown file")
    parser.add_argument("--demos", type=Path, help="count the tokens of an sft demos.jsonl's sequences instead")
    parser.add_argument("--check", type=float, metavar="TOL",
                        help="exit 1 when the two reference passes' log-probs differ by more than TOL, or the summed "
                             "losses by more than TOL relative (benchmarks/gpu_check.py: 0.1 for bfloat16)")
    args = parser.parse_args()
    if args.demos:
        print(json.dumps(demo_tokens(args.demos, args.model, args.micro)))
        return
    results = []
    for workload in args.workloads:
        r = measure(args.model, workload, args.batch, args.micro, args.reps, args.seed)
        print(json.dumps(r), flush=True)
        results.append(r)
    text = table(results)
    print(text)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    if args.check is not None:
        off = [r for r in results if r["ref_max_logp_diff"] > args.check
               or abs(r["sum_loss_on"] - r["sum_loss_off"]) > args.check * max(abs(r["sum_loss_off"]), 1e-3)]
        if off:
            print("prefix tree differs from the plain path: " + ", ".join(
                f"{r['workload']} (log-prob {r['ref_max_logp_diff']:.3g}, loss {r['sum_loss_on']:.6g} vs "
                f"{r['sum_loss_off']:.6g})" for r in off))
            raise SystemExit(1)
    if args.record:
        with args.record.open("a") as f:
            f.write(f"\n### {args.model}, batch {args.batch}, micro {args.micro}, {time.strftime('%Y-%m-%d')}\n\n"
                    f"```bash\nOMP_NUM_THREADS=1 python benchmarks/prefix_tree.py --model {args.model} --batch "
                    f"{args.batch} --micro {args.micro} --reps {args.reps} --seed {args.seed}\n```\n\n{text}\n")


if __name__ == "__main__":
    main()
