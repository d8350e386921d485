"""Figure 3 of the rollout benchmark: one GRPO training step of aitrain-grpo against TRL's own
multi-turn tool loop, `GRPOTrainer(environment_factory=...)`, on workload C.

Both trainers get the same GRPOConfig (built by `training.grpo_config` from one RunConfig), the same
tiny model and LoRA adapter, the same dataset, and equivalent environments (`LookupToolEnv`,
`TRLLookupEnv`). Under `scripted_turns` every generate call samples a fixed script: a `lookup` call on
turns 1-3 and a plain answer on turn 4, 32 tokens each, so both trainers run 4 model turns and 3 tool
replies per episode and the comparison is of the machinery, not of what a random model happens to say.

The two trainers alternate, one step each (`trainer.train()` with `max_steps=1`, which replays the
same first batch every time because the seed is fixed); `StepTimer` measures from `on_step_begin` to
`on_step_end`: rollout, rewards, reference and policy forward/backward, optimizer step. A wrapper
around each trainer's `_generate` times the generation phase (rollout) alone.

Left out: vLLM (TRL's tool loop and ours would both delegate generation to it; the HF path shows the
difference in the loop itself) and logging/saving, which happen outside the timed step.
"""

from __future__ import annotations

import contextlib
import io
import tempfile
import time
from pathlib import Path

from transformers import TrainerCallback

from workloads import TRLLookupEnv, LookupToolEnv, scripted_turns, turn_scripts, NEW_TOKENS, TURNS


class StepTimer(TrainerCallback):
    def __init__(self):
        self.steps: list[float] = []
        self.model_tokens: list[float] = []  # TRL's completions/mean_length: model tokens per episode
        self._started = 0.0

    def on_step_begin(self, args, state, control, **kwargs):
        self._started = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        self.steps.append(time.perf_counter() - self._started)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and "completions/mean_length" in logs:
            self.model_tokens.append(logs["completions/mean_length"])


def _time_generation(trainer) -> dict[str, list[float]]:
    """Record how long each call of the trainer's `_generate` (the rollout) takes, and the tokens per
    episode after the prompt (model and environment) it returns, to check both trainers did the same."""
    record: dict[str, list[float]] = {"seconds": [], "completion_tokens": []}
    original = trainer._generate

    def timed(prompts):
        started = time.perf_counter()
        out = original(prompts)
        record["seconds"].append(time.perf_counter() - started)
        completion_ids = out[1]
        record["completion_tokens"].append(sum(len(ids) for ids in completion_ids) / len(completion_ids))
        return out

    trainer._generate = timed
    return record


def _run_config(model_path: str, output_dir: Path, episodes: int, generations: int):
    from aitrain_grpo import RunConfig

    return RunConfig(
        model=model_path, output_dir=str(output_dir), rl_env_module="workloads", rl_env_class="LookupToolEnv",
        batch_size=episodes, rl_num_generations=generations, rl_max_new_tokens=NEW_TOKENS,
        rl_max_completion_length=1024, rl_top_k=0, max_steps=1, log_episodes_every=0, logging_steps=1,
    )


def build_ours(model_path: str, output_dir: Path, episodes: int, generations: int):
    from aitrain_grpo.training.trainer import build_trainer

    config = _run_config(model_path, output_dir, episodes, generations)
    env = LookupToolEnv(num_tasks=episodes // generations)
    return build_trainer(config, env=env)


def build_trl(model_path: str, output_dir: Path, episodes: int, generations: int):
    from datasets import Dataset
    from transformers.trainer_callback import PrinterCallback, ProgressCallback
    from trl import GRPOTrainer
    from trl.chat_template_utils import qwen3_template

    from aitrain_grpo.models.loading import load_model_and_tokenizer
    from aitrain_grpo.training.run.plan import plan_run
    from aitrain_grpo.training.trl.hf_args import lora_config
    from aitrain_grpo.training.trainer import grpo_config

    config = _run_config(model_path, output_dir, episodes, generations)
    model, tokenizer = load_model_and_tokenizer(model_path)
    # The tiny model's template writes tool calls the way Qwen's does; TRL only recognises the
    # templates it ships, so it is told which response parser applies.
    tokenizer.response_template = qwen3_template
    rows = LookupToolEnv(num_tasks=episodes // generations).build_dataset(tokenizer)
    trainer = GRPOTrainer(
        model=model, args=grpo_config(config, plan_run(config)), train_dataset=Dataset.from_list(rows),
        processing_class=tokenizer, environment_factory=TRLLookupEnv, peft_config=lora_config(config),
    )
    trainer.remove_callback(PrinterCallback)
    trainer.remove_callback(ProgressCallback)
    return trainer


def compare(model_path: str, *, episodes: int = 64, generations: int = 4, reps: int = 5, warmup: int = 1) -> dict:
    """Alternate one training step of each trainer; returns per-rep step and rollout seconds and the
    work each did (model tokens per episode, turns)."""
    from transformers import AutoTokenizer, LlamaForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(model_path)
    scripts = turn_scripts(tokenizer)
    marker = tokenizer.convert_tokens_to_ids("<tool_response>")
    with tempfile.TemporaryDirectory(prefix="aitrain-bench-") as tmp, scripted_turns(LlamaForCausalLM, scripts, marker):
        trainers = {
            "aitrain": build_ours(model_path, Path(tmp) / "ours", episodes, generations),
            "trl": build_trl(model_path, Path(tmp) / "trl", episodes, generations),
        }
        timers, rollouts = {}, {}
        for name, trainer in trainers.items():
            timers[name] = StepTimer()
            trainer.add_callback(timers[name])
            rollouts[name] = _time_generation(trainer)
        overheads = []
        for _ in range(warmup + reps):
            for name, trainer in trainers.items():
                with contextlib.redirect_stdout(io.StringIO()):
                    trainer.train()
                if name == "aitrain":
                    batch = trainer.rollout.last_batch
                    overheads.append((batch.wall_seconds - batch.generate_seconds) / batch.wall_seconds)
        result = {
            name: {
                "step_seconds": timers[name].steps[warmup:],
                "rollout_seconds": rollouts[name]["seconds"][warmup:],
                "completion_tokens_per_episode": rollouts[name]["completion_tokens"][-1],
                "model_tokens_per_episode": timers[name].model_tokens[-1],
            }
            for name in trainers
        }
        result["aitrain"]["turns_per_episode"] = sum(ep.turns for ep in batch.episodes) / len(batch.episodes)
        result["aitrain"]["tool_calls_per_episode"] = sum(ep.num_tool_calls for ep in batch.episodes) / len(batch.episodes)
        result["aitrain"]["overhead"] = overheads[warmup:]
        result["expected_model_tokens_per_episode"] = TURNS * NEW_TOKENS
    return result
