"""The shared-prefix loss on a CUDA GPU: is it exact there (float32 and bfloat16, SDPA attention), and
what does it save per pass? The CPU measurement is benchmarks/shared_prefix.py; results in
benchmarks/SHARED_PREFIX.md.

SmolLM2-135M's architecture with random weights (a pass costs the same whatever the weights; the real
ones are not on the GPU machine), TRL's fused LM head, a LoRA adapter (r 16, all linear layers, B made
non-zero). Per workload (`tool`: 4 prompts of 350-365 tokens, 48-80 completion tokens; `rewrite`:
prompts of 36-43 tokens, 70-130 completion tokens; groups of 4, 16 episodes), and micro-batch size:

- exactness: per-token log-probs, entropies and the LoRA gradients of a GRPO-shaped loss, shared
  against plain, in float32; in bfloat16 the shared path's distance from the plain one beside the
  plain bfloat16 path's own distance from float32 (bfloat16's rounding);
- time: the loss forward and backward over the 16 episodes in micro-batches (groups kept together), and
  the no-gradient reference pass, median of 5 after 2 warm-ups, each path in the same process.

    python benchmarks/shared_prefix_gpu.py     # needs torch (CUDA), transformers, peft, accelerate, trl

It imports step/shared_prefix.py without the package's `__init__` (whose other dependencies the GPU machine
lacks). Left out: gradient checkpointing (TRL's default on a GPU, with which the loss pass takes the
plain path: the timings here are with it off) and the trainer around the passes.
"""

from __future__ import annotations

import statistics
import sys
import time
import types
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent
package = types.ModuleType("aitrain_grpo")
package.__path__ = [str(REPO / "aitrain_grpo")]
config_module = types.ModuleType("aitrain_grpo.config")
config_module.SHARED_PREFIX_MODES = ("auto", "on", "off")
sys.modules.update({"aitrain_grpo": package, "aitrain_grpo.config": config_module})
from aitrain_grpo.training.step.shared_prefix import SharedPrefix, per_token_logps  # noqa: E402

SMOLLM2 = dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
               num_key_value_heads=3, head_dim=64, vocab_size=49152, max_position_embeddings=8192,
               tie_word_embeddings=True, rms_norm_eps=1e-5, rope_parameters={"rope_theta": 100000.0,
                                                                             "rope_type": "default"})
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # cpu: a smoke run (`--layers 2`)
WORKLOADS = {"tool": ((350, 365), (48, 80)), "rewrite": ((36, 43), (70, 130))}


def build(dtype):
    from accelerate import Accelerator
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM
    from trl.trainer.utils import add_fused_lm_head

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**SMOLLM2, attn_implementation="sdpa")).to(DEVICE, dtype)
    add_fused_lm_head(model, outputs=("log_probs", "entropy"))
    model = get_peft_model(model, LoraConfig(r=16, lora_alpha=32, target_modules="all-linear", lora_dropout=0.0,
                                             task_type="CAUSAL_LM"))
    for name, parameter in model.named_parameters():
        if "lora_B" in name:
            parameter.data.normal_(0, 0.02)
    model.train()
    return model, types.SimpleNamespace(accelerator=Accelerator(), shared_prefix=SharedPrefix("on"))


