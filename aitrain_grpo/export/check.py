"""The check `aitrain export` runs before it puts a model in place: does the written folder, loaded
with plain transformers, score text as the trained model did?

What is compared: the per-token log-probabilities of a few fixed conversations (rendered with the
model's chat template), from
- the trained model as training left it: float32, the LoRA adapter wrapping its base;
- the merged model in memory (float32): merging must not change them (float32 rounding only);
- the same weights rounded to the export dtype, still in memory;
- the written folder reloaded with `AutoModelForCausalLM.from_pretrained(DIR, dtype=float32)`, no PEFT:
  it must give what the rounded in-memory weights gave (a lost tied embedding or a weight left out
  shows up here), and stay within the dtype's tolerance of the trained model.
All forward passes run in float32 (a bfloat16/float16 folder is upcast on load), so the numbers say
what the export did to the weights, not what a given machine's half-precision arithmetic adds later.
The adapter's own effect (adapter on vs off) is measured too: a broken merge moves log-probabilities
by about that much, far above the tolerances.

Measured (max over the check tokens, nats), tiny after 2 LoRA steps at lr 1e-2 (adapter effect 4.6)
and SmolLM2-135M after 1 step at lr 1e-3 (adapter effect 0.71): float32 5e-6 and 3e-5, bfloat16 0.048
and 0.076, float16 0.007 and 0.027. The tolerances leave room for larger models (more layers add up).

Left out: generation-level checks (greedy text can flip on a near-tie even when log-probabilities agree).
"""

from __future__ import annotations

from dataclasses import dataclass

# Exported (reloaded) vs trained: what the dtype's rounding may cost.
TOLERANCES = {"float32": 1e-3, "bfloat16": 0.5, "float16": 0.25}
MERGE_TOLERANCE = 1e-3   # merged vs adapter-wrapped, both float32
RELOAD_TOLERANCE = 1e-4  # reloaded folder vs the same weights in memory (0 in practice)
CHECK_CONVERSATIONS = (
    [{"role": "user", "content": "What is the capital of France?"}, {"role": "assistant", "content": "Paris."}],
    [{"role": "system", "content": "You are a helpful assistant."},
     {"role": "user", "content": "Book a room for two nights from Friday."},
     {"role": "assistant", "content": "Which hotel would you like, and for how many guests?"}],
    [{"role": "user", "content": "Count to five."}, {"role": "assistant", "content": "1, 2, 3, 4, 5"}],
)


@dataclass(frozen=True)
class CheckResult:
    dtype: str
    tokens: int
    max_abs_diff: float            # exported folder vs the trained model (nats)
    tolerance: float
    merge_diff: float | None       # merged vs adapter-wrapped, float32 (None: a full model)
    reload_diff: float             # folder reloaded vs the same weights in memory
    adapter_effect: float | None   # adapter on vs off: what the merge has to carry over

    def problem(self) -> str | None:
        """Why the export must not be used, or None."""
        if self.merge_diff is not None and not self.merge_diff <= MERGE_TOLERANCE:
            return f"merging the adapter changed log-probabilities by up to {self.merge_diff:.3g} (tolerance {MERGE_TOLERANCE:g})"
        if not self.reload_diff <= RELOAD_TOLERANCE:
            return (f"the written folder does not load back as the merged model: log-probabilities differ by up to "
                    f"{self.reload_diff:.3g} (tolerance {RELOAD_TOLERANCE:g}; tied or missing weights?)")
        if not self.max_abs_diff <= self.tolerance:
            return (f"rounding to {self.dtype} moved log-probabilities by up to {self.max_abs_diff:.3g} "
                    f"(tolerance {self.tolerance:g}); try --dtype float32")
        return None

    def rounding_note(self) -> str | None:
        """A warning when the dtype's rounding is as large as what training changed."""
        if self.dtype == "float32" or not self.adapter_effect or self.max_abs_diff < 0.5 * self.adapter_effect:
            return None
        return (f"note: rounding to {self.dtype} moves log-probabilities ({self.max_abs_diff:.2g}) about as much as the "
                f"adapter does ({self.adapter_effect:.2g}); --dtype float32 keeps all of the training's effect")


def check_sequences(tokenizer) -> list[list[int]]:
    """Token ids of the check conversations, rendered with the chat template (as plain text when the
    tokenizer has none, or its template refuses one of them, e.g. a system turn)."""
    sequences = []
    for messages in CHECK_CONVERSATIONS:
        text = None
        if getattr(tokenizer, "chat_template", None):
            try:
                text = tokenizer.apply_chat_template(list(messages), tokenize=False)
            except Exception:  # noqa: BLE001 - a template may raise anything (jinja's raise_exception)
                text = None
        text = text or "\n".join(m["content"] for m in messages)
        sequences.append(tokenizer(text, add_special_tokens=False)["input_ids"])
    return sequences


def token_logprobs(model, sequences: list[list[int]]):
    """Log-probability of every token after the first, for all sequences one after another (float32)."""
    import torch

    parts = []
    device = next(model.parameters()).device
    with torch.no_grad():
        for ids in sequences:
            tokens = torch.tensor([ids], device=device)
            logits = model(tokens).logits[0, :-1].float()
            parts.append(torch.log_softmax(logits, -1).gather(-1, tokens[0, 1:, None])[:, 0].cpu())
    return torch.cat(parts)


def max_diff(a, b) -> float:
    return float((a - b).abs().max())
