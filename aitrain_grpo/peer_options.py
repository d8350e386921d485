"""Other trainers' names for this package's options, so a refused option says what it is called here.

A user arriving from TRL (`GRPOConfig`, `TrainingArguments`, `ModelConfig`), axolotl or verifiers writes
`--learning-rate`, `num_generations: 8` or `beta: 0.04` and gets "no such option" with a guess by
spelling (`--logging-steps`). The table maps each such name to the option that does the same job here,
with what differs when the units differ (TRL's `per_device_train_batch_size` counts completions; aitrain's
`micro_batch_size` counts episodes). The names are refused rather than taken as aliases: one name per
option, and a copied config whose units differ should be read, not run.

Left out: names that are the same here (`max_steps`, `seed`, `output_dir`, ...), and peer options with no
counterpart here, which stay plain unknown options.
"""

from __future__ import annotations

# peer name (a config key; the flag is the same with dashes) -> (aitrain's option, whose name, what differs)
PEER_NAMES: dict[str, tuple[str, str, str]] = {
    "learning_rate": ("lr", "TRL's and axolotl's", ""),
    "num_generations": ("rl_num_generations", "TRL's", ""),
    "rollouts_per_example": ("rl_num_generations", "verifiers'", ""),
    "max_completion_length": ("rl_max_completion_length", "TRL's",
                              "the token budget after the prompt, environment tokens included "
                              "(a model turn's own limit is rl_max_new_tokens)"),
    "max_tokens": ("rl_max_new_tokens", "verifiers'", "a limit per model turn"),
    "max_tool_calling_iterations": ("rl_max_turns", "TRL's", "counting model turns"),
    "temperature": ("rl_temperature", "TRL's", ""),
    "top_k": ("rl_top_k", "TRL's", ""),
    "top_p": ("rl_top_p", "TRL's", ""),
    "min_p": ("rl_min_p", "TRL's", ""),
    "repetition_penalty": ("rl_repetition_penalty", "TRL's", ""),
    "beta": ("rl_kl_coef", "TRL's", ""),
    "kl_coef": ("rl_kl_coef", "the usual", ""),
    "epsilon": ("rl_clip_range", "TRL's", ""),
    "loss_type": ("rl_loss_type", "TRL's", ""),
    "epsilon_high": ("rl_clip_range_high", "TRL's", ""),
    "num_iterations": ("rl_num_iterations", "TRL's", ""),
    "importance_sampling_level": ("rl_importance_sampling", "TRL's", ""),
    "scale_rewards": ("rl_scale_rewards", "TRL's", ""),
    "multi_objective_aggregation": ("rl_reward_aggregation", "TRL's", ""),
    "mask_truncated_completions": ("rl_mask_truncated", "TRL's",
                                   "masking episodes a budget, the context window or the turn cap cut"),
    "entropy_coef": ("rl_entropy_coef", "TRL's", ""),
    "delta": ("rl_delta", "TRL's", ""),
    "use_bias_correction_kl": ("rl_kl_bias_correction", "TRL's", ""),
    "sync_ref_model": ("rl_ref_sync_steps", "TRL's", "a number of optimizer steps between syncs, 0 for none"),
    "ref_model_sync_steps": ("rl_ref_sync_steps", "TRL's", ""),
    "ref_model_mixup_alpha": ("rl_ref_mixup_alpha", "TRL's", ""),
    "vllm_importance_sampling_mode": ("rl_importance_correction", "TRL's", ""),
    "vllm_importance_sampling_clip_max": ("rl_importance_cap", "TRL's", ""),
    "vllm_importance_sampling_clip_min": ("rl_importance_floor", "TRL's", ""),
    "top_entropy_quantile": ("rl_top_entropy_quantile", "TRL's", ""),
    "off_policy_mask_threshold": ("rl_off_policy_mask", "TRL's", ""),
    "entropy_target": ("rl_entropy_target", "TRL's", "which alone turns the adaptive bonus on"),
    "use_adaptive_entropy": ("rl_entropy_target", "TRL's", "the adaptive bonus is on when a target is given"),
    "reward_funcs": ("rl_reward_funcs", "TRL's", "module:function names added to the environment's score"),
    "reward_weights": ("rl_reward_weights", "TRL's", "the environment's score first"),
    "reward_model_path": ("rl_reward_model", "TRL's (PPO, RLOO)", "a one-label sequence classifier, weighted last"),
    "per_device_train_batch_size": ("micro_batch_size", "TRL's",
                                    "counting episodes a forward/backward pass, where TRL counts completions"),
    "generation_batch_size": ("batch_size", "TRL's", "counting the episodes a device plays for a step"),
    "num_train_epochs": ("epochs", "TRL's", ""),
    "lr_scheduler_type": ("lr_scheduler", "TRL's", ""),
    "warmup_ratio": ("warmup_steps", "TRL's and axolotl's", "a fraction of the run's steps when below 1"),
    "num_epochs": ("epochs", "axolotl's", ""),
    "eval_steps": ("eval_every", "TRL's", "held-back tasks every N steps"),
    "early_stopping_patience": ("eval_patience", "HF's and axolotl's", "with --save-best naming the metric"),
    "model_name_or_path": ("model", "TRL's", ""),
    "base_model": ("model", "axolotl's", ""),
    "use_peft": ("peft", "TRL's", "on by default (--no-peft trains every weight)"),
    "adapter": ("peft", "axolotl's", "LoRA, on by default (--no-peft trains every weight)"),
    "lora_target_modules": ("target_modules", "TRL's and axolotl's", ""),
    "peft_use_dora": ("use_dora", "axolotl's", ""),
    "peft_use_rslora": ("use_rslora", "axolotl's", ""),
    "optimizer": ("optim", "axolotl's", "transformers' optimizer names, as axolotl's"),
    "gradient_checkpointing": ("activation_checkpointing", "TRL's and axolotl's",
                               "transformers' newer name; default on with CUDA, off on a CPU"),
    "vllm_server_base_url": ("vllm_server_url", "TRL's", ""),
    "vllm_server_host": ("vllm_server_url", "TRL's", "one URL with host and port, e.g. http://127.0.0.1:8000"),
    "vllm_server_port": ("vllm_server_url", "TRL's", "one URL with host and port, e.g. http://127.0.0.1:8000"),
}


def ours_for(name: str) -> str | None:
    """This package's option (a `RunConfig` field) for a peer's `name` (a config key, or a flag with its
    dashes), or None when no peer names one of this package's options so."""
    entry = PEER_NAMES.get(name.lstrip("-").replace("-", "_"))
    return entry[0] if entry else None


def peer_name_hint(name: str, *, as_flag: bool) -> str | None:
    """Whose name `name` is and what it is called here, e.g. "TRL's name; aitrain's is --rl-kl-coef",
    or None (see `ours_for`). `as_flag` spells the answer as a flag."""
    if ours_for(name) is None:
        return None
    ours, whose, differs = PEER_NAMES[name.lstrip("-").replace("-", "_")]
    ours = "--" + ours.replace("_", "-") if as_flag else ours
    return f"{whose} name; aitrain's is {ours}" + (f", {differs}" if differs else "")
