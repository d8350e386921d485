"""Options that cannot act in the combination given: a note for one that does nothing there, a refusal
for a curriculum threshold no group's reward can ever reach or a ratio cap the loss would ignore.

- `unused_option_notes`: `--rl-context-threshold` acts only under drop-tool-results and summarize,
  `--rl-context-keep-last` only under drop-tool-results, `--rl-context-summary-tokens` only under
  summarize, and the `--rl-curriculum-*` thresholds only with `--rl-curriculum pools`. One given away
  from its default where it does nothing gets one `note:` line (a shared config file may carry it for
  another run, so the run goes on). `--warmup-steps` does nothing under `--lr-scheduler constant`, Adam's
  constants nothing with an `--optim` built without them (sgd, adafactor, ...), the LoRA options nothing
  with `--no-peft`, `--no-rl-kl-bias-correction` nothing without a KL term, `--rl-ref-mixup-alpha` nothing
  without `--rl-ref-sync-steps`.
  A loss type away from its paper's importance-sampling level gets a note too (`loss_setup_notes`), as
  TRL logs it, and so do the options that act on the policy ratio (the clip ranges, `--rl-delta`,
  `--rl-importance-sampling`) under one update a batch, where every ratio is 1, and `--rl-off-policy-mask`
  where Hugging Face generation plays with the weights that train and a batch trains once, and the
  vLLM correction's options (`--rl-importance-*`) under Hugging Face generation. Which strategies are in
  force is the environment's to say when `--rl-context` is not given, so the caller hands them in
  (preflight/run_checks.py).
- `check_loss_options`: `--rl-delta` is refused with a loss type TRL does not clip (cispo, sapo, vespo),
  or at or below 1 + the upper clip range, where it would cap ratios the clip already holds.
- `check_reference_sync`: `--rl-ref-sync-steps` is refused where no reference model of its own exists
  (LoRA, whose reference is the adapter switched off; `--rl-kl-coef 0`).
- `check_curriculum_reachable`: under `pools`, a group is easy when its mean reward is at least
  `--rl-curriculum-easy` and hard when at most `--rl-curriculum-hard`. Where every reward is bounded (the
  environment's score and the judge's are 0 to 1, times their `--rl-reward-weights`), `--rl-curriculum-easy
  2` or `--rl-curriculum-hard -1` can never trigger and is refused (RunConfig.validate calls it).

Left out: rewards from `--rl-reward-funcs` and `--rl-reward-model`, whose range nobody declares (with one,
nothing is refused).
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any, Iterable

from aitrain_grpo.errors import ConfigError
from aitrain_grpo.optimizers import unused_adam_options

# Each option, the strategies (or curriculum) it acts under, and what it is for.
_CONTEXT_OPTIONS = {
    "rl_context_threshold": (("drop-tool-results", "summarize"), "sets when drop-tool-results and summarize rewrite "
                                                                 "the history"),
    "rl_context_keep_last": (("drop-tool-results",), "counts the tool results drop-tool-results keeps whole"),
    "rl_context_summary_tokens": (("summarize",), "limits the summary turn of summarize"),
}
_LORA_OPTIONS = ("lora_r", "lora_alpha", "lora_dropout", "target_modules", "use_rslora", "use_dora", "lora_modules_to_save")
_CURRICULUM_OPTIONS = ("rl_curriculum_easy", "rl_curriculum_hard", "rl_curriculum_revisit", "rl_curriculum_history")


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _given(config: Any) -> dict[str, Any]:
    """The options whose value differs from their default."""
    return {f.name: getattr(config, f.name) for f in fields(config) if getattr(config, f.name) != f.default}


def unused_option_notes(config: Any, strategies: Iterable[str]) -> list[str]:
    """One `note:` line per option given that does nothing under `strategies` (the context strategies in
    force, one per environment of a mixture) and `config.rl_curriculum`."""
    given, strategies = _given(config), sorted(set(strategies))
    notes = []
    for name, (acts_under, purpose) in _CONTEXT_OPTIONS.items():
        if name in given and not set(acts_under) & set(strategies):
            notes.append(f"note: {_flag(name)} does nothing under --rl-context {' and '.join(strategies)} (it "
                         f"{purpose}); leave it out, or choose --rl-context {' or '.join(acts_under)}")
    if config.rl_curriculum != "pools":
        unused = [_flag(name) for name in _CURRICULUM_OPTIONS if name in given]
        if unused:
            notes.append(f"note: {', '.join(unused)} {'does' if len(unused) == 1 else 'do'} nothing without "
                         f"--rl-curriculum pools (this run draws prompts with --rl-curriculum {config.rl_curriculum}); "
                         f"leave {'it' if len(unused) == 1 else 'them'} out, or add --rl-curriculum pools")
    notes.extend(loss_setup_notes(config))
    ratio_options = [_flag(name) for name in _RATIO_OPTIONS if name in given]
    if ratio_options and config.rl_num_iterations == 1:
        notes.append(f"note: {', '.join(ratio_options)} {'does' if len(ratio_options) == 1 else 'do'} nothing with one "
                     f"update a batch (--rl-num-iterations 1): the policy that trains is the one the batch was scored "
                     f"with, so every policy ratio is 1; add --rl-num-iterations 2, or leave "
                     f"{'it' if len(ratio_options) == 1 else 'them'} out")
    sampler = [_flag(name) for name in _SAMPLER_OPTIONS if name in given]
    if sampler and config.use_vllm is False:
        notes.append(f"note: {', '.join(sampler)} {'does' if len(sampler) == 1 else 'do'} nothing with Hugging Face "
                     f"generation: the trainer samples its own tokens, so there is no other sampler to correct for; "
                     f"{'it acts' if len(sampler) == 1 else 'they act'} with vLLM (--use-vllm)")
    if "rl_off_policy_mask" in given and config.rl_num_iterations == 1 and config.use_vllm is False:
        notes.append("note: --rl-off-policy-mask does nothing here: Hugging Face generate samples with the weights that "
                     "train, and one update a batch leaves them unchanged, so no sequence is off policy; it acts with "
                     "vLLM, --rl-async-steps or --rl-num-iterations 2")
    adam = unused_adam_options(config)
    if adam:
        notes.append(f"note: {', '.join(adam)} {'does' if len(adam) == 1 else 'do'} nothing with --optim {config.optim}, "
                     f"which transformers builds without {'it' if len(adam) == 1 else 'them'}; leave "
                     f"{'it' if len(adam) == 1 else 'them'} out, or choose an Adam optimizer (adamw_torch_fused)")
    lora = [_flag(name) for name in _LORA_OPTIONS if name in given]
    if lora and not config.peft:
        notes.append(f"note: {', '.join(lora)} {'does' if len(lora) == 1 else 'do'} nothing with --no-peft, which trains "
                     f"every weight and no adapter; leave {'it' if len(lora) == 1 else 'them'} out, or drop --no-peft")
    if "rl_kl_bias_correction" in given and config.rl_kl_coef == 0:
        notes.append("note: --no-rl-kl-bias-correction does nothing with --rl-kl-coef 0: there is no KL term to weight; "
                     "leave it out, or give the KL a coefficient")
    if "rl_ref_mixup_alpha" in given and not config.rl_ref_sync_steps:
        notes.append("note: --rl-ref-mixup-alpha does nothing without --rl-ref-sync-steps: the reference never moves; "
                     "leave it out, or give --rl-ref-sync-steps (e.g. 64)")
    if "warmup_steps" in given and config.lr_scheduler == "constant":
        notes.append("note: --warmup-steps does nothing under --lr-scheduler constant (it holds --lr from the first "
                     "step); leave it out, or choose --lr-scheduler constant_with_warmup")
    return notes


def reward_range(config: Any) -> tuple[float, float] | None:
    """The lowest and highest mean reward a group can have (the environment's score and the judge's, 0 to
    1 each, times their weights); None when an `--rl-reward-funcs` reward or the reward model's, of unknown
    range, is part of it."""
    if config.reward_specs or config.rl_reward_model:
        return None
    weights = config.reward_weight_list or [1.0] * (1 + bool(config.rl_judge_rubric))
    return sum(min(0.0, w) for w in weights), sum(max(0.0, w) for w in weights)


def check_curriculum_reachable(config: Any) -> None:
    """Refuse a `--rl-curriculum pools` threshold that no group's mean reward can reach."""
    bounds = reward_range(config) if config.rl_curriculum == "pools" else None
    if bounds is None:
        return
    low, high = bounds
    what = (f"a group's mean reward is {low:g} to {high:g} (the environment's score"
            f"{' and the judge' + chr(39) + 's' if config.rl_judge_rubric else ''}, 0 to 1, times "
            f"{'its weight' if not config.rl_judge_rubric else 'their weights'})")
    if config.rl_curriculum_easy > high:
        raise ConfigError(f"--rl-curriculum-easy {config.rl_curriculum_easy:g} can never be reached, so no prompt "
                          f"would ever be easy: {what}; give a value up to {high:g}, e.g. {high:g}")
    if config.rl_curriculum_hard < low:
        raise ConfigError(f"--rl-curriculum-hard {config.rl_curriculum_hard:g} can never be reached, so no prompt "
                          f"would ever be hard: {what}; give a value from {low:g}, e.g. {low:g}")


