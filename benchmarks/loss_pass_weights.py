"""No second scoring forward, checked on whatever device trains: one step with vLLM's importance-sampling
correction on (sampler log-probabilities moved off the trainer's, as a server's are), then one of its
micro-batches through TRL's loss twice: with the weights the loss pass computes from its own log-probabilities
(training/step/loss.py) and with TRL's way (a forward of its own for the old policy, then the ratio). Loss
and gradients must agree within the device's rounding.

    python benchmarks/loss_pass_weights.py --model tiny            # CPU: float32, tight tolerance
    python benchmarks/loss_pass_weights.py --model tiny --tolerance 2e-2   # a GPU in bf16 (gpu_check.py)

Exits 0 when they agree, 1 naming the largest difference. tests/test_no_second_forward.py is the same check
on a CPU in the test suite; this script is what benchmarks/gpu_check.py runs on a GPU.

Left out: vLLM itself (the sampler's log-probabilities are simulated: the loss pass does not see who sampled).
"""

from __future__ import annotations

import argparse
import copy
import sys
import tempfile

import torch


def off_policy(trainer, shift: float = 0.3) -> None:
    """Before training: the correction on (token level, truncated), as the trainer turns it on where this
    package moves vLLM's weights, and the sampler's log-probabilities moved off the trainer's by up to
    `shift` a token, as a server's are (tests/helpers/rollouts.py uses this one too)."""
    run = trainer.rollout.engine.run

    def play(rows):
        batch = run(rows)
        for trace in batch.traces:
            trace.logprobs = [p + shift * (j % 3 - 1) for j, p in enumerate(trace.logprobs)]
        return batch

    trainer.rollout.engine.run = play
    trainer.use_importance_sampling()
    trainer.vllm_importance_sampling_correction, trainer.vllm_importance_sampling_mode = True, "token_truncate"


def loss_and_grads(trainer, inputs) -> tuple[float, list[torch.Tensor]]:
    trainer.model.zero_grad()
    loss = trainer._compute_loss(trainer.model, inputs)
    loss.backward()
    grads = [p.grad.detach().float().clone() for p in trainer.model.parameters() if p.grad is not None]
    trainer.model.zero_grad()
    return loss.item(), grads


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--tolerance", type=float, default=1e-4, help="relative, on the loss and each gradient")
    args = parser.parse_args()

    from aitrain_grpo import RunConfig
    from aitrain_grpo.training.step.batch import loss_mask
    from aitrain_grpo.training.step.loss import loss_inputs
    from aitrain_grpo.training.step.scoring import importance_ratio
    from aitrain_grpo.training.trainer import build_trainer

    with tempfile.TemporaryDirectory() as folder:
        config = RunConfig(model=args.model, output_dir=f"{folder}/run", rl_env_module="envs.letters",
                           rl_env_class="LetterEnv", max_steps=1, batch_size=8, micro_batch_size=4,
                           rl_num_generations=4, rl_max_new_tokens=10, seed=2, peft=False, rl_kl_coef=0.05)
        trainer = build_trainer(config)
        off_policy(trainer)
        trainer.train()
        trainer.model.train()
        inputs = loss_inputs(trainer._micro_batches[0], drop_masked_rows=False)
        ours_in, trl_in = copy.copy(inputs), copy.copy(inputs)
        with torch.no_grad():
            ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
            mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
            old = trainer._get_per_token_logps_and_entropies(trainer.model, ids, mask, inputs["completion_ids"].shape[1])[0]
        trl_in["old_per_token_logps"] = old
        trl_in["importance_sampling_ratio"] = importance_ratio(
            old, inputs["sampling_per_token_logps"], loss_mask(inputs), mode="token_truncate",
            low=trainer.vllm_importance_sampling_clip_min, high=trainer.vllm_importance_sampling_clip_max)
        ours, ours_grads = loss_and_grads(trainer, ours_in)
        trls, trl_grads = loss_and_grads(trainer, trl_in)
    worst = abs(ours - trls) / max(abs(trls), 1e-8)
    for a, b in zip(ours_grads, trl_grads):
        worst = max(worst, ((a - b).abs().max() / b.abs().max().clamp(min=1e-12)).item())
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if worst > args.tolerance:
        print(f"error: loss-pass importance weights differ from TRL's way on {device}: largest relative "
              f"difference {worst:.2e} > {args.tolerance:g}", file=sys.stderr)
        return 1
    print(f"loss-pass importance weights equal TRL's way on {device}: largest relative difference {worst:.2e} "
          f"(loss {ours:.6f} vs {trls:.6f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
