"""A tiny local chat model for demos and tests, built on the spot with no downloads.

`build_tiny_model` trains a byte-level BPE tokenizer on a synthetic corpus generated here (English
words, a hotel-booking vocabulary, dates, numbers, JSON tool calls), attaches a ChatML-style chat
template with tool support, creates a two-layer Llama-architecture model and warms it up for a few
hundred steps on synthetic conversations, so that sampled assistant turns usually end with
`<|im_end|>` while the output distribution stays broad enough for RL to move it. The warm-up's prose
follows Zipf's law (common words like " a" are frequent, as in real text) and its tool calls mostly
come with a visible tools block; both decide what a short GRPO run converges to (measurements in
tests/test_learning.py). `tiny_model_path` caches one build per recipe version;
`models.resolve_model("tiny")` is how the commands turn `--model tiny` into a path.

Deliberately left out: any notion of quality (the model answers with word salad), multimodal or
list-of-parts message content, reasoning blocks, parallel-call formatting beyond simple
concatenation, identical weights across torch versions or thread counts (a seed is reproducible on
one setup), and cleanup of temp folders left behind by a build that was killed half-way.

The synthetic conversations it trains on come from tiny_corpus.py.
"""

from __future__ import annotations

import json
import logging
import os
import random
import shutil
import uuid
from pathlib import Path

from aitrain_grpo.outputs import check_folder_output
from aitrain_grpo.models.tiny_corpus import HOTEL_TOOLS, synthetic_conversation, warmup_conversation

logger = logging.getLogger(__name__)

TINY_MODEL_ID = "tiny"
TINY_VERSION = 3
TINY_MARKER = "aitrain_tiny.json"  # marks a folder as a tiny model this package built (outputs.py)

PAD_TOKEN = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
# Not special: decode(skip_special_tokens=True) must keep them, since tool-call parsing reads them.
TOOL_MARKERS = ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>")

VOCAB_SIZE = 1536
# About 300k training tokens: ~20 s on one CPU thread, the bulk of the build. Windows of 512 tokens
# rather than 256: a tools block is ~280 tokens, and a call should be seen with the block before it.
WARMUP_STEPS = 300
WARMUP_BATCH = 2
WARMUP_SEQ_LEN = 512
WARMUP_LR = 3e-3

# Written with whitespace control on every tag and newlines only inside string literals, so the
# trim_blocks/lstrip_blocks settings transformers uses cannot change the output. Earlier messages
# never depend on later ones, which is what makes the rendering append-only.
CHAT_TEMPLATE = r"""
{%- if tools -%}
  {{- '<|im_start|>system\n' -}}
  {%- if messages and messages[0].role == 'system' -%}
    {{- messages[0].content -}}
  {%- else -%}
    {{- 'You are a helpful assistant.' -}}
  {%- endif -%}
  {{- '\n\n# Tools\nYou can call these functions:\n' -}}
  {%- for tool in tools -%}
    {{- tool | tojson -}}{{- '\n' -}}
  {%- endfor -%}
  {{- 'To call a function, answer with <tool_call>{"name": <name>, "arguments": <args-json>}</tool_call>' -}}
  {{- '<|im_end|>\n' -}}
{%- endif -%}
{%- for message in messages -%}
  {%- if loop.first and tools and message.role == 'system' -%}
  {%- elif message.role == 'tool' -%}
    {{- '<|im_start|>tool\n<tool_response>\n' -}}
    {{- message.content if message.content is string else (message.content | tojson) -}}
    {{- '\n</tool_response><|im_end|>\n' -}}
  {%- else -%}
    {{- '<|im_start|>' + message.role + '\n' -}}
    {%- if message.content is string -%}{{- message.content -}}{%- endif -%}
    {%- if message.role == 'assistant' and message.tool_calls -%}
      {%- for call in message.tool_calls -%}
        {%- set fn = call.function if call.function is defined else call -%}
        {{- '<tool_call>{"name": ' + (fn.name | tojson) + ', "arguments": ' -}}
        {%- if fn.arguments is string -%}{{- fn.arguments -}}{%- else -%}{{- fn.arguments | tojson -}}{%- endif -%}
        {{- '}</tool_call>' -}}
      {%- endfor -%}
    {%- endif -%}
    {{- '<|im_end|>\n' -}}
  {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
  {{- '<|im_start|>assistant\n' -}}
{%- endif -%}
"""

def _bpe_corpus(rng: random.Random, n: int = 3000):
    tool_lines = [json.dumps(t) for t in HOTEL_TOOLS]
    for _ in range(n):
        messages, tools = synthetic_conversation(rng)
        for m in messages:
            yield m.get("content") or ""
            for call in m.get("tool_calls", []):
                fn = call["function"]
                args = fn["arguments"] if isinstance(fn["arguments"], str) else json.dumps(fn["arguments"])
                yield f'<tool_call>{{"name": {json.dumps(fn["name"])}, "arguments": {args}}}</tool_call>'
        if tools:
            yield "\n".join(tool_lines)
    for role in ("system", "user", "assistant", "tool"):
        yield f"{role}\n" * 50
    yield "You can call these functions:\nTo call a function, answer with"


