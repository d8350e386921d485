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

Slightly over 400 lines on purpose: about a third is data (the word lists, the synthetic conversation
generator and the chat template), which reads best next to the build that uses it.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import random
import shutil
import uuid
from pathlib import Path

logger = logging.getLogger(__name__)

TINY_MODEL_ID = "tiny"
TINY_VERSION = 3

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
# Share of tool-calling conversations the warm-up keeps (see `_warmup_conversation`).
WARMUP_TOOL_CALL_KEEP = 0.5

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

_WORDS = """
the a an and or but so if then when while because of to in on at by for with from about into over
after before under between through during without again once here there all any both each few more
most other some such no not only own same than too very can will just should now is are was were be
been being have has had do does did say said make made go went take took see saw come came know
knew get got give gave find found think thought tell told ask asked work worked seem feel try leave
call called keep let begin help show hear play run move live believe bring happen write sit stand
lose pay meet include continue set learn change lead understand watch follow stop create speak read
allow add spend grow open walk win offer remember love consider appear buy wait serve die send
expect build stay fall cut reach kill remain suggest raise pass sell require report decide pull
time year people way day man woman child world life hand part place case week company system
program question government number night point home water room mother area money story fact month
lot right study book eye job word business issue side kind head house service friend father power
hour game line end member law car city community name president team minute idea kid body
information back parent face others level office door health person art war history party result
morning reason research girl guy moment air teacher force education good new first last long great
little old big high different small large next early young important public bad able happy quiet
simple clear warm cold bright dark quick slow easy hard sure free full real best better certain
banana apple orange garden river mountain ocean table window paper music picture animal flower
""".split()

_CITIES = """Paris London Berlin Madrid Rome Lisbon Vienna Prague Oslo Tokyo Kyoto Seoul Sydney Toronto
Chicago Boston Denver Austin Seattle Dublin Athens Cairo Nairobi Lima Bogota Havana Istanbul
Amsterdam Barcelona Florence""".split()

_HOTEL_WORDS = """Grand Plaza Royal Park Harbor Garden Central Palace Riverside Sunset Ocean Alpine Maple
Crown Lakeside Metro Golden Silver Corner Station Old Town""".split()
_HOTEL_KINDS = ["Hotel", "Inn", "Suites", "Lodge", "Resort", "House"]

_DOMAIN_WORDS = """hotel room rooms booking book booked reservation guest guests night nights check
available availability price prices total budget breakfast suite double single city date dates
confirm confirmed confirmation cancel search results stay arrival departure rating stars cheap
nearby airport""".split()


def _function_schema(name: str, description: str, optional=(), **params: tuple[str, str]) -> dict:
    properties = {key: {"type": kind, "description": text} for key, (kind, text) in params.items()}
    required = [key for key in params if key not in optional]
    return {"type": "function", "function": {"name": name, "description": description, "parameters": {
        "type": "object", "properties": properties, "required": required}}}


_DATE = "YYYY-MM-DD."
HOTEL_TOOLS = [
    _function_schema("search_hotels", "Find hotels in a city.", optional=("max_price",),
                     city=("string", "City name."), max_price=("integer", "Highest price per night.")),
    _function_schema("check_availability", "Check free rooms for a stay.", hotel_id=("string", "Hotel id."),
                     check_in=("string", f"Arrival date, {_DATE}"),
                     check_out=("string", f"Departure date, {_DATE}")),
    _function_schema("book_hotel", "Book a room for a guest.", hotel_id=("string", "Hotel id."),
                     guest_name=("string", "Full name of the guest."),
                     check_in=("string", f"Arrival date, {_DATE}"), nights=("integer", "Number of nights.")),
]

_SYSTEM_PROMPTS = ["You are a helpful assistant.", "Answer briefly.", "You are a friendly travel agent.",
                   "You are a hotel booking assistant. Use the tools to help the guest."]

_NAMES = "Ada Ben Chen Dana Eli Fatima Gus Hana Ivan Jo Kai Lena Maya Noor Omar Pia Raj Sara Tom Uma".split()


def _date(rng: random.Random) -> str:
    return f"{rng.choice([2025, 2026, 2027])}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"


def _hotel(rng: random.Random) -> str:
    return f"{rng.choice(_HOTEL_WORDS)} {rng.choice(_HOTEL_KINDS)}"


def _words(rng: random.Random, low: int, high: int) -> str:
    pool = _WORDS if rng.random() < 0.7 else _WORDS + _DOMAIN_WORDS + _CITIES
    # Skewed towards short answers: the model learns a higher chance of ending at every word, so
    # sampled turns nearly always close within a small token budget.
    count = low + int((high - low + 1) * rng.random() ** 2)
    words = [rng.choice(pool) for _ in range(count)]
    if rng.random() < 0.2:
        words.insert(rng.randrange(len(words) + 1), str(rng.randint(0, 500)))
    text = " ".join(words)
    return text[0].upper() + text[1:] + rng.choice([".", ".", ".", "!", "?"])


def _user_message(rng: random.Random) -> str:
    city, date = rng.choice(_CITIES), _date(rng)
    templates = [
        f"Find a hotel in {city} for {date}.",
        f"I need a room in {city} from {date} for {rng.randint(1, 9)} nights.",
        f"Book the {_hotel(rng)} for {rng.choice(_NAMES)} on {date}.",
        f"Is the {_hotel(rng)} in {city} available on {date}?",
        f"Guess my number between 1 and {rng.choice([10, 50, 100])}.",
        f"Tell me about {rng.choice(_WORDS + _CITIES)}.",
        f"What is {rng.randint(0, 99)} plus {rng.randint(0, 99)}?",
        "Hello, who are you?",
        _words(rng, 3, 14),
    ]
    return rng.choice(templates)


