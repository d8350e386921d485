"""The shared-prefix passes: every token that several rows of a pass share, with everything before it, goes
through the model once (`--shared-prefix-loss`), in TRL's loss pass and its reference/old log-prob passes.

Why: the rows of a pass repeat each other. A GRPO group's episodes share their prompt (system prompt, tool
schemas, task: 79 % of the tokens on issue 33's tool environment); under a context strategy an episode's
later sequences repeat its kept history; episodes that open alike share their opening. TRL's
`_get_per_token_logps_and_entropies` computes every row in full, padding included.

How, per chunk of rows TRL would forward together:
1. the rows are put in the order of their tokens (rows that share a prefix side by side) and cut into
   chunks of the size the caller passes (the loss pass's micro-batch; for the scoring forwards a loss
   pass's rows, step/micro_batches.py `scoring_chunk_rows`), the results put back in the rows' order;
2. a chunk's rows become one prefix tree (step/prefix_tree.py): each shared prefix once, no padding,
   positions counted along each row, a tree attention mask (a token sees its own row's earlier tokens);
3. one forward of the model over the packed tree through TRL's own fused head (`model(...,
   shift_labels=..., fused_lm_head=True)`: the same temperature, entropy, logit scale and softcapping as
   the plain path), each scored position labelled with the token it predicts, then gathered back into
   TRL's (rows, completion columns) layout. Gradients reach a shared token once, summed over its rows.

Exact, not approximate: a token's hidden state depends on the tokens before it only, and those are the
same for every row sharing its node; a rotary model sees the plain path's relative positions (the plain
path counts columns, left padding included, so its absolute positions differ by the padding); only float
summation order differs (tests/test_shared_prefix.py compares log-probs, entropies, loss and gradients,
and a position off by one fails them). A model with absolute position embeddings gets the plain path's
columns as positions, and shares only between equally padded rows. The first shared chunk of a run is
also checked against the plain path (once, without gradients): a model that ignores a custom mask or
position ids falls back to the plain path for the rest of the run, saying why. With dropout
(`--lora-dropout`, 0 by default) a shared token's dropout mask is drawn once for all its rows: each
row's loss is still an ordinary dropout sample, but they are correlated (`auto` leaves such passes to
TRL's path).

Where it runs: text-only rows, full attention in every layer (no sliding-window, linear-attention or
state-space layers), an attention implementation that takes an arbitrary 4D mask (SDPA, eager), no MoE
auxiliary loss or router logits, no prompt-learning or aLoRA adapter, at most `MAX_NODES` tokens in a tree (its
mask is quadratic). One forward per backward, so a distributed wrapper and gradient checkpointing see
what they expect. Anything else takes TRL's path, with one log line per reason.

Where it pays: `auto` shares a chunk only on a CPU and when the tree's estimated cost (step/prefix_tree.py
`cost_ratio`: weights per token plus attention over every node, as a dense mask computes it) is at most
`AUTO_MAX_COST` of the plain path's; `on` whenever the tree holds fewer tokens than the rows. Measured:
benchmarks/SHARED_PREFIX.md (sharing the group's prompt) and benchmarks/PREFIX_TREE.md (the tree). The
loss pass saves only within a micro-batch; step/micro_batches.py's `keep_prompts_together` puts a group's
sequences there (and says what that does to each loss type).

Left out: attention kernels without arbitrary masks (flash-attention, flex: a varlen packing of the
tree's branches would serve them), sharing across passes or steps, and multimodal rows.
"""

from __future__ import annotations

import logging
from typing import Any, Callable

import torch

from aitrain_grpo.config import SHARED_PREFIX_MODES
from aitrain_grpo.training.step.prefix_tree import PackedTree, build_tree, cost_ratio

logger = logging.getLogger(__name__)

