"""The shared-prefix loss: each distinct prompt of a micro-batch goes through the model once, and every
episode's continuation is computed on top of it (`--shared-prefix-loss`).

Why: the episodes of a GRPO group share their prompt (system prompt, tool schemas, task). On a tool
environment the prompt is most of each sequence (79 % of the tokens on issue 33's), and TRL's
`_get_per_token_logps_and_entropies` runs it once per episode, in the loss pass and in the old and
reference log-prob passes alike. Here, per chunk of rows TRL would forward together:

1. the distinct prompts (`prompt_ids` rows with their left padding) are found by their tokens;
2. each goes through the model once, all but its last token, with `use_cache=True` and gradients on:
   with LoRA (or full fine-tuning) the prompt's keys and values depend on trained weights;
3. the cache is indexed out to the episodes (`Cache.batch_select_indices`, an index on each layer's
   keys and values, so autograd sums each member's gradient into its prompt's once);
4. each episode's last prompt token and completion go through TRL's own fused head
   (`model(..., past_key_values=cache, labels=..., fused_lm_head=True)`): the same temperature, entropy,
   logit scale and softcapping as the plain path, and the last prompt token's hidden state predicts the
   first completion token as it does there.

Exact, not approximate: positions are the plain path's (the model counts them on from the cache's length,
as it counts columns in the whole left-padded row), the attention mask is the whole row's, and a
continuation token attends to exactly the keys it attends to in the plain path; only float summation
order differs (tests/test_shared_prefix.py compares log-probs, entropies, loss and gradients). With
dropout (`--lora-dropout`, 0 by default) a prompt's dropout mask is drawn once for its group rather
than once per episode: each episode's loss is still an ordinary dropout sample, but the group's are
correlated (the tests compare at dropout 0, where both paths are deterministic).

Where it runs: text-only rows, one process (an unwrapped model or a PEFT LoRA model: a DDP, FSDP or
DeepSpeed wrapper would see two forwards per backward), no MoE auxiliary loss, no prompt-learning or
aLoRA adapter, a cache of plain `DynamicLayer`s (no sliding-window, linear-attention or static layers),
and in the loss pass no gradient checkpointing (transformers drops the cache of a checkpointed layer;
the no-grad old/reference passes still share). Anything else takes TRL's path, with one log line per
reason. A model that ignores the cache is caught after its first try (the cache did not grow) and
falls back for the rest of the run.

Where it pays: `auto` shares a chunk only on a CPU and when the tokens it leaves out are at least
`AUTO_MIN_SAVED` of the plain path's; `on` whenever two rows of a chunk share a prompt, on any device.
Measured (benchmarks/SHARED_PREFIX.md): on a CPU the passes cost what their tokens cost, and sharing
saves what it leaves out; on an H100 a model as small as SmolLM2 is bound by kernel launches, and
sharing's second forward call doubles them. The saving needs a group's episodes in one micro-batch;
step/micro_batches.py's `keep_prompts_together` puts them there (and says what that does to each loss type).

Left out: a packed single forward with a tree attention mask (portable only to attention kernels that
take arbitrary 4D masks, and quadratic in all members' tokens at once), prompts that share only a
leading part (a common system prompt across tasks), and multimodal rows.
"""

from __future__ import annotations

import logging
from typing import Any, Callable

import torch

from aitrain_grpo.config import SHARED_PREFIX_MODES

logger = logging.getLogger(__name__)

MODES = SHARED_PREFIX_MODES
# `auto` shares a chunk when it leaves out at least this share of the plain path's tokens
# (benchmarks/SHARED_PREFIX.md: below it the second forward call costs about what it saves).
AUTO_MIN_SAVED = 0.15
# ... and only on these devices. On an H100, SmolLM2's passes are bound by kernel launches, not by
# tokens, and the second forward call made them 2x slower (benchmarks/SHARED_PREFIX.md).
AUTO_DEVICES = ("cpu",)


class SharedPrefix:
    """One trainer's shared-prefix state: the mode, and what has already been said or found
    unsupported (each reason is logged once)."""

    def __init__(self, mode: str = "auto"):
        if mode not in MODES:
            raise ValueError(f"shared-prefix mode {mode!r} is not one of {', '.join(MODES)}")
        self.mode = mode
        self.broken: str | None = None  # a model found to ignore the cache: plain path from then on
        self._noted: set[str] = set()
        self.shared_chunks = 0  # counts for tests and benchmarks
        self.plain_chunks = 0

    @property
    def active(self) -> bool:
        return self.mode != "off" and self.broken is None

    def note(self, reason: str) -> None:
        self.note_once(f"{reason}; those passes take TRL's plain path")

    def note_once(self, message: str) -> None:
        if message not in self._noted:
            self._noted.add(message)
            logger.warning("shared-prefix loss: %s", message)