def batch(workload: str, rows: int = 16, seed: int = 0):
    (p_low, p_high), (c_low, c_high) = WORKLOADS[workload]
    g = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(10, 49000, (int(torch.randint(p_low, p_high + 1, (1,), generator=g)),), generator=g)
               for _ in range(rows // 4)]
    ids = torch.zeros(rows, p_high + c_high, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for r in range(rows):
        p = prompts[r // 4]
        c = int(torch.randint(c_low, c_high + 1, (1,), generator=g))
        ids[r, p_high - len(p):p_high] = p
        ids[r, p_high:p_high + c] = torch.randint(10, 49000, (c,), generator=g)
        mask[r, p_high - len(p):p_high + c] = 1
    loss_mask = mask[:, p_high:].clone()
    loss_mask[:, c_low // 3:c_low // 3 + 12] = 0  # an environment reply
    advantages = torch.randn(rows, generator=g)
    return ids.to(DEVICE), mask.to(DEVICE), c_high, loss_mask.to(DEVICE), advantages.to(DEVICE)


def plain(model, ids, mask, keep):  # TRL's `_get_per_token_logps_and_entropies` on one chunk
    labels = ids.masked_fill(mask == 0, -100)
    labels[:, :-keep] = -100
    out = model(input_ids=ids, attention_mask=mask, labels=labels, fused_lm_head=True)
    return out.log_probs[:, -keep:], out.entropy[:, -keep:]


def logps(model, trainer, shared, ids, mask, keep, chunk):
    if not shared:
        parts = [plain(model, ids[i:i + chunk], mask[i:i + chunk], keep) for i in range(0, ids.size(0), chunk)]
        return torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])
    got = per_token_logps(trainer.accelerator, trainer.shared_prefix, model, ids, mask, keep, chunk, True, lambda i, m: plain(model, i, m, keep))
    return got[0], got[1]


def loss_pass(model, trainer, shared, data, chunk):
    ids, mask, keep, loss_mask, advantages = data
    for i in range(0, ids.size(0), chunk):
        lp, entropy = logps(model, trainer, shared, ids[i:i + chunk], mask[i:i + chunk], keep, chunk)
        m = loss_mask[i:i + chunk].to(lp.dtype)
        ratio = torch.exp(lp - lp.detach())
        loss = -(ratio * advantages[i:i + chunk, None] * m).sum() / loss_mask.sum() - 0.01 * (entropy * m).mean()
        loss.backward()


def exactness(workload: str, chunk: int) -> str:
    out = {}
    for dtype in (torch.float32, torch.bfloat16):
        model, trainer = build(dtype)
        data = batch(workload)
        for shared in (False, True):
            model.zero_grad(set_to_none=True)
            loss_pass(model, trainer, shared, data, chunk)
            grads = {n: p.grad.float().clone() for n, p in model.named_parameters() if p.grad is not None}
            with torch.no_grad():
                lp, entropy = logps(model, trainer, shared, *data[:3], chunk)
            out[dtype, shared] = (lp.float(), entropy.float(), grads)
        shared_chunks = trainer.shared_prefix.shared_chunks
        del model
    scored = batch(workload)[1][:, -batch(workload)[2]:].bool()

    def diff(a, b):
        lp = (a[0] - b[0])[scored].abs().max().item()
        grad = max(((a[2][n] - b[2][n]).abs().max() / b[2][n].abs().max().clamp(min=1e-12)).item() for n in b[2])
        return f"log-prob {lp:.1e}, entropy {(a[1] - b[1])[scored].abs().max().item():.1e}, grad (rel.) {grad:.1e}"

    f32, bf16 = torch.float32, torch.bfloat16
    return (f"{workload} micro {chunk} ({shared_chunks} chunks shared): fp32 shared vs plain: {diff(out[f32, True], out[f32, False])}; "
            f"bf16 shared vs plain: {diff(out[bf16, True], out[bf16, False])}; "
            f"bf16 plain vs fp32 plain: {diff(out[bf16, False], out[f32, False])}")


def timing(workload: str, chunk: int, dtype) -> str:
    model, trainer = build(dtype)
    data = batch(workload)
    seconds = {}
    for shared in (False, True):
        for kind in ("loss", "ref"):
            times = []
            for rep in range(7):
                sync()
                started = time.perf_counter()
                if kind == "loss":
                    model.zero_grad(set_to_none=True)
                    loss_pass(model, trainer, shared, data, chunk)
                else:
                    with torch.no_grad(), model.disable_adapter():
                        logps(model, trainer, shared, *data[:3], chunk)
                sync()
                if rep >= 2:
                    times.append(time.perf_counter() - started)
            seconds[kind, shared] = statistics.median(times)
    tokens = int(data[1].sum()) // data[1].size(0)
    return (f"| {workload} | 16 / {chunk} | {str(dtype).split('.')[-1]} | {tokens} | "
            f"{seconds['loss', False] * 1e3:.0f} / {seconds['loss', True] * 1e3:.0f} | "
            f"**{seconds['loss', False] / seconds['loss', True]:.2f}x** | "
            f"{seconds['ref', False] * 1e3:.0f} / {seconds['ref', True] * 1e3:.0f} | "
            f"**{seconds['ref', False] / seconds['ref', True]:.2f}x** |")


def sync() -> None:
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def main() -> None:
    if "--layers" in sys.argv:  # a smoke run: fewer layers
        SMOLLM2["num_hidden_layers"] = int(sys.argv[sys.argv.index("--layers") + 1])
    print(torch.cuda.get_device_name() if DEVICE == "cuda" else "cpu", torch.__version__, flush=True)
    for workload in WORKLOADS:
        print(exactness(workload, 4), flush=True)
    print("| workload | episodes / micro | dtype | tokens an episode | loss ms plain / shared | ratio | "
          "ref ms plain / shared | ratio |\n| --- | --- | --- | --- | --- | --- | --- | --- |", flush=True)
    for workload in WORKLOADS:
        for chunk in (4, 16):
            for dtype in (torch.bfloat16, torch.float32):
                print(timing(workload, chunk, dtype), flush=True)


if __name__ == "__main__":
    main()
