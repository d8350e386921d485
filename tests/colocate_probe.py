"""Run by test_vllm_colocate.py in a process of its own (a colocated engine sets process-wide
distributed state): trains with colocated vLLM, and just before the last optimizer step, when the
engine should hold exactly the weights the trainer has, records the engine's and the policy's
log-probabilities of the same sampled tokens for a few fixed prompts.

    python tests/colocate_probe.py RESULT.json MODEL_DIR OUTPUT_DIR STEPS LR

Left out: every assertion (the test makes them, against the base model too).
"""

from __future__ import annotations

import json
import sys

import torch
from transformers import TrainerCallback

from aitrain_grpo.config import RunConfig
from aitrain_grpo.engine.backends.base import SamplingParams
from aitrain_grpo.engine.backends.vllm_colocate import VLLMColocateBackend
from aitrain_grpo.training.trainer import build_trainer

PROMPTS = ["Task 3: write something with many as.", "Task 5: write something with many bs.", "Say hello."]
TOKENS_PER_PROMPT = 16


def prompt_ids(tokenizer, text: str) -> list[int]:
    rendered = tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True)
    return tokenizer(rendered, add_special_tokens=False)["input_ids"]


def policy_logprobs(model, prompt: list[int], tokens: list[int]) -> list[float]:
    was_training = model.training
    model.eval()  # no LoRA dropout while measuring
    try:
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([prompt + tokens])).logits[0, len(prompt) - 1:-1].float()
    finally:
        model.train(was_training)
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(tokens)[:, None])[:, 0].tolist()


class RecordBeforeLastOptimizerStep(TrainerCallback):
    def __init__(self, result_path: str, last_step: int):
        self.result_path = result_path
        self.last_step = last_step
        self.trainer = None

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        if state.global_step != self.last_step - 1:  # steps done so far; the last rollout has just run
            return
        trainer = self.trainer
        tokenizer = trainer.processing_class
        prompts = [prompt_ids(tokenizer, text) for text in PROMPTS]
        engine = VLLMColocateBackend(trainer.vllm_generation.llm, stop_ids=[])
        samples = engine.generate(prompts, TOKENS_PER_PROMPT, SamplingParams(temperature=1.0, top_k=0, top_p=1.0))
        model = trainer.accelerator.unwrap_model(trainer.model)
        result = {
            "prompts": prompts,
            "tokens": [s.token_ids for s in samples],
            "engine": [s.logprobs for s in samples],
            "policy": [policy_logprobs(model, p, s.token_ids) for p, s in zip(prompts, samples)],
        }
        with open(self.result_path, "w") as sink:
            json.dump(result, sink)


def main(result_path: str, model_dir: str, output_dir: str, steps: str, lr: str) -> None:
    config = RunConfig(
        model=model_dir, output_dir=output_dir, overwrite=True, rl_env_module="envs.letters", rl_env_class="LetterEnv",
        lr=float(lr), rl_kl_coef=0.0, rl_max_new_tokens=24, max_steps=int(steps), use_vllm=True, vllm_mode="colocate",
    )
    recorder = RecordBeforeLastOptimizerStep(result_path, int(steps))
    trainer = build_trainer(config, callbacks=[recorder])
    recorder.trainer = trainer
    trainer.train()


if __name__ == "__main__":
    main(*sys.argv[1:])
