"""`RunConfig`: every option of a training run in one typed place.

The CLI flags, `--config file.yaml|json` and the Python API (`train(RunConfig(...))`) all land here;
flag `--rl-num-generations` is field `rl_num_generations`. `validate()` checks the whole config before
anything heavy is loaded and raises `ConfigError` with one line naming the problem and the fix.
`run_config.json` in the output directory is `to_dict()`: enough to reproduce the run.

Left out: translating to TRL's `GRPOConfig` (training.py) and parsing flags (cli.py).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Mapping

from aitrain_grpo.env_spec import check_environment_named, env_specs, environment_of, spec_label
from aitrain_grpo.errors import ConfigError
from aitrain_grpo.option_effects import check_curriculum_reachable, check_loss_options, check_reference_sync
from aitrain_grpo.optimizers import check_optimizer
from aitrain_grpo.config_file import read_options_file
from aitrain_grpo.option_rules import (NON_NEGATIVE, POSITIVE, POSITIVE_SECONDS, Bound, at_least, check_bound,
                                        check_judge, check_save_best, check_seed, count, reward_func_specs, template_kwargs,
                                        typed_values,
                                        reward_weights, server_urls)


_SECTION = ["options"]


def _section(name: str) -> None:
    """Start a section of `RunConfig`'s fields (called in the class body): the fields declared after it
    carry `name` in their metadata, which docs/options.md groups by."""
    _SECTION[0] = name


def _opt(default: Any, help: str, *, choices: tuple[str, ...] | None = None, bound: Bound | None = None,
         minimum: int | None = None) -> Any:
    """A field with its help, its section, and what `check_options` checks declaratively: the values it
    may take (`choices`; None always passes) and its range (`bound`; `minimum`: an integer's lowest)."""
    if minimum is not None:
        bound = at_least(minimum)
    return field(default=default, metadata={"help": help, "choices": choices, "bound": bound, "section": _SECTION[0]})


def check_options(values: Mapping[str, Any]) -> None:
    """Check each option in `values` (RunConfig field names; None values and other names are skipped)
    against its field's declared choices and range, raising `ConfigError` on the first that fails.
    `RunConfig.validate` checks every field this way; `aitrain eval` and `aitrain env check` check the
    episode options they take with the same rules and messages."""
    for f in fields(RunConfig):
        if f.name not in values or values[f.name] is None:
            continue
        value, flag = values[f.name], "--" + f.name.replace("_", "-")
        choices, bound = f.metadata.get("choices"), f.metadata.get("bound")
        if choices and value not in choices:
            raise ConfigError(f"{flag} {value!r} is not one of {', '.join(choices)}")
        if bound is not None:
            check_bound(flag, bound, value)


VLLM_MODES = ("colocate", "server")
VLLM_SYNC = ("auto", "nccl", "lora", "disk")
REPORT_TO = ("none", "tensorboard", "wandb", "trackio")
LOSS_TYPES = ("grpo", "dr_grpo", "dapo", "bnpo", "cispo", "sapo", "luspo", "vespo")
SCALE_REWARDS = ("group", "batch", "none")
REWARD_AGGREGATIONS = ("sum_then_normalize", "normalize_then_sum")  # TRL's multi_objective_aggregation  # TRL's scale_rewards, training/step/advantages.py
# Text options an empty value would switch off unseen (`--output-dir` and `--resume-from-checkpoint` have their own).
VALUE_NEEDED = ("optim", "lora_modules_to_save", "rl_reward_model", "rl_reward_funcs", "rl_reward_weights", "rl_judge_rubric", "rl_judge_model",
                "rl_judge_url", "vllm_server_url", "eval_env_module", "eval_env_class", "save_best")
IMPORTANCE_LEVELS = ("token", "sequence")  # TRL's importance_sampling_level
IMPORTANCE_CORRECTIONS = ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask")  # TRL's vLLM modes
CUT_TURN = ("end", "continue")
# "continue" serves multi-turn learning better (benchmarks/LEARNING.md): a cut turn still reaches the
# environment, so the later turns, which a multi-turn environment trains, are played instead of lost.
DEFAULT_CUT_TURN = "continue"
ROLLOUT_SCHEDULES = ("auto", "continuous", "lockstep")
ZERO_STD_GROUPS = ("keep", "drop", "refill")
ADVANTAGE_MODES = ("outcome", "turn")  # training/step/turn_credit.py
SHARED_PREFIX_MODES = ("auto", "on", "off")  # training/step/shared_prefix.py
# transformers' schedules that need no arguments beyond the warmup (lr_scheduler_type)
LR_SCHEDULERS = ("linear", "cosine", "cosine_with_restarts", "polynomial", "constant", "constant_with_warmup", "inverse_sqrt")
JUDGE_MODES = ("group", "episode")  # training/rewards/judge.py
CURRICULA = ("off", "pools")  # training/rollout/curriculum.py
TOOL_PARSERS = ("auto", "hermes", "json", "llama3_json", "mistral", "pythonic")  # engine/tool_parsers.py
DEFAULT_TOOL_PARSER = "auto"
CONTEXT_STRATEGIES = ("keep", "drop-tool-results", "summarize", "compact")  # engine/context.py
DEFAULT_CONTEXT_KEEP_LAST = 2
# The options of how an episode's history and its budgets are kept (engine/context.py), which `aitrain eval`
# and `aitrain env check` take as training does.
CONTEXT_OPTIONS = ("rl_context", "rl_context_keep_last", "rl_context_threshold", "rl_context_summary_tokens",
                   "rl_context_window", "rl_max_tool_result_tokens", "rl_max_episode_tokens")


@dataclass
class RunConfig:
    """Options of one `aitrain grpo` run. Defaults are the CLI's defaults."""

    _section("model and environment")
    model: str = _opt("tiny", "Model id or path; 'tiny' builds a small local model (no download).")
    output_dir: str | None = _opt(None, "Where the model, checkpoints and logs go (default: outputs/<env class>).")
    rl_env_module: str = _opt("", "Python module of the environment, e.g. envs.hotel (resolved from the current directory).")
    rl_env_class: str = _opt("", "Environment class in that module, e.g. HotelEnv.")
    rl_env_config: Any = _opt(None, "JSON object of keyword arguments for the environment, or @file.json.")
    rl_env: str | list[str] | None = _opt(None, "The environment as KIND:NAME instead of --rl-env-module/--rl-env-class: textarena:GuessTheNumber-v0, reasoning_gym:basic_arithmetic, trl:module:Class, skyrl:module:Class, or module:Class. Repeat it to train on a mixture (--rl-env-config then takes a JSON array, one object per environment).")
    rl_env_weights: str | None = _opt(None, "With --rl-env repeated: each environment's share of the dataset, comma-separated in the same order, e.g. 0.7,0.3 (default: the rows each builds).")
    _section("episodes")
    rl_num_generations: int = _opt(4, "Episodes per prompt (the GRPO group size).", bound=count(65536, "episodes of one prompt"))
    rl_max_new_tokens: int = _opt(128, "Token limit of one model turn.", bound=at_least(1))
    rl_max_turns: int | None = _opt(None, "Cap on model turns per episode (default: the environment's max_turns).", bound=at_least(1))
    rl_max_completion_length: int = _opt(1024, "Token budget after the prompt (model + environment), per training sequence, which is what TRL pads a row to: the whole episode, or each of its sequences when --rl-context rewrites its history.", bound=at_least(1))
    rl_max_episode_tokens: int | None = _opt(None, "Cap on the model tokens of a whole episode, summed over its sequences when its history is rewritten (default: none beyond the turn cap).", bound=at_least(1))
    rl_context_window: int | None = _opt(None, "The model's context window in tokens: an episode whose next turn would not fit it (after its context strategy) ends with stop reason context, scored as it stands (default: the tokenizer's model_max_length).", bound=at_least(2))
    rl_context: str | None = _opt(None, "How an episode's history is kept as it grows: keep (all of it); drop-tool-results (past --rl-context-threshold, older tool results become a short stub, the last --rl-context-keep-last kept whole); summarize (past the threshold, the model writes a summary of the episode, which goes on from the task and that summary); compact (the environment's compact(episode) hook). Each rewrite starts a new training sequence. Default: the environment's context_strategy, else keep.", choices=CONTEXT_STRATEGIES)
    rl_context_keep_last: int = _opt(DEFAULT_CONTEXT_KEEP_LAST, "With --rl-context drop-tool-results: the latest tool results kept whole.", minimum=0)
    rl_context_threshold: int | None = _opt(None, "Tokens of the rendered context (prompt and episode so far) past which drop-tool-results and summarize rewrite the history; they also do when the next turn would not fit (default: three quarters of what a sequence may hold: its prompt plus --rl-max-completion-length, or the context window if smaller).", bound=at_least(1))
    rl_context_summary_tokens: int | None = _opt(None, "With --rl-context summarize: token limit of the summary turn (other turns keep --rl-max-new-tokens); still bounded by the context window and the episode's token budgets. A summary cut off by it ends the episode as an error. Default: the larger of 256 and --rl-max-new-tokens.", bound=at_least(1))
    rl_max_tool_result_tokens: int | None = _opt(None, "Cut a tool or environment result longer than this many tokens to its head and tail with a marker between (counted as env/tool_results_cut; default: no cut).", bound=at_least(16))
    rl_temperature: float = _opt(1.0, "Sampling temperature.", bound=Bound(low=0, high=10, note='0 samples greedily; above 10 a sample is noise'))
    rl_top_k: int = _opt(0, "Top-k sampling (0 = off; with vLLM, filtering biases the importance-sampling ratio).", bound=Bound(low=0, integer=True, note='0 turns it off'))
    rl_top_p: float = _opt(1.0, "Nucleus sampling (1.0 = off).", bound=Bound(low=0, high=1, low_open=True))
    rl_min_p: float = _opt(0.0, "Min-p sampling: tokens below this share of the likeliest token's probability are not drawn (0 = off; with vLLM, filtering biases the importance-sampling ratio).", bound=Bound(low=0, high=1, high_open=True))
    rl_repetition_penalty: float = _opt(1.0, "Repetition penalty on tokens already in the sequence (1.0 = off; above 1 discourages repeats; the log-probabilities trained on stay the policy's own).", bound=Bound(low=0, high=10, low_open=True))
    rl_env_timeout: float = _opt(60.0, "Seconds one environment call (reset/step/score_episode) may take.", bound=POSITIVE_SECONDS)
    chat_template_kwargs: Any = _opt(None, "Variables of the model's chat template as a JSON object (TRL's chat_template_kwargs), e.g. '{\"enable_thinking\": false}' for Qwen3: training, eval, env check, sft and held-back prompts and replies are all rendered with them; a run notes variables the template does not read.")
    rl_tool_parser: str = _opt(DEFAULT_TOOL_PARSER, f"How tool calls are read from the model's text: {', '.join(TOOL_PARSERS)} (auto: Hermes <tool_call> blocks, else one unambiguous call in another form).", choices=TOOL_PARSERS)
    rl_cut_turn: str = _opt(DEFAULT_CUT_TURN, "A model turn cut off by --rl-max-new-tokens: continue (the environment sees the cut turn as it stands, and the episode goes on) or end the episode there.", choices=CUT_TURN)
    rl_rollout_schedule: str = _opt("auto", "continuous: each episode's next turn goes out as soon as its environment replied; lockstep: one batched turn for all episodes; auto: continuous with vLLM, lockstep with hf.", choices=ROLLOUT_SCHEDULES)
    rl_async_steps: int = _opt(0, "Play the episodes of the next N steps while a step trains, on weights at most N steps old (needs a vLLM server; 0 = on-policy).", minimum=0)
    rl_mask_truncated: bool = _opt(False, "Episodes that did not end on their own (a token budget, the context window or the turn cap cut them: env/truncated_frac) leave the loss, DAPO's overlong filtering (TRL's mask_truncated_completions); their scores still count in their groups' advantages.")
    rl_zero_std_groups: str = _opt("keep", "Groups whose episodes all scored the same: keep, drop (out of the loss) or refill (play more prompts).", choices=ZERO_STD_GROUPS)
    rl_refill_max_episodes: int | None = _opt(None, "Cap on the extra episodes --rl-zero-std-groups refill plays per step (default: twice the step's episodes).", minimum=0)
    rl_curriculum: str = _opt("off", "Which prompts a batch gets (training/rollout/curriculum.py): off draws them uniformly; pools draws a prompt whose recent groups all reached --rl-curriculum-easy (easy) or all stayed at or below --rl-curriculum-hard (hard) only at the --rl-curriculum-revisit rate. Pays when the base model solves between about 10% and 80% of the prompts.", choices=CURRICULA)
    rl_curriculum_easy: float = _opt(1.0, "With --rl-curriculum pools: a group whose mean reward (the weighted reward TRL trains on) is at least this succeeded.")
    rl_curriculum_hard: float = _opt(0.0, "With --rl-curriculum pools: a group whose mean reward is at most this failed.")
    rl_curriculum_revisit: float = _opt(0.1, "With --rl-curriculum pools: the probability that an easy or hard prompt is still drawn when its turn comes.", bound=Bound(low=0, high=1, note="a probability"))
    rl_curriculum_history: int = _opt(2, "With --rl-curriculum pools: the latest groups of a prompt that decide its pool (fewer while it has played fewer).", bound=Bound(low=1, high=1000, integer=True, note="groups remembered per prompt"))
    rl_max_error_rate: float = _opt(0.5, "Stop (after saving a checkpoint) when more than this share of the episodes of the last 4 steps failed; 1 never stops.", bound=Bound(low=0, high=1, note='a share of episodes; 1 never stops'))
    _section("GRPO")
    rl_reward_funcs: str | None = _opt(None, "Rewards added to the environment's score: module:func[,module:func...], each called with TRL's reward arguments plus `episodes` and logged as rewards/<func>/mean (--rl-zero-std-groups still looks at the environment's score alone).")
    rl_reward_weights: str | None = _opt(None, "Weights of the rewards, the environment's score first: w_env,w1,... (default: 1 each).")
    rl_reward_model: str | None = _opt(None, "Add a reward model's score (training/rewards/reward_model.py): a sequence-classification model of one label (a folder or model id) scores each episode's whole conversation, rendered with its own chat template; logged as rewards/reward_model/mean and weighted last in --rl-reward-weights.")
    rl_reward_aggregation: str = _opt("sum_then_normalize", "How several rewards make an advantage (TRL's multi_objective_aggregation): sum_then_normalize (the weighted sum, normalised within each group) or normalize_then_sum (each reward normalised within its group first, so a reward's scale does not decide its say: GDPO; then the weighted sum, normalised over the batch).", choices=REWARD_AGGREGATIONS)
    rl_advantage: str = _opt("outcome", "Credit: outcome (every token of an episode gets its score's group advantage) or turn (plus each turn's group-normalised reward-to-go, from the environment's episode.reward_turn).", choices=ADVANTAGE_MODES)
    rl_kl_coef: float = _opt(0.1, "KL penalty against the reference model (TRL's beta).", bound=NON_NEGATIVE)
    rl_kl_bias_correction: bool = _opt(True, "Weight each token's KL term by its policy ratio (TRL's use_bias_correction_kl, on by default there too: DeepSeek-V3.2's unbiased reverse-KL gradient). The ratio's value is 1 when the policy that trains played, but its gradient is not, so this changes the KL's gradient at every step; --no-rl-kl-bias-correction takes the plain estimate's gradient.")
    rl_ref_sync_steps: int = _opt(0, "TR-DPO's moving reference (TRL's sync_ref_model): every N optimizer steps the reference model of the KL term moves toward the policy, ref = a * policy + (1 - a) * ref with a = --rl-ref-mixup-alpha, so the KL holds the policy near where it recently was instead of where it started; 0 keeps the start. Needs a reference model of its own (--no-peft) and a KL term; its weights are saved with each checkpoint, so a resumed run goes on from the same reference.", bound=Bound(low=0, high=10**6, integer=True, note="optimizer steps between syncs; 0 never syncs"))
    rl_ref_mixup_alpha: float = _opt(0.6, "With --rl-ref-sync-steps: how far the reference moves toward the policy at each sync (TRL's ref_model_mixup_alpha; 1 copies the policy).", bound=Bound(low=0, high=1, low_open=True))
    rl_clip_range: float = _opt(0.2, "PPO-style clip range (TRL's epsilon).", bound=POSITIVE)
    rl_num_iterations: int = _opt(1, "Optimizer updates on each generation batch (TRL's num_iterations, PPO's epochs). At 1 the policy that trains is the one that played, so the clip ranges and --rl-importance-sampling change nothing; above 1 they bound how far the later updates move. Metrics are then logged once a batch, averaged over its updates.", bound=count(1024, "updates on each generation batch"))
    rl_clip_range_high: float | None = _opt(None, "Upper clip range, apart from the lower (TRL's epsilon_high; DAPO's clip-higher takes 0.28; default: --rl-clip-range).", bound=POSITIVE)
    rl_importance_sampling: str = _opt("token", "Policy ratio per token or per episode sequence (TRL's importance_sampling_level; sequence with --rl-loss-type grpo is GSPO).", choices=IMPORTANCE_LEVELS)
    rl_scale_rewards: str = _opt("group", "Advantages divided by the reward's standard deviation within each group, over the batch, or not at all (TRL's scale_rewards; Dr. GRPO takes none).", choices=SCALE_REWARDS)
    rl_delta: float | None = _opt(None, "Two-sided clipping (TRL's delta, INTELLECT-2's): a policy ratio above this is capped where the advantage is negative too, which the clip range leaves unbounded; above 1 + the upper clip range, e.g. 4. Acts from --rl-num-iterations 2 on, with the clip ranges.", bound=Bound(low=1, low_open=True))
    rl_off_policy_mask: float | None = _opt(None, "Leave out of the loss each sequence with a negative advantage whose mean KL from the policy that sampled it to the one training exceeds this (TRL's off_policy_mask_threshold, DeepSeek-V3.2's off-policy sequence masking), e.g. 0.5. Acts where the two differ: vLLM sampling, --rl-async-steps, later updates of --rl-num-iterations.", bound=NON_NEGATIVE)
    rl_importance_correction: str = _opt("sequence_mask", "How tokens vLLM sampled are weighted where its probabilities differ from the trainer's (TRL's vllm_importance_sampling_mode): token_truncate (each token's ratio, capped: TIS), token_mask (a token past the bounds weighs 0), sequence_truncate or sequence_mask (one ratio a sequence, the product of its tokens'). Acts only with vLLM.", choices=IMPORTANCE_CORRECTIONS)
    rl_importance_cap: float = _opt(3.0, "Upper bound of that ratio (TRL's vllm_importance_sampling_clip_max): truncated to it, or masked above it.", bound=POSITIVE)
    rl_importance_floor: float | None = _opt(None, "Lower bound of that ratio (TRL's vllm_importance_sampling_clip_min; default none).", bound=NON_NEGATIVE)
    rl_entropy_coef: float = _opt(0.0, "Entropy bonus in the loss (TRL's entropy_coef): keeps exploring instead of collapsing onto one answer.", bound=NON_NEGATIVE)
    rl_entropy_target: float | None = _opt(None, "Adapt the entropy bonus toward this mean token entropy in nats (TRL's use_adaptive_entropy and entropy_target): from --rl-entropy-coef, the coefficient rises by 0.005 after each step whose entropy was at or below the target and falls by 0.005 otherwise, within 0 and 1 (TRL's), and applies only while the entropy is at or below it; logged as entropy_coef, kept in checkpoints.", bound=NON_NEGATIVE)
    rl_top_entropy_quantile: float = _opt(1.0, "Train only on this share of model tokens, those of highest entropy (TRL's top_entropy_quantile; 'Beyond the 80/20 rule' takes 0.2), the threshold taken over each loss pass's tokens on every process; 1.0 trains every token.", bound=Bound(low=0, high=1, low_open=True))
    rl_loss_type: str | None = _opt(None, f"TRL loss type: {', '.join(LOSS_TYPES)} (default: TRL's).", choices=LOSS_TYPES)
    lr: float = _opt(1e-5, "Learning rate.", bound=POSITIVE)
    lr_scheduler: str = _opt("linear", "How the learning rate moves over the run (transformers' lr_scheduler_type): linear (down to 0 at the last step), cosine, cosine_with_restarts, polynomial, constant, constant_with_warmup or inverse_sqrt.", choices=LR_SCHEDULERS)
    warmup_steps: float = _opt(0.0, "Optimizer steps over which the learning rate climbs from 0 to --lr; below 1, a fraction of the run's steps (transformers' rule).", bound=NON_NEGATIVE)
    weight_decay: float = _opt(0.0, "The optimizer's weight decay (decoupled, as AdamW's).", bound=NON_NEGATIVE)
    optim: str | None = _opt(None, "Optimizer, by transformers' name (TrainingArguments' optim): adamw_torch_fused (TRL's default), adamw_torch, sgd, adagrad, rmsprop, adafactor; adamw_8bit, paged_adamw_8bit, lion_8bit (bitsandbytes); adamw_torch_8bit (torchao); schedule_free_adamw (schedulefree); ... One whose package is missing is refused before the model loads (optimizers.py).")
    adam_beta1: float | None = _opt(None, "Adam's beta1, the gradient's running average (default transformers' 0.9).", bound=Bound(low=0, high=1, high_open=True))
    adam_beta2: float | None = _opt(None, "Adam's beta2, the squared gradient's running average (default transformers' 0.999; RL recipes often take 0.95-0.99, so a step's scale follows the changing gradients sooner).", bound=Bound(low=0, high=1, high_open=True))
    adam_epsilon: float | None = _opt(None, "Adam's epsilon, added to the squared average's root (default transformers' 1e-8).", bound=POSITIVE)
    max_grad_norm: float = _opt(1.0, "The gradient's norm is clipped to this before each optimizer step (0: no clipping).", bound=NON_NEGATIVE)
    activation_checkpointing: bool | None = _opt(None, "Recompute each layer's activations in the backward pass instead of keeping them from the forward (transformers' activation_checkpointing, formerly gradient_checkpointing): less memory for long episodes and large passes, for about a third more time in the loss pass. Default: on with CUDA (TRL's default), off on a CPU.")
    max_steps: int | None = _opt(None, "Optimizer steps to run (default: --epochs over the dataset).", minimum=1)
    epochs: float = _opt(1.0, "Passes over the dataset when --max-steps is not set.", bound=POSITIVE)
    max_time: float | None = _opt(None, "Seconds of training this run may take (e.g. 41400 for 11 h 30 min of a 12-hour session): before a step that would end past it, the run saves its last step as a checkpoint and stops, printing the command that resumes (exit 0). Counted from the start of training in this process; a resumed run has the whole limit again.", bound=POSITIVE_SECONDS)
    batch_size: int = _opt(8, "Episodes per device in one generation batch (its GRPO groups); a multiple of --rl-num-generations. An optimizer step takes --gradient-accumulation-steps such batches.", bound=count(65536, "episodes per device in one generation batch"))
    gradient_accumulation_steps: int = _opt(1, "Generation batches (each --batch-size episodes) per optimizer step.", bound=count(65536, "generation batches per optimizer step"))
    micro_batch_size: int | None = _opt(None, "Episodes per forward/backward pass: the --batch-size episodes of a step are trained in passes of this many, with the gradient of one pass (default: 2, or 1 for an odd batch; one pass with --rl-zero-std-groups drop/refill).", bound=count(65536, "episodes per forward/backward pass"))
    shared_prefix_loss: str = _opt("auto", "Compute what the rows of a pass share once, in the loss and log-prob passes: a prefix tree of each pass's rows (a group's prompt, an episode's kept history under a context strategy, shared openings), one forward with a tree attention mask (exact: the same loss and gradients). auto on a CPU where the tree costs at most 0.85 of the plain passes and no dropout is drawn (the reference pass; the loss pass too with --lora-dropout 0), on wherever rows of a pass share a prefix, off for TRL's path. Keeps each group's rows in the same passes when the loss pass shares. Setups it cannot run (flash or flex attention, images, a MoE auxiliary loss) take TRL's path, said once in the log.", choices=SHARED_PREFIX_MODES)
    shuffle_dataset: bool = _opt(True, "Play the dataset's prompts in a new random order each epoch, drawn from --seed (TRL's shuffle_dataset); --no-shuffle-dataset plays them in the order build_dataset returned them, every epoch: an easy-to-hard curriculum written into the dataset. The extra prompts of --rl-zero-std-groups refill are still drawn at random.")
    seed: int = _opt(42, "Random seed: an integer from 0 to 4294967295 (2**32 - 1), as every command's --seed.")
    _section("judge")
    rl_judge_rubric: str | None = _opt(None, "Add a judge's reward (training/rewards/judge.py): a language model scores each episode's transcript by this rubric (text, or @file), from 0 to 1; logged as rewards/judge/mean and weighted last in --rl-reward-weights.")
    rl_judge_model: str | None = _opt(None, "The judge: self (a frozen copy of the run's base model, in-process), a model path or id (in-process), or with --rl-judge-url the served model's name.")
    rl_judge_url: str | None = _opt(None, "OpenAI-compatible URL of the judge, e.g. http://127.0.0.1:8000/v1 (a vLLM server) or https://api.openai.com/v1.")
    rl_judge_api_key_env: str | None = _opt(None, "Name of the environment variable holding the judge's API key, e.g. OPENAI_API_KEY (the key is read from it and never written).")
    rl_judge_mode: str = _opt("group", "group: one call scores a group's episodes side by side (RULER-style); episode: one call per episode.", choices=JUDGE_MODES)
    rl_judge_fallback: float = _opt(0.0, "Score of an episode whose judge call failed or answered no readable score (counted in judge/failures).", bound=Bound(low=0, high=1))
    _section("LoRA")
    peft: bool = _opt(True, "Train a LoRA adapter (--no-peft: full fine-tuning).")
    lora_r: int = _opt(16, "LoRA rank.", bound=count(4096, "a rank past the model's width adds nothing"))
    lora_alpha: int = _opt(32, "LoRA alpha.", minimum=1)
    lora_dropout: float = _opt(0.0, "LoRA dropout (off by default, as in peft: with it, --shared-prefix-loss auto leaves the loss pass to TRL's path).", bound=Bound(low=0, high=1, high_open=True))
    target_modules: str = _opt("all-linear", "LoRA target modules: all-linear or a comma-separated list.")
    use_rslora: bool = _opt(False, "Rank-stabilized LoRA (peft's use_rslora): the adapter is scaled by alpha/sqrt(r) instead of alpha/r, so a larger --lora-r does not shrink its updates.")
    use_dora: bool = _opt(False, "DoRA (peft's use_dora): the adapter learns each weight row's magnitude apart from its direction; slower steps. vLLM applies no DoRA adapter, so weights reach vLLM merged (--vllm-sync auto takes disk, not lora) and `aitrain eval --use-vllm` merges it first.")
    lora_modules_to_save: str | None = _opt(None, "Modules trained in full beside the adapter and saved with it (peft's modules_to_save), comma-separated, e.g. lm_head, or embed_tokens for tokens the base model never learnt; each must name a module of the model. vLLM applies none as an adapter: as with --use-dora, weights reach it merged.")
    _section("logging and saving")
    logging_steps: int = _opt(1, "Log metrics every N steps.", minimum=1)
    save_steps: int | None = _opt(None, "Save a checkpoint every N steps (default: only at the end).", minimum=1)
    save_total_limit: int | None = _opt(None, "Keep only the newest N checkpoints (default: all).", minimum=1)
    resume_from_checkpoint: str | None = _opt(None, "Continue a run: auto (the newest complete checkpoint in --output-dir) or a checkpoint-N folder.")
    report_to: str = _opt("none", f"Experiment tracker: {', '.join(REPORT_TO)}.", choices=REPORT_TO)
    log_episodes_every: int = _opt(10, "Write a sample of whole episodes to episodes.jsonl at step 1 and every N steps (0 = never).", minimum=0)
    log_episodes_count: int = _opt(4, "Episodes in each sample written to episodes.jsonl (the best, the worst, and random others).", minimum=0)
    overwrite: bool = _opt(False, "Replace an output directory that holds a finished run of the same environment (its checkpoints and files are removed, and the run says which); never another kind of folder (an export, a tiny model).")
    _section("held-back evaluation")
    eval_every: int = _opt(0, "Play --eval-episodes held-back tasks before step 1 and every N optimizer steps, as `aitrain eval` plays them, and log eval/mean_score, eval/success, eval/pass@k, eval/turns, eval/tool_errors, eval/truncated, eval/errors and time/eval_s (0 = never; evaluation/held_back.py).", minimum=0)
    eval_episodes: int = _opt(32, "Held-back tasks each evaluation plays: the first N rows of the evaluation environment's dataset.", bound=count(65536, "held-back tasks"))
    eval_num_generations: int = _opt(1, "Episodes per held-back task: the k of eval/pass@k.", bound=count(1024, "episodes of one held-back task"))
    eval_temperature: float | None = _opt(None, "Sampling temperature of the held-back episodes, 0 greedy (default: --rl-temperature).", bound=Bound(low=0, high=10, note='0 samples greedily; above 10 a sample is noise'))
    eval_env_config: Any = _opt(None, "JSON object of keyword arguments (or @file.json) for the held-back environment: the training environment with these in place of --rl-env-config, e.g. another seed or split (default: --rl-env-config, i.e. the training tasks themselves).")
    eval_env_module: str | None = _opt(None, "Python module of another environment to evaluate on, with --eval-env-class (default: the training environment).")
    eval_env_class: str | None = _opt(None, "Environment class in --eval-env-module.")
    save_best: str | None = _opt(None, "Keep the weights with the best value of this held-back metric (needs --eval-every; eval/success, eval/mean_score, eval/pass@k with k = --eval-num-generations: highest; eval/turns, eval/tool_errors, eval/truncated, eval/errors: lowest) as best/ in the output folder, beside the final model; `aitrain eval --model DIR/best` and `aitrain export` read it.")
    eval_patience: int | None = _opt(None, "Stop the run when --save-best's metric has not improved for this many held-back evaluations in a row (HF's early_stopping_patience): the run ends as finished, with its last weights in the output folder and the best in best/; needs --save-best.", minimum=1)
    _section("several processes")
    ddp_timeout: float = _opt(1800.0, "Seconds a process of a multi-process run (accelerate launch, torchrun) waits for the others to start, and then in a collective (the episodes gathered after a rollout, the gradients, a save) before it stops with one line saying another process likely died or hangs (exit 1; the checkpoints written stay). It must cover the longest time one process may spend alone: a slower rollout, a wait for a vLLM server, rank 0's checkpoint save.", bound=POSITIVE_SECONDS)
    _section("vLLM")
    use_vllm: bool | None = _opt(None, "Generate with vLLM (--use-vllm) or Hugging Face generate (--no-use-vllm). Default: the engine measured fastest on this kind of machine: colocated vLLM on a CPU with AVX-512 when vLLM is installed and the run is one process (or the server --vllm-server-url names), else Hugging Face generate; the run prints which and why (benchmarks/ENGINE_CHOICE.md).")
    vllm_mode: str = _opt("colocate", "vLLM mode: colocate (in the trainer) or server (aitrain vllm-serve).", choices=VLLM_MODES)
    vllm_gpu_memory_utilization: float = _opt(0.3, "Share of GPU memory for colocated vLLM.", bound=Bound(low=0, high=1, low_open=True))
    vllm_server_url: str | None = _opt(None, "URL of the vLLM server (server mode), e.g. http://127.0.0.1:8000; several, comma-separated (a list in a config file), share the episodes and each get the weights.")
    vllm_tensor_parallel_size: int = _opt(1, "Tensor parallel size of colocated vLLM.", minimum=1)
    vllm_server_gpus: int = _opt(1, "GPUs taken by the vLLM server (training uses the rest).", minimum=0)
    vllm_sync: str = _opt("auto", "How weights reach a vLLM server: auto, nccl (GPU), lora (adapter folder) or disk (weights folder).", choices=VLLM_SYNC)
    vllm_sync_dir: str | None = _opt(None, "Folder shared with the vLLM server for lora/disk sync (default: <output-dir>/vllm-sync).")
    vllm_server_timeout: float = _opt(240.0, "Seconds to wait for a vLLM server to answer: before training, and mid-run when no server is left (then the run stops with a checkpoint).", bound=POSITIVE_SECONDS)
    _section("agent environments")
    agent_host: str = _opt("127.0.0.1", "Address an agent environment's OpenAI-compatible endpoint listens on: 127.0.0.1 serves this machine only; 0.0.0.0 (or one interface's address) also serves agents in containers or on other hosts, each request authorised by its episode's key.")
    agent_port: int = _opt(0, "Port of that endpoint (0: any free port).", bound=Bound(low=0, high=65535, integer=True, note="a TCP port; 0 takes any free one"))
    _section("output")
    debug: bool = _opt(False, "Show full tracebacks.")

    # ------------------------------------------------------------------------------- helpers

    @classmethod
    def field_names(cls) -> list[str]:
        return [f.name for f in fields(cls)]

    @classmethod
    def help_for(cls, name: str) -> str:
        f = next(f for f in fields(cls) if f.name == name)
        default = f.default
        shown = "" if default is None or isinstance(default, bool) or default == "" else f" (default: {default})"
        return f.metadata["help"] + shown

    @classmethod
    def from_file(cls, path: str | Path) -> dict[str, Any]:
        """Read a YAML or JSON file of options (flag names with - or _ both accepted) into a dict
        (config_file.py: the file's checks, and another trainer's names answered with ours)."""
        return read_options_file(path, cls.field_names())

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def resolved_output_dir(self) -> Path:
        name = spec_label(self.rl_env) if self.rl_env else self.rl_env_class
        return Path(self.output_dir or f"outputs/{(name or 'run').lower()}")

    def environment(self) -> tuple[str, str, Any]:
        """(module, class name, keyword arguments) of the environment, from --rl-env or
        --rl-env-module/--rl-env-class with --rl-env-config (env_spec.py)."""
        return environment_of(self.rl_env, self.rl_env_module, self.rl_env_class, self.rl_env_config, self.rl_env_weights)

    def env_flags(self) -> str:
        """The flags that name this run's environment, for commands printed to the user."""
        flags = (" ".join(f"--rl-env {spec}" for spec in env_specs(self.rl_env)) if self.rl_env
                 else f"--rl-env-module {self.rl_env_module} --rl-env-class {self.rl_env_class}")
        config = self.rl_env_config if isinstance(self.rl_env_config, str) else json.dumps(self.rl_env_config)
        flags += f" --rl-env-weights {self.rl_env_weights}" if self.rl_env_weights else ""
        return flags + (f" --rl-env-config '{config}'" if self.rl_env_config else "")

    def validate(self, *, grpo: bool = True) -> "RunConfig":
        """Check the options against each other; raise `ConfigError` on the first problem. Returns the
        options with each value read as its field's type (a new `RunConfig`: this one is left as it
        is), so checking twice gives the same result. `grpo=False` (aitrain sft) leaves out the rules
        of GRPO's sampling and loss, which that command does not use."""
        typed = dataclasses.replace(self, **typed_values(self))
        typed._check_rules()
        if grpo:
            typed._check_grpo_rules()
        return typed

    def _check_rules(self) -> None:
        check_environment_named(self.rl_env, self.rl_env_module, self.rl_env_class, self.rl_env_weights)
        check_options(vars(self))
        check_seed(self.seed)  # the seed rule of every command (option_rules.py)
        template_kwargs(self.chat_template_kwargs)  # a JSON object, for every command that renders prompts
        if self.resume_from_checkpoint is not None and not self.resume_from_checkpoint.strip():
            raise ConfigError("--resume-from-checkpoint needs a value: auto, or a checkpoint-N folder")
        if self.output_dir is not None and not self.output_dir.strip():  # '' used to mean "not given"
            raise ConfigError("--output-dir needs a value: a folder path, or leave the option out for "
                              "outputs/<environment>")
        for name in VALUE_NEEDED:  # '' would read as "not given" further on, and the option would do nothing
            value = getattr(self, name)
            if isinstance(value, str) and not value.replace(",", "").strip():  # '' or ',,': nothing named
                raise ConfigError(f"--{name.replace('_', '-')} needs a value; give one, or leave the option out")
        check_optimizer(self)  # transformers knows the optimizer and its package is installed (optimizers.py)
        # sft's oracle plays under the budgets too, and its printed `next: aitrain grpo` repeats them.
        if self.rl_max_new_tokens > self.rl_max_completion_length:
            raise ConfigError(
                f"--rl-max-new-tokens {self.rl_max_new_tokens} exceeds --rl-max-completion-length "
                f"{self.rl_max_completion_length}; raise the budget or lower the turn limit"
            )

    def _check_grpo_rules(self) -> None:
        """GRPO's rules that relate options to each other, or hold for training but not for eval."""
        if self.rl_num_generations < 2:
            raise ConfigError("--rl-num-generations must be at least 2: GRPO compares episodes within a group")
        if self.batch_size % self.rl_num_generations:
            g = self.rl_num_generations
            options = ", ".join(str(g * k) for k in range(1, 5))
            raise ConfigError(
                f"--batch-size {self.batch_size} is not a multiple of --rl-num-generations {g}; use one of {options}"
            )
        if self.rl_temperature <= 0:
            raise ConfigError(
                f"--rl-temperature must be above 0 for training, got {self.rl_temperature}: at 0 every episode of a "
                f"group is the same, so GRPO has no score differences to learn from; use e.g. 1.0 (aitrain eval takes 0)"
            )
        if self.use_vllm is not False and self.vllm_mode == "server" and not self.vllm_server_url:
            raise ConfigError("--vllm-mode server needs --vllm-server-url (start one with `aitrain vllm-serve --model ...`)")
        if self.vllm_sync == "lora" and self.peft and not self.adapter_for_vllm:
            raise ConfigError(f"--vllm-sync lora hands vLLM the adapter, and vLLM applies no "
                              f"{'DoRA adapter' if self.use_dora else 'module saved in full (--lora-modules-to-save)'}; "
                              f"use --vllm-sync disk (merged weights), or leave it at auto")
        if self.rl_curriculum != "off" and self.rl_curriculum_easy <= self.rl_curriculum_hard:
            raise ConfigError(f"--rl-curriculum-easy {self.rl_curriculum_easy} must be above --rl-curriculum-hard "
                              f"{self.rl_curriculum_hard}, or every prompt would be both; e.g. 1 and 0 for a 0-1 score")
        if self.rl_num_iterations > 1 and (self.rl_async_steps or self.rl_curriculum != "off"):
            taken = "--rl-async-steps" if self.rl_async_steps else "--rl-curriculum pools"
            raise ConfigError(f"--rl-num-iterations {self.rl_num_iterations} trains each batch several times, which "
                              f"{taken} does not follow (it counts one batch a step); use one of them")
        if self.rl_advantage == "turn" and self.rl_scale_rewards != "group":
            raise ConfigError(f"--rl-advantage turn divides each turn's reward-to-go by its group's spread, so it "
                              f"takes --rl-scale-rewards group, got {self.rl_scale_rewards}; use group, or --rl-advantage outcome")
        if self.rl_curriculum != "off" and self.rl_zero_std_groups == "refill":
            raise ConfigError("--rl-curriculum pools with --rl-zero-std-groups refill: refill replaces the flat groups "
                              "the pools learn from; use --rl-zero-std-groups drop (or keep) with the curriculum")
        check_judge(vars(self), [name for _, name in self.reward_specs], dict(os.environ))
        if self.rl_reward_model and "reward_model" in [name for _, name in self.reward_specs]:
            raise ConfigError("--rl-reward-funcs has a reward named 'reward_model', the name --rl-reward-model is "
                              "logged under; bind it to another name in your module")
        _ = self.vllm_servers, self.reward_weight_list  # parsed, and so checked, once: here
        check_curriculum_reachable(self)  # option_effects.py: a threshold no group's reward can reach
        check_loss_options(self)  # option_effects.py: a loss option the loss type or clip range leaves inert
        check_reference_sync(self)  # option_effects.py: a moving reference where there is none to move
        if bool(self.eval_env_module) != bool(self.eval_env_class):
            raise ConfigError("--eval-env-module and --eval-env-class name the held-back environment together; give both")
        check_save_best(self.save_best, self.eval_every, self.eval_num_generations)  # before a model loads
        if self.eval_patience is not None and not self.save_best:
            raise ConfigError(f"--eval-patience {self.eval_patience} counts evaluations without a better --save-best "
                              f"value; give --save-best (e.g. eval/success) and --eval-every")

    # ------------------------------------------------------------------------------- parsed values
    # Options written as text, parsed once per config; every user reads these, not the text.

    @property
    def adapter_for_vllm(self) -> bool:
        """Whether vLLM can apply this run's LoRA adapter as an adapter: not DoRA, and no module saved in
        full (vLLM 0.31 refuses both for a causal LM); otherwise its weights reach vLLM merged."""
        return not (self.use_dora or self.lora_modules_to_save)

    @functools.cached_property
    def vllm_servers(self) -> list[str]:
        """`--vllm-server-url` as a list of URLs (empty when not given)."""
        return server_urls(self.vllm_server_url)

    @functools.cached_property
    def reward_specs(self) -> list[tuple[str, str]]:
        """`--rl-reward-funcs` as (module, function) pairs."""
        return reward_func_specs(self.rl_reward_funcs)

    @functools.cached_property
    def reward_weight_list(self) -> list[float] | None:
        """`--rl-reward-weights` as floats, the environment's score first; None when every weight is 1."""
        return reward_weights(self.rl_reward_weights, len(self.reward_specs), judge=bool(self.rl_judge_rubric),
                              reward_model=bool(self.rl_reward_model))