MODES = SHARED_PREFIX_MODES
# `auto` shares a chunk when its tree costs at most this share of the plain path (estimated: benchmarks/
# SHARED_PREFIX.md found that leaving out under 15 % of the tokens gained nothing)...
AUTO_MAX_COST = 0.85
# ... and only on these devices (not measured on a GPU with the tree: benchmarks/gpu_check.py checks it).
AUTO_DEVICES = ("cpu",)
# A larger tree takes the plain path: its mask alone is nodes^2 values (8192 tokens: 256 MiB in float32).
MAX_NODES = 8192
# ... and so does a tree whose dense mask holds more than this many times the attention scores of the
# plain rows (rows x width^2): rows that share little would make the tree's attention, computed and kept
# for the backward over every pair of nodes, the largest memory of the pass (a stations pass of 4 rows
# of 620 tokens peaks at 6.7 GB plain; a tree of all their tokens would hold 4x the scores).
MAX_ATTENTION_GROWTH = 2
# Attention implementations that read a prepared 4D mask.
MASKED_ATTENTION = ("sdpa", "eager")
# How far the first shared chunk may be from the plain path (largest log-prob difference) before the model
# is taken to ignore the tree's mask or positions: float32 reorders sums to ~1e-5, bfloat16 to ~5e-2
# (benchmarks/SHARED_PREFIX.md); a mask ignored moves log-probs by whole units.
CHECK_TOLERANCE = {torch.float32: 1e-3}
CHECK_TOLERANCE_LOW_PRECISION = 0.25


class SharedPrefix:
    """One trainer's shared-prefix state: the mode, whether the model was checked against the plain path,
    and what has already been said or found unsupported (each reason is logged once)."""

    def __init__(self, mode: str = "auto"):
        if mode not in MODES:
            raise ValueError(f"shared-prefix mode {mode!r} is not one of {', '.join(MODES)}")
        self.mode = mode
        self.broken: str | None = None  # a model found to ignore the tree: plain path from then on
        self.checked = False  # the first shared chunk was compared with the plain path
        self._noted: set[str] = set()
        self.shared_chunks = 0  # counts for tests and benchmarks
        self.plain_chunks = 0
        self.row_tokens = 0  # real tokens of the shared chunks' rows, and the tree tokens computed for them
        self.tree_tokens = 0

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
                 plain: Callable[..., tuple]) -> tuple:
    """What TRL's `_get_per_token_logps_and_entropies` returns, shared where this call allows it;
    `plain(ids, mask, batch_size, on=None)` is TRL's own method on `model` (or on the model `on`);
    `state` the run's (run/context.py)."""
    if not declined(accelerator, state, model, input_ids.device, extras, compute_aux_loss):
        return per_token_logps(accelerator, state, model, input_ids, attention_mask, logits_to_keep, batch_size,
                               compute_entropy, lambda ids, mask, on=None: plain(ids, mask, None, on))
    return plain(input_ids, attention_mask, batch_size)


def shares_micro_batches(accelerator: Any, state: SharedPrefix, model: Any, wrapped: Any) -> bool:
    """Whether the loss pass of `model` (`wrapped`: as the accelerator wrapped it) shares, so a step's
    micro-batches should hold whole groups (step/loss.py `split_micro_batches`). Where it does not, TRL's
    split stays as it is (the same run as with sharing off). Why keeping groups together is safe for
    every loss type: step/micro_batches.py."""
    return not declined(accelerator, state, wrapped, next(model.parameters()).device)