def check_reference_sync(config: Any) -> None:
    """Refuse `--rl-ref-sync-steps` where there is no reference model to move: under LoRA the reference is
    the base model with the adapter off (TRL keeps no copy; its own refusal came as a traceback after the
    model loaded), and with `--rl-kl-coef 0` TRL builds none."""
    if not config.rl_ref_sync_steps:
        return
    if config.peft:
        raise ConfigError("--rl-ref-sync-steps moves a reference model of its own toward the policy; with LoRA the "
                          "reference is the base model with the adapter off, which cannot move: add --no-peft, or "
                          "leave --rl-ref-sync-steps out")
    if config.rl_kl_coef == 0:
        raise ConfigError("--rl-ref-sync-steps moves the reference of the KL term, and --rl-kl-coef 0 has none: give "
                          "the KL a coefficient (e.g. --rl-kl-coef 0.04), or leave --rl-ref-sync-steps out")


# Options that act on the policy ratio (TRL's coef_1), which is exactly 1 on a batch's first update.
_RATIO_OPTIONS = ("rl_clip_range", "rl_clip_range_high", "rl_delta", "rl_importance_sampling")
# Options of the correction for vLLM's sampling (TRL's vllm_importance_sampling_*), which only vLLM needs.
_SAMPLER_OPTIONS = ("rl_importance_correction", "rl_importance_cap", "rl_importance_floor")
# Loss types whose ratio TRL clips with --rl-clip-range and caps with delta (grpo_trainer.py `_compute_loss`).
_CLIPPED_LOSSES = ("grpo", "bnpo", "dr_grpo", "dapo", "luspo")


