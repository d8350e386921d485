"""The short envs.letters run that the resume and preemption tests train, stop and resume: five steps of
eight episodes on the tiny model, a checkpoint at step 3, a fixed seed."""

from __future__ import annotations

from pathlib import Path

from aitrain_grpo.config import RunConfig


def letters_config(output_dir: Path, **overrides) -> RunConfig:
    options = dict(
        rl_env_module="envs.letters", rl_env_class="LetterEnv", model="tiny", output_dir=str(output_dir),
        batch_size=8, rl_max_new_tokens=16, max_steps=5, save_steps=3, lr=1e-3, seed=7,
    )
    return RunConfig(**{**options, **overrides})
