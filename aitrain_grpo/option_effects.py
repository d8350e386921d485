"""Options that cannot act in the combination given: a note for one that does nothing there, a refusal
for a curriculum threshold no group's reward can ever reach.

- `unused_option_notes`: `--rl-context-threshold` acts only under drop-tool-results and summarize,
  `--rl-context-keep-last` only under drop-tool-results, `--rl-context-summary-tokens` only under
  summarize, and the `--rl-curriculum-*` thresholds only with `--rl-curriculum pools`. One given away
  from its default where it does nothing gets one `note:` line (a shared config file may carry it for
  another run, so the run goes on). `--warmup-steps` does nothing under `--lr-scheduler constant`.
  A loss type away from its paper's importance-sampling level gets a note too (`loss_setup_notes`), as
  TRL logs it. Which strategies are in force is the environment's to say when
  `--rl-context` is not given, so the caller hands them in (preflight/run_checks.py).
- `check_curriculum_reachable`: under `pools`, a group is easy when its mean reward is at least
  `--rl-curriculum-easy` and hard when at most `--rl-curriculum-hard`. Where every reward is bounded (the
  environment's score and the judge's are 0 to 1, times their `--rl-reward-weights`), `--rl-curriculum-easy
  2` or `--rl-curriculum-hard -1` can never trigger and is refused (RunConfig.validate calls it).

Left out: rewards from `--rl-reward-funcs`, whose range nobody declares (with one, nothing is refused).
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any, Iterable

from aitrain_grpo.errors import ConfigError

# Each option, the strategies (or curriculum) it acts under, and what it is for.
_CONTEXT_OPTIONS = {
    "rl_context_threshold": (("drop-tool-results", "summarize"), "sets when drop-tool-results and summarize rewrite "
                                                                 "the history"),
    "rl_context_keep_last": (("drop-tool-results",), "counts the tool results drop-tool-results keeps whole"),
    "rl_context_summary_tokens": (("summarize",), "limits the summary turn of summarize"),
}
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
    if "warmup_steps" in given and config.lr_scheduler == "constant":
        notes.append("note: --warmup-steps does nothing under --lr-scheduler constant (it holds --lr from the first "
                     "step); leave it out, or choose --lr-scheduler constant_with_warmup")
    return notes


def reward_range(config: Any) -> tuple[float, float] | None:
    """The lowest and highest mean reward a group can have (the environment's score and the judge's, 0 to
    1 each, times their weights); None when an `--rl-reward-funcs` reward, of unknown range, is part of it."""
    if config.reward_specs:
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