def declined(accelerator: Any, state: SharedPrefix, model: Any, device: torch.device,
             extras: dict[str, Any] | None = None, compute_aux_loss: bool = False) -> str | None:
    """Why this pass takes TRL's path (None: it shares), said once per reason. Besides what the
    model cannot do (`unsupported`), `auto` leaves to TRL's path the devices it was not measured to pay
    on, and a pass with dropout on: there a shared token's dropout mask would be drawn once for its rows
    instead of once per row, a valid sample but not the plain path's (`on` shares it, and says so)."""
    if not state.active:
        return "off"
    reason = unsupported(accelerator, model, extras or {}, compute_aux_loss)
    if not reason and dropout_in_use(_trained(accelerator, model)):
        if state.mode == "auto":
            reason = ("dropout is on (--lora-dropout): auto leaves passes with dropout to TRL's path "
                      "(--lora-dropout 0 or --shared-prefix-loss on shares them)")
        else:
            state.note_once("dropout is on: a shared token's dropout mask is drawn once for all its rows, not "
                            "once per row (--shared-prefix-loss on)")
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
    peft_config = getattr(unwrapped, "active_peft_config", None)
    if peft_config is not None and (peft_config.is_prompt_learning
                                    or getattr(peft_config, "alora_invocation_tokens", None)):
        return "a prompt-learning or aLoRA adapter"
    causal = _trained(accelerator, model)
    if getattr(causal.config.get_text_config(), "output_router_logits", False):
        return "the model returns router logits"
    text = causal.config.get_text_config()
    other_layers = sorted({kind for kind in getattr(text, "layer_types", None) or () if kind != "full_attention"})
    if other_layers:
        return f"{', '.join(other_layers)} layers (the tree's mask is full attention's)"
    if getattr(text, "sliding_window", None) and getattr(text, "use_sliding_window", True):
        return "sliding-window attention (the tree's mask would reach past the window)"
    attention = getattr(causal.config, "_attn_implementation", None) or "eager"
    if attention not in MASKED_ATTENTION:
        return f"{attention} attention takes no tree mask (sdpa and eager do)"
    return None


def per_token_logps(accelerator: Any, state: SharedPrefix, model: Any, input_ids: torch.Tensor,
                    attention_mask: torch.Tensor, logits_to_keep: int, batch_size: int | None, compute_entropy: bool,
                    plain: Callable[..., tuple]) -> tuple:
    """TRL's `(logps, entropies, aux_loss)` for these rows: in the order of their tokens, each chunk of
    `batch_size` rows shared where it pays and `plain(ids, mask)` (TRL's own method on that chunk) where
    not, the results in the rows' own order. Each chunk is one forward of `model`, shared or not: under a
    distributed wrapper a forward can be a collective (DDP broadcasts the buffers), so every process must
    make as many whatever its rows."""
    batch_size = batch_size or input_ids.size(0)
    order = token_order(input_ids, attention_mask)
    logps, entropies = [], []
    for start in range(0, input_ids.size(0), batch_size):
        rows = order[start:start + batch_size]
        ids, mask = input_ids[rows], attention_mask[rows]
        result = _tree_chunk(accelerator, state, model, ids, mask, logits_to_keep, compute_entropy, plain) \
            if state.active else None
        if result is None:
            state.plain_chunks += 1
            result = plain(ids, mask)[:2]
        else:
            state.shared_chunks += 1
        logps.append(result[0])
        entropies.append(result[1])
    back = torch.empty_like(order)
    back[order] = torch.arange(order.numel(), device=order.device)
    return torch.cat(logps)[back], (torch.cat(entropies)[back] if compute_entropy else None), None