def build_tokenizer():
    """Trains the byte-level BPE and wraps it as a transformers fast tokenizer with the chat template."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    # No prefix space and no normalizer: decode(encode(text)) must give back text byte for byte.
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=[PAD_TOKEN, IM_START, IM_END],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    # A fixed corpus seed keeps the vocabulary identical across model seeds.
    bpe.train_from_iterator(_bpe_corpus(random.Random(1234)), trainer=trainer)
    bpe.add_tokens([AddedToken(t, special=False, normalized=False) for t in TOOL_MARKERS])

    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        eos_token=IM_END,
        pad_token=PAD_TOKEN,
        extra_special_tokens=[IM_START],
        padding_side="left",
        clean_up_tokenization_spaces=False,
        model_max_length=4096,
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def _warmup_batches(tokenizer, rng: random.Random, steps: int, batch: int, seq_len: int):
    """Rendered conversations packed end to end into a (steps, batch, seq_len) tensor of token ids."""
    import torch

    # Packing instead of padding: every token trained on is real text, which matters when the
    # whole build has a ~30 s budget on one CPU thread.
    need = steps * batch * seq_len
    ids: list[int] = []
    while len(ids) < need:
        messages, tools = warmup_conversation(rng)
        text = tokenizer.apply_chat_template(messages, tools=tools, tokenize=False)
        ids.extend(tokenizer(text, add_special_tokens=False).input_ids)
    return torch.tensor(ids[:need]).view(steps, batch, seq_len)


def _warm_up(model, tokenizer, seed: int) -> None:
    """A few hundred steps of plain causal-LM training: enough to close turns, not to narrow them."""
    import torch

    data = _warmup_batches(tokenizer, random.Random(seed), WARMUP_STEPS, WARMUP_BATCH, WARMUP_SEQ_LEN)
    optimizer = torch.optim.AdamW(model.parameters(), lr=WARMUP_LR, weight_decay=0.0)
    # Linear decay to zero: the last steps settle instead of jumping, without adding steps.
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 - step / WARMUP_STEPS)
    model.train()
    for batch in data:
        model(input_ids=batch, labels=batch).loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        optimizer.zero_grad(set_to_none=True)
    model.eval()


def _build_into(directory: Path, seed: int) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = build_tokenizer()
    pad_id = tokenizer.convert_tokens_to_ids(PAD_TOKEN)
    eos_id = tokenizer.convert_tokens_to_ids(IM_END)
    config = LlamaConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2,
        # hidden_size / heads would be 16, below the smallest head size vLLM's CPU attention runs.
        head_dim=32,
        vocab_size=len(tokenizer), max_position_embeddings=4096, tie_word_embeddings=False,
        # Larger-than-usual init: with 0.02 the weights are so small that LoRA on top barely learns.
        initializer_range=0.1,
        # The tokenizer adds no BOS; the id is only there for code that insists on one.
        bos_token_id=pad_id, eos_token_id=eos_id, pad_token_id=pad_id,
    )
    # A private RNG stream: building must not disturb the caller's random state, and the same seed
    # must give the same weights whatever ran before.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
        _warm_up(model, tokenizer, seed)
    model.generation_config.eos_token_id = eos_id
    model.generation_config.pad_token_id = pad_id
    from transformers.utils import logging as hf_logging

    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # transformers' "Writing model shards" bar, on stderr, for one small file
    try:
        model.to(torch.float32).save_pretrained(directory)
    finally:
        if bars:
            hf_logging.enable_progress_bar()
    tokenizer.save_pretrained(directory)
    (directory / TINY_MARKER).write_text(json.dumps({"tiny_version": TINY_VERSION, "seed": seed}) + "\n")
    # The weights file is written private; give every file the folder's umask-derived mode instead,
    # so a cache shared through AITRAIN_CACHE_DIR is readable by whoever can read the folder.
    for path in directory.iterdir():
        path.chmod(directory.stat().st_mode & 0o666)


def _temp_dir_beside(target: Path) -> Path:
    # Same folder as the target, so the final rename stays on one filesystem and is atomic. A plain
    # mkdir (not mkdtemp, which makes it private) so a shared cache stays readable under the umask.
    target.parent.mkdir(parents=True, exist_ok=True)
    temp = target.with_name(f".{target.name}.tmp-{uuid.uuid4().hex}")
    temp.mkdir()
    return temp


def build_tiny_model(output_dir, *, seed: int = 0, overwrite: bool = False) -> Path:
    """Builds the tiny tokenizer and model into output_dir and returns it. The folder must be new or
    empty; with `overwrite`, a tiny model built before (it holds `TINY_MARKER`) is replaced, and nothing
    else ever is (outputs.py)."""
    target = check_folder_output(output_dir, flag="OUTPUT_DIR", overwrite=overwrite, kind="tiny").absolute()
    temp = _temp_dir_beside(target)
    try:
        _build_into(temp, seed)
        if target.exists():  # empty, or a tiny model of ours with overwrite: set aside, then removed
            old = target.with_name(f".{target.name}.old-{uuid.uuid4().hex}")
            os.replace(target, old)
            os.replace(temp, target)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(temp, target)
    finally:
        shutil.rmtree(temp, ignore_errors=True)
    return target


def cache_root(cache_dir=None) -> Path:
    """The folder built and converted models are cached in: `cache_dir`, $AITRAIN_CACHE_DIR or ~/.cache/aitrain-grpo."""
    root = cache_dir or os.environ.get("AITRAIN_CACHE_DIR") or "~/.cache/aitrain-grpo"
    return Path(root).expanduser().absolute()


def tiny_model_path(cache_dir=None) -> Path:
    """The cached tiny model for this recipe version, built on first use."""
    target = cache_root(cache_dir) / f"tiny-v{TINY_VERSION}"
    if (target / "config.json").exists():
        return target
    logger.info("building the tiny model into %s (once, about 30 s)", target)
    temp = _temp_dir_beside(target)
    try:
        _build_into(temp, seed=0)
        try:
            os.rename(temp, target)
        except OSError:
            # Another process published its build first; it is the same recipe, so use it.
            if not target.exists():
                raise
    finally:
        shutil.rmtree(temp, ignore_errors=True)
    if not (target / "config.json").exists():
        raise RuntimeError(f"{target} exists but holds no model; delete it and try again")
    return target