def _tool_call(rng: random.Random, tools: list[dict]) -> dict:
    name = rng.choice(tools)["function"]["name"]
    hotel_id = f"h{rng.randint(1, 999)}"
    if name == "search_hotels":
        args = {"city": rng.choice(_CITIES)}
        if rng.random() < 0.5:
            args["max_price"] = rng.randint(50, 400)
    elif name == "check_availability":
        args = {"hotel_id": hotel_id, "check_in": _date(rng), "check_out": _date(rng)}
    else:
        args = {"hotel_id": hotel_id, "guest_name": rng.choice(_NAMES), "check_in": _date(rng),
                "nights": rng.randint(1, 9)}
    # Both spellings of arguments occur in the wild; the template must render either.
    arguments = json.dumps(args) if rng.random() < 0.3 else args
    return {"type": "function", "function": {"name": name, "arguments": arguments}}


def _tool_result(rng: random.Random, call: dict) -> str:
    name = call["function"]["name"]
    if name == "search_hotels":
        hotels = [{"id": f"h{rng.randint(1, 999)}", "name": _hotel(rng), "price": rng.randint(40, 500),
                   "rating": rng.randint(1, 5)} for _ in range(rng.randint(1, 3))]
        return json.dumps({"results": hotels})
    if name == "check_availability":
        return json.dumps({"available": rng.random() < 0.6, "rooms": rng.randint(0, 12)})
    return json.dumps({"confirmation": f"C{rng.randint(10000, 99999)}", "total": rng.randint(80, 3000)})


def synthetic_conversation(rng: random.Random) -> tuple[list[dict], list[dict] | None]:
    """One random conversation and the tools it was rendered with (None for a plain chat)."""
    # A random subset of the tools keeps the system block short and varied.
    tools = [t for t in HOTEL_TOOLS if rng.random() < 0.6] or [rng.choice(HOTEL_TOOLS)]
    use_tools = rng.random() < 0.3
    messages: list[dict] = []
    if rng.random() < 0.4:
        messages.append({"role": "system", "content": rng.choice(_SYSTEM_PROMPTS)})
    for _ in range(rng.choice([1, 1, 1, 2])):
        messages.append({"role": "user", "content": _user_message(rng)})
        if use_tools and rng.random() < 0.7:
            calls = [_tool_call(rng, tools) for _ in range(rng.choice([1, 1, 1, 2]))]
            content = _words(rng, 2, 6) if rng.random() < 0.2 else ""
            messages.append({"role": "assistant", "content": content, "tool_calls": calls})
            messages.extend({"role": "tool", "content": _tool_result(rng, c)} for c in calls)
        messages.append({"role": "assistant", "content": _words(rng, 3, 30)})
    return messages, (tools if use_tools else None)


# Warm-up prose draws words with Zipf's law over _WORDS, which starts with the most common English
# words, instead of uniformly: like real text, " a", " an", " and" are frequent. The tokenizer's
# corpus keeps uniform words, so the vocabulary does not depend on this.
_ZIPF_CUMULATIVE = list(itertools.accumulate(1.0 / rank for rank in range(1, len(_WORDS) + 1)))


def _zipf_words(rng: random.Random, low: int, high: int) -> str:
    count = low + int((high - low + 1) * rng.random() ** 2)
    words = rng.choices(_WORDS, cum_weights=_ZIPF_CUMULATIVE, k=count)
    if rng.random() < 0.2:
        words.insert(rng.randrange(len(words) + 1), str(rng.randint(0, 500)))
    text = " ".join(words)
    return text[0].upper() + text[1:] + rng.choice([".", ".", ".", "!", "?"])


def _warmup_conversation(rng: random.Random) -> tuple[list[dict], list[dict] | None]:
    """A synthetic conversation as the warm-up sees it, with Zipf-weighted prose.

    A conversation with tool calls renders to ~400 tokens (the tools block alone ~280), a plain one to
    ~50, so tool JSON would fill most of the warm-up; keeping only half of the tool-calling ones leaves
    the model's plain answers less drawn to JSON keys like "name", while the 512-token windows show a
    call together with the tools block that licenses it."""
    while True:
        messages, tools = synthetic_conversation(rng)
        calls_tools = any(m.get("tool_calls") for m in messages)
        if not calls_tools or rng.random() < WARMUP_TOOL_CALL_KEEP:
            break
    for m in messages:
        if m["role"] == "assistant" and m.get("content"):
            m["content"] = _zipf_words(rng, 2, 6) if m.get("tool_calls") else _zipf_words(rng, 3, 30)
    return messages, tools


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
        messages, tools = _warmup_conversation(rng)
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
    model.to(torch.float32).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
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


def build_tiny_model(output_dir, *, seed: int = 0) -> Path:
    """Builds the tiny tokenizer and model into output_dir (replacing what is there) and returns it."""
    target = Path(output_dir).expanduser().absolute()
    temp = _temp_dir_beside(target)
    try:
        _build_into(temp, seed)
        if target.exists():
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
