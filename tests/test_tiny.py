"""The tiny local model: reloads offline, tokenizes losslessly, renders tools append-only, samples
turns that end, calls tools mostly when they are listed, and is cached once per recipe version."""

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM, PreTrainedTokenizerFast

from aitrain_grpo.models import tiny
from aitrain_grpo.models.loading import resolve_model

torch.set_num_threads(1)

TOOLS = tiny.HOTEL_TOOLS

CONVERSATION = [
    {"role": "system", "content": "You book hotels."},
    {"role": "user", "content": "Find me a room in Paris on 2026-12-04."},
    {"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "function": {"name": "search_hotels", "arguments": {"city": "Paris"}}}]},
    {"role": "tool", "content": '{"results": [{"id": "h7", "price": 120}]}'},
    {"role": "assistant", "content": "Let me check.", "tool_calls": [
        {"type": "function", "function": {"name": "check_availability",
                                          "arguments": '{"hotel_id": "h7", "check_in": "2026-12-04"}'}}]},
    {"role": "tool", "content": '{"available": true}'},
    {"role": "assistant", "content": "The Grand Hotel has a room for 120."},
    {"role": "user", "content": "Book it, thanks!"},
]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return tiny.build_tiny_model(tmp_path_factory.mktemp("tiny") / "model", seed=0)


@pytest.fixture(scope="module")
def tokenizer(model_dir):
    return AutoTokenizer.from_pretrained(model_dir)


@pytest.fixture(scope="module")
def model(model_dir):
    return AutoModelForCausalLM.from_pretrained(model_dir).eval()


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("cache")


@pytest.fixture(scope="module")
def cached_model_dir(cache_dir):
    return tiny.tiny_model_path(cache_dir=cache_dir)


def render(tokenizer, messages, tools=None, **kwargs):
    return tokenizer.apply_chat_template(messages, tools=tools, tokenize=False, **kwargs)


def test_reloads_through_auto_classes_as_the_same_tokenizer_and_a_llama(tokenizer, model):
    assert isinstance(tokenizer, PreTrainedTokenizerFast)
    assert "Llama" not in type(tokenizer).__name__  # a Llama config must not swap in Llama's tokenizer
    assert tokenizer.eos_token == "<|im_end|>"
    assert tokenizer.pad_token == "<|endoftext|>"
    assert tokenizer.bos_token is None
    assert tokenizer.padding_side == "left"
    assert tokenizer("hello world").input_ids == tokenizer("hello world", add_special_tokens=False).input_ids
    assert 1000 <= len(tokenizer) <= 2000

    assert isinstance(model, LlamaForCausalLM)
    assert model.dtype == torch.float32
    assert model.config.vocab_size == len(tokenizer)
    assert model.generation_config.eos_token_id == tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert model.generation_config.pad_token_id == tokenizer.pad_token_id


@pytest.mark.parametrize("text", [
    "Hello world",
    "  two leading spaces,\ttabs\tand trailing spaces  ",
    "line one\n\nline three\n",
    '{"name": "book_hotel", "arguments": {"hotel_id": "h12", "check_in": "2026-12-04", "nights": 3}}',
    "<tool_call>{\"name\": \"x\"}</tool_call> then <tool_response>\nok\n</tool_response>",
    "Zoë paid 12,50 € — ünïcödé too",
])
def test_text_round_trips_exactly(tokenizer, text):
    assert tokenizer.decode(tokenizer(text, add_special_tokens=False).input_ids) == text


def test_skipping_special_tokens_keeps_tool_markers(tokenizer):
    text = render(tokenizer, CONVERSATION, TOOLS)
    decoded = tokenizer.decode(tokenizer(text, add_special_tokens=False).input_ids, skip_special_tokens=True)
    assert "<tool_call>" in decoded and "</tool_call>" in decoded
    assert "<tool_response>" in decoded and "</tool_response>" in decoded
    assert "<|im_start|>" not in decoded and "<|im_end|>" not in decoded
    # Each marker is one token, so tool-call parsing never sees it split.
    for marker in tiny.TOOL_MARKERS:
        assert len(tokenizer(marker, add_special_tokens=False).input_ids) == 1


def test_template_renders_the_tools_system_block_and_tool_calls(tokenizer):
    text = render(tokenizer, CONVERSATION, TOOLS)
    assert text.startswith("<|im_start|>system\nYou book hotels.\n")
    for tool in TOOLS:
        assert json.dumps(tool) + "\n" in text
    assert '<tool_call>{"name": <name>, "arguments": <args-json>}</tool_call>' in text
    assert text.count("<|im_start|>system") == 1  # the system message is not rendered twice
    assert ('<|im_start|>assistant\n<tool_call>{"name": "search_hotels", "arguments": {"city": "Paris"}}'
            "</tool_call><|im_end|>\n") in text
    assert ('<|im_start|>assistant\nLet me check.<tool_call>{"name": "check_availability", "arguments": '
            '{"hotel_id": "h7", "check_in": "2026-12-04"}}</tool_call><|im_end|>\n') in text
    assert '<|im_start|>tool\n<tool_response>\n{"available": true}\n</tool_response><|im_end|>\n' in text
    assert text.endswith("<|im_start|>user\nBook it, thanks!<|im_end|>\n")


def test_template_without_tools_renders_a_default_system_line_only_when_tools_exist(tokenizer):
    user = [{"role": "user", "content": "Hi"}]
    assert render(tokenizer, user) == "<|im_start|>user\nHi<|im_end|>\n"
    assert render(tokenizer, CONVERSATION[:2]).startswith("<|im_start|>system\nYou book hotels.<|im_end|>\n")
    with_tools = render(tokenizer, user, TOOLS)
    assert with_tools.startswith("<|im_start|>system\nYou are a helpful assistant.")
    assert with_tools.endswith("<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n")


@pytest.mark.parametrize("tools", [None, TOOLS], ids=["no-tools", "tools"])
def test_template_is_append_only(tokenizer, tools):
    full = render(tokenizer, CONVERSATION, tools)
    for k in range(1, len(CONVERSATION)):
        assert full.startswith(render(tokenizer, CONVERSATION[:k], tools)), f"rendering changed at message {k}"


def test_assistant_turn_is_generation_prompt_plus_content_plus_eos(tokenizer):
    history = CONVERSATION[:4]
    prompt = render(tokenizer, history, TOOLS, add_generation_prompt=True)
    assert prompt == render(tokenizer, history, TOOLS) + "<|im_start|>assistant\n"
    answer = {"role": "assistant", "content": "Room h7 costs 120 a night."}
    assert render(tokenizer, history + [answer], TOOLS) == prompt + answer["content"] + "<|im_end|>\n"


def test_sampled_turns_mostly_end_within_48_tokens_and_differ(tokenizer, model):
    prompt = render(tokenizer, [{"role": "user", "content": "Hello, who are you?"}], add_generation_prompt=True)
    inputs = tokenizer([prompt] * 64, return_tensors="pt", add_special_tokens=False)
    torch.manual_seed(0)
    with torch.no_grad():
        out = model.generate(**inputs, do_sample=True, temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=48,
                             output_scores=True, return_dict_in_generate=True)
    completions = out.sequences[:, inputs.input_ids.shape[1]:].tolist()
    ended = sum(tokenizer.eos_token_id in c for c in completions)
    texts = {tokenizer.decode(c, skip_special_tokens=True) for c in completions}
    first_step = torch.softmax(out.scores[0].float(), dim=-1)
    entropy = -(first_step * first_step.clamp_min(1e-12).log()).sum(-1).mean().item()
    assert ended >= 48, f"only {ended}/64 sampled turns ended with <|im_end|>"
    assert len(texts) >= 32, f"only {len(texts)} distinct completions out of 64"
    assert entropy > 1.0  # broad enough for RL to move it


def test_tool_calls_come_mostly_when_tools_are_listed(tokenizer, model):
    # The hotel environment needs calls; a plain chat that drifts into tool JSON teaches RL runs to
    # repeat JSON keys (measured: v2 called tools in 9 of 128 plain turns and 25 of 128 with tools).
    messages = [{"role": "system", "content": "You are a hotel booking assistant. Use the tools to help the guest."},
                {"role": "user", "content": "Find a hotel in Paris for 2026-05-04."}]
    calls = []
    for tools in (None, TOOLS):
        inputs = tokenizer([render(tokenizer, messages, tools, add_generation_prompt=True)] * 128,
                           return_tensors="pt", add_special_tokens=False)
        torch.manual_seed(0)
        with torch.no_grad():
            out = model.generate(**inputs, do_sample=True, temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=48)
        texts = tokenizer.batch_decode(out[:, inputs.input_ids.shape[1]:], skip_special_tokens=True)
        calls.append(sum("<tool_call>" in t for t in texts))
    without_tools, with_tools = calls
    assert with_tools >= 16 and with_tools >= 4 * without_tools, f"tool calls without/with tools: {calls}"


def test_same_seed_builds_identical_weights(model_dir, cached_model_dir):
    # The cached build is an independent build with the default seed 0, like the module's model.
    ours, theirs = load_file(model_dir / "model.safetensors"), load_file(cached_model_dir / "model.safetensors")
    assert ours.keys() == theirs.keys()
    for name in ours:
        assert torch.equal(ours[name], theirs[name]), name


def test_cached_model_is_built_once_and_reused(cache_dir, cached_model_dir, monkeypatch):
    assert cached_model_dir == cache_dir / f"tiny-v{tiny.TINY_VERSION}"
    assert (cached_model_dir / "config.json").is_file()
    mtime = (cached_model_dir / "model.safetensors").stat().st_mtime_ns

    def no_rebuild(*args, **kwargs):
        raise AssertionError("the cached model was rebuilt")

    monkeypatch.setattr(tiny, "_build_into", no_rebuild)
    assert tiny.tiny_model_path(cache_dir=cache_dir) == cached_model_dir
    assert (cached_model_dir / "model.safetensors").stat().st_mtime_ns == mtime
    assert [p.name for p in cache_dir.iterdir()] == [cached_model_dir.name]  # no temp folders left


def test_losing_a_concurrent_build_uses_the_winners_model(tmp_path, model_dir, monkeypatch):
    target = tmp_path / f"tiny-v{tiny.TINY_VERSION}"

    def build_while_another_process_publishes(directory, seed):
        shutil.copytree(model_dir, target)  # the other process finishes first
        shutil.copytree(model_dir, directory, dirs_exist_ok=True)
        (directory / "ours").touch()

    monkeypatch.setattr(tiny, "_build_into", build_while_another_process_publishes)
    assert tiny.tiny_model_path(cache_dir=tmp_path) == target
    assert not (target / "ours").exists()
    assert [p.name for p in tmp_path.iterdir()] == [target.name]


def test_resolve_model_maps_tiny_to_the_cache(cache_dir, cached_model_dir, monkeypatch):
    monkeypatch.setenv("AITRAIN_CACHE_DIR", str(cache_dir))
    resolved = resolve_model(tiny.TINY_MODEL_ID)
    assert resolved == str(cached_model_dir)
    assert os.path.isdir(resolved)
    assert resolve_model("Qwen/Qwen2.5-0.5B-Instruct") == "Qwen/Qwen2.5-0.5B-Instruct"
    assert resolve_model("./checkpoints/step-10") == "./checkpoints/step-10"