def shared_logps(accelerator: Any, state: SharedPrefix, model: Any, input_ids: torch.Tensor,
                 attention_mask: torch.Tensor, logits_to_keep: int, batch_size: int | None, compute_entropy: bool,
                 compute_aux_loss: bool, extras: dict[str, Any],
                 plain: Callable[[torch.Tensor, torch.Tensor, int | None], tuple]) -> tuple:
    """What TRL's `_get_per_token_logps_and_entropies` returns, shared where this call allows it;
    `plain(ids, mask, batch_size)` is TRL's own method; `state` the run's (run/context.py)."""
    if not declined(accelerator, state, model, input_ids.device, extras, compute_aux_loss):
        shared = per_token_logps(accelerator, state, model, input_ids, attention_mask, logits_to_keep, batch_size,
                                 compute_entropy, lambda ids, mask: plain(ids, mask, None))
        if shared is not None:
            return shared
    return plain(input_ids, attention_mask, batch_size)


def shares_micro_batches(accelerator: Any, state: SharedPrefix, model: Any, wrapped: Any) -> bool:
    """Whether the loss pass of `model` (`wrapped`: as the accelerator wrapped it) shares, so a step's micro-batches should hold whole groups (step/loss.py
    `split_micro_batches`). Where it does not, TRL's split stays as it is (the same run as with sharing
    off). Why keeping groups together is safe for every loss type: step/micro_batches.py."""
    return not declined(accelerator, state, wrapped, next(model.parameters()).device)


def declined(accelerator: Any, state: SharedPrefix, model: Any, device: torch.device,
             extras: dict[str, Any] | None = None, compute_aux_loss: bool = False) -> str | None:
    """Why this pass takes TRL's path (None: it shares), said once per reason. Besides what the
    model cannot do (`unsupported`), `auto` leaves to TRL's path the devices it was not measured to pay
    on, and a pass with dropout on: there a prompt's dropout mask would be drawn once for its group
    instead of once per episode, a valid sample but not the plain path's (`on` shares it, and says so)."""
    if not state.active:
        return "off"
    reason = unsupported(accelerator, model, extras or {}, compute_aux_loss)
    if not reason and dropout_in_use(_trained(accelerator, model)):
        if state.mode == "auto":
            reason = ("dropout is on (--lora-dropout): auto leaves passes with dropout to TRL's path "
                      "(--lora-dropout 0 or --shared-prefix-loss on shares them)")
        else:
            state.note_once("dropout is on: each prompt's dropout mask is drawn once for its group, not once per "
                            "episode (--shared-prefix-loss on)")
    if not reason and state.mode == "auto" and device.type not in AUTO_DEVICES:
        reason = (f"auto shares on {', '.join(AUTO_DEVICES)} only, where it was measured to pay "
                  f"(--shared-prefix-loss on shares on {device.type})")
    if reason:
        state.note(reason)
    return reason


def dropout_in_use(model: Any) -> bool:
    """Whether a forward of `model` now draws dropout: a dropout module with p > 0 in training mode
    (not one of a LoRA layer whose adapter is disabled, as for TRL's reference pass), or a config's
    attention dropout while training."""
    if not model.training:
        return False
    if getattr(model.config.get_text_config(), "attention_dropout", 0.0):
        return True
    idle: set[int] = set()
    for module in model.modules():
        lora_dropout = getattr(module, "lora_dropout", None)
        if getattr(module, "disable_adapters", False) and isinstance(lora_dropout, torch.nn.Module):
            idle.update(id(m) for m in lora_dropout.modules())
    return any(isinstance(m, torch.nn.modules.dropout._DropoutNd) and m.p > 0 and m.training and id(m) not in idle
               for m in model.modules())


def _trained(accelerator: Any, model: Any) -> Any:
    """The causal LM under `model`'s wrappers (accelerate's, PEFT's)."""
    unwrapped = accelerator.unwrap_model(model)
    return unwrapped.get_base_model() if hasattr(unwrapped, "get_base_model") else unwrapped


def unsupported(accelerator: Any, model: Any, extras: dict[str, Any], compute_aux_loss: bool) -> str | None:
    """Why this call cannot share (None: it can)."""
    if any(value is not None for value in extras.values()):
        return "multimodal inputs"
    if compute_aux_loss:
        return "a MoE auxiliary loss is on"
    unwrapped = accelerator.unwrap_model(model)
    if unwrapped is not model:
        return "the model is wrapped for distributed training"
    peft_config = getattr(unwrapped, "active_peft_config", None)
    if peft_config is not None and (peft_config.is_prompt_learning
                                    or getattr(peft_config, "alora_invocation_tokens", None)):
        return "a prompt-learning or aLoRA adapter"
    causal = _trained(accelerator, model)
    if getattr(causal.config.get_text_config(), "output_router_logits", False):
        return "the model returns router logits"
    if torch.is_grad_enabled() and causal.training and _checkpointing(causal):
        return "gradient checkpointing drops the cache in the loss pass"
    return None