def check_loss_options(config: Any) -> None:
    """Refuse `--rl-delta` where TRL's loss would ignore it (a loss type it does not clip) or where it
    would cap the ratio inside the clip range (the two-sided clip's cap belongs above 1 + the upper range)."""
    if config.rl_delta is None:
        return
    loss = config.rl_loss_type or TRL_DEFAULT_LOSS
    if loss not in _CLIPPED_LOSSES:
        raise ConfigError(f"--rl-delta caps the clipped ratio of {', '.join(_CLIPPED_LOSSES)}; --rl-loss-type {loss} "
                          f"has no such clip, so it would do nothing: leave it out, or choose one of those loss types")
    upper = 1 + (config.rl_clip_range_high if config.rl_clip_range_high is not None else config.rl_clip_range)
    if config.rl_delta <= upper:
        raise ConfigError(f"--rl-delta {config.rl_delta:g} is not above 1 + the upper clip range ({upper:g}), so it "
                          f"would cap ratios the clip already holds; give a larger value, e.g. {max(4.0, upper + 1):g}")


# TRL 1.16 warns of these in its log (grpo_trainer.py); a run says them before its model loads instead.
_TOKEN_SUM_LOSSES = ("bnpo", "dr_grpo", "dapo", "cispo")
TRL_DEFAULT_LOSS = "dapo"  # GRPOConfig.loss_type when --rl-loss-type is not given (trl 1.16; tests/test_refused_early.py)


def loss_setup_notes(config: Any) -> list[str]:
    """Notes for a loss type and importance-sampling level that work together but not as their papers set them."""
    loss, level = config.rl_loss_type or TRL_DEFAULT_LOSS, config.rl_importance_sampling
    if loss == "luspo" and level != "sequence":
        return ["note: --rl-loss-type luspo is a sequence-level loss (its paper's setup); add --rl-importance-sampling "
                "sequence"]
    if loss == "vespo" and level != "token":
        return ["note: --rl-loss-type vespo computes its own sequence-level weights; leave --rl-importance-sampling "
                "at token"]
    if level == "sequence" and loss in _TOKEN_SUM_LOSSES:
        named = f"--rl-loss-type {loss}" if config.rl_loss_type else f"the default loss type (TRL's {loss})"
        return [f"note: {named} sums per-token terms, so under --rl-importance-sampling sequence each episode weighs "
                f"as its length; GSPO's setup is --rl-loss-type grpo"]
    return []