def token_order(input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """The rows sorted by their real tokens (padding left out), so rows with a common prefix are adjacent;
    rows with equal tokens keep their order."""
    ids, mask = input_ids.tolist(), attention_mask.tolist()
    keys = [[token for token, keep in zip(row, kept) if keep] for row, kept in zip(ids, mask)]
    return torch.tensor(sorted(range(len(keys)), key=keys.__getitem__), dtype=torch.long, device=input_ids.device)


def _tree_chunk(accelerator: Any, state: SharedPrefix, model: Any, ids: torch.Tensor, mask: torch.Tensor,
                logits_to_keep: int, compute_entropy: bool,
                plain: Callable[..., tuple]) -> tuple[torch.Tensor, torch.Tensor | None] | None:
    causal = _trained(accelerator, model)
    tree = build_tree(ids, mask, logits_to_keep, by_column=not _rotary(causal))
    if tree.nodes >= tree.row_tokens:
        return None  # nothing shared
    if tree.nodes > MAX_NODES:
        state.note_once(f"a chunk's tree of {tree.nodes} tokens is over {MAX_NODES} (its mask is quadratic); "
                        f"such chunks take TRL's plain path")
        return None
    width = _used_width(ids, mask, logits_to_keep)
    if tree.nodes ** 2 > MAX_ATTENTION_GROWTH * ids.size(0) * width ** 2:
        state.note_once(f"a chunk whose rows share little makes a tree whose dense mask holds over "
                        f"{MAX_ATTENTION_GROWTH}x the plain rows' attention scores; such chunks take TRL's plain path")
        return None
    if state.mode == "auto" and _cost(causal, tree, ids.size(0), width) > AUTO_MAX_COST:
        return None
    logps, entropy = _tree_forward(accelerator, model, causal, tree, compute_entropy)
    if not state.checked and not dropout_in_use(causal):  # with dropout the two paths draw different masks
        state.checked = True
        # Against the model under the distributed wrapper: one process checks where another does not, and
        # a forward of the wrapper would be a collective the others never join (the run hangs).
        problem = _differs_from_plain(causal, logps, ids, mask,
                                      lambda i, m: plain(i, m, on=accelerator.unwrap_model(model)))
        if problem:
            state.broken = problem
            state.note(problem)
            return None
    state.row_tokens += tree.row_tokens
    state.tree_tokens += tree.nodes
    return logps, entropy


def _tree_forward(accelerator: Any, model: Any, causal: Any, tree: PackedTree,
                  compute_entropy: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The tree through `model` (its own forward: PEFT and TRL's fused head pass the inputs on), scores
    gathered into (rows, completion columns), zero where a column is not scored, as in the plain path."""
    attention = getattr(causal.config, "_attn_implementation", None) or "eager"
    if attention == "sdpa":
        bias = tree.visible[None, None]
    else:
        bias = tree.attention_bias(next(causal.parameters()).dtype)
    with accelerator.autocast():
        out = model(input_ids=tree.ids[None], attention_mask=bias, position_ids=tree.positions[None],
                    shift_labels=tree.labels[None], fused_lm_head=True)
    scored = tree.index >= 0
    where = tree.index.clamp(min=0)

    def gathered(values):
        return values[0][where].masked_fill(~scored, 0.0)

    return gathered(out.log_probs), (gathered(out.entropy) if compute_entropy else None)


def _differs_from_plain(causal: Any, logps: torch.Tensor, ids: torch.Tensor, mask: torch.Tensor,
                        plain: Callable[..., tuple]) -> str | None:
    with torch.no_grad():
        reference = plain(ids, mask)[0]
    dtype = next(causal.parameters()).dtype
    tolerance = CHECK_TOLERANCE.get(dtype, CHECK_TOLERANCE_LOW_PRECISION)
    gap = float((logps.detach() - reference).abs().max()) if reference.numel() else 0.0
    if gap > tolerance:
        return (f"the model's log-probs over a prefix tree differ from the plain path's by {gap:.3g} "
                f"(it ignores a custom attention mask or position ids)")
    return None


def _rotary(causal: Any) -> bool:
    """Whether the model's positions are rotary (relative): transformers 5 configs name their rope settings."""
    config = causal.config.get_text_config()
    return any(getattr(config, name, None) is not None for name in ("rope_parameters", "rope_theta", "rope_scaling"))


def _used_width(ids: torch.Tensor, mask: torch.Tensor, logits_to_keep: int) -> int:
    """The plain path's padded width for these rows: the prompt columns and the completion columns some
    row uses (the plain passes cut the rest)."""
    used = mask[:, ids.size(1) - logits_to_keep:].any(dim=0).nonzero()
    return ids.size(1) - logits_to_keep + (int(used[-1]) + 1 if used.numel() else 0)


def _cost(causal: Any, tree: PackedTree, rows: int, width: int) -> float:
    config = causal.config.get_text_config()
    weights = causal.num_parameters(exclude_embeddings=True)
    heads = getattr(config, "num_attention_heads", 1)
    heads_width = heads * (getattr(config, "head_dim", None) or config.hidden_size // heads)
    return cost_ratio(tree, plain_tokens=rows * width, plain_width=width,
                      weights_per_token=weights, attention_per_key=2 * config.num_hidden_layers * heads_width)


__all__ = ["MODES", "SharedPrefix", "declined", "per_token_logps", "shared_logps", "shares_micro_batches"]