def _checkpointing(causal) -> bool:
    """Whether the model recomputes activations: transformers 5.18+ names it `is_activation_checkpointing`
    (its old name warns on every read), earlier ones `is_gradient_checkpointing`."""
    for name in ("is_activation_checkpointing", "is_gradient_checkpointing"):
        if hasattr(type(causal), name):
            return bool(getattr(causal, name))
    return False


def saved_share(input_ids: torch.Tensor, prompt_len: int, distinct: int) -> float:
    """The share of the plain path's tokens that sharing leaves out for one chunk."""
    rows, width = input_ids.shape
    shared_tokens = distinct * (prompt_len - 1) + rows * (width - prompt_len + 1)
    return 1.0 - shared_tokens / (rows * width)


def per_token_logps(accelerator: Any, state: SharedPrefix, model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                    logits_to_keep: int, batch_size: int | None, compute_entropy: bool,
                    plain: Callable[[torch.Tensor, torch.Tensor], tuple]) -> tuple | None:
    """TRL's `(logps, entropies, aux_loss)` for these rows, each chunk of `batch_size` rows shared where
    it pays and `plain(ids, mask)` (TRL's own method on that chunk) where not. None: the model cannot
    share at all, and the caller runs TRL's method on every row."""
    prompt_len = input_ids.size(1) - logits_to_keep
    if prompt_len < 2:
        return None
    batch_size = batch_size or input_ids.size(0)
    logps, entropies = [], []
    for start in range(0, input_ids.size(0), batch_size):
        ids, mask = input_ids[start:start + batch_size], attention_mask[start:start + batch_size]
        result = _shared_chunk(accelerator, state, model, ids, mask, prompt_len, compute_entropy) if state.active else None
        if result is None:
            state.plain_chunks += 1
            result = plain(ids, mask)[:2]
        else:
            state.shared_chunks += 1
        logps.append(result[0])
        entropies.append(result[1])
    return torch.cat(logps), (torch.cat(entropies) if compute_entropy else None), None


def _shared_chunk(accelerator: Any, state: SharedPrefix, model: Any, ids: torch.Tensor, mask: torch.Tensor,
                  prompt_len: int, compute_entropy: bool) -> tuple[torch.Tensor, torch.Tensor | None] | None:
    # Completion columns no row uses are left out, as TRL's scoring passes leave them out (trl/scoring_passes.py)
    # and trim_padding does in the loss pass; their scores are zeros, as the plain path's are.
    width = ids.size(1)
    used = mask[:, prompt_len:].any(dim=0).nonzero()
    end = prompt_len + (int(used[-1]) + 1 if used.numel() else 1)
    ids, mask = ids[:, :end], mask[:, :end]
    prompts = torch.cat([ids[:, :prompt_len], mask[:, :prompt_len].to(ids.dtype)], dim=1)
    distinct, member_of = torch.unique(prompts, dim=0, return_inverse=True)
    if distinct.size(0) == ids.size(0):
        return None  # no two rows share a prompt
    if state.mode == "auto" and saved_share(ids, prompt_len, distinct.size(0)) < AUTO_MIN_SAVED:
        return None
    prefix_ids = distinct[:, :prompt_len - 1]
    prefix_mask = distinct[:, prompt_len:2 * prompt_len - 1].to(mask.dtype)
    with accelerator.autocast():
        # Through the model's own forward (PEFT and TRL's patched forward pass it on), one position of
        # logits: only the cache is used.
        prefix = model(input_ids=prefix_ids, attention_mask=prefix_mask, use_cache=True, logits_to_keep=1)
    cache = getattr(prefix, "past_key_values", None)
    problem = _cache_problem(cache, prompt_len - 1)
    if problem:
        state.broken = problem
        state.note(problem)
        return None
    cache.batch_select_indices(member_of)
    continuation = ids[:, prompt_len - 1:]
    labels = continuation.masked_fill(mask[:, prompt_len - 1:] == 0, -100)
    labels[:, 0] = -100  # the last prompt token is input only, as in the plain path
    with accelerator.autocast():
        out = model(input_ids=continuation, attention_mask=mask, past_key_values=cache, labels=labels,
                    fused_lm_head=True)
    if cache.get_seq_length() != end:
        state.broken = "the model did not extend the prompt's cache"
        state.note(state.broken)
        return None

    def padded(scores):
        return torch.nn.functional.pad(scores, (0, width - end))

    return padded(out.log_probs), (padded(out.entropy) if compute_entropy else None)


def _cache_problem(cache: Any, length: int) -> str | None:
    from transformers.cache_utils import DynamicCache, DynamicLayer

    if not isinstance(cache, DynamicCache):
        return f"the model returned no DynamicCache ({type(cache).__name__})"
    layers = getattr(cache, "layers", None)
    if not layers or any(type(layer) is not DynamicLayer for layer in layers):
        kinds = sorted({type(layer).__name__ for layer in layers or []})
        return f"the model's cache has {', '.join(kinds) or 'no'} layers, not only DynamicLayer"
    if cache.get_seq_length() != length:
        return "the model's cache does not hold the whole prompt"
    return None
