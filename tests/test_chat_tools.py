"""Tools on any chat template: the model sees its tools whether or not its template renders them, and
the token rules (append-only, exact suffixes) still hold when the renderer rewrites the messages.

The tiny model's template renders tools itself; SmolLM2's drops them (they go into the system
message); two hand-written templates also refuse the tool role (results become user messages in
<tool_response>) and the system role (the tools go into the first user message)."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoTokenizer

from aitrain_grpo import ToolEnvironment, tool
from aitrain_grpo.engine.backends.hf import HFBackend
from aitrain_grpo.engine.chat import ChatRenderer
from aitrain_grpo.engine.rollout import RolloutEngine
from aitrain_grpo.engine.settings import EpisodeSettings
from helpers import run_cli
from envs.hotel import HotelEnv

HOTEL = ["--rl-env-module", "envs.hotel", "--rl-env-class", "HotelEnv"]
TOOL_NAMES = ("search_hotels", "check_availability", "book_hotel")

# Neither template knows tools or the tool role; the second has no system role either.
_TURNS = "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' -}}{%- endfor -%}" \
         "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
NO_TOOL_ROLE = ("{%- for message in messages -%}{%- if message.role == 'tool' -%}"
                "{{ raise_exception('no tool role') }}{%- endif -%}" + _TURNS)
NO_SYSTEM_NO_TOOL_ROLE = ("{%- for message in messages -%}{%- if message.role not in ['user', 'assistant'] -%}"
                          "{{ raise_exception('user and assistant only') }}{%- endif -%}" + _TURNS)


class LookupEnv(ToolEnvironment):
    """Answers the first turn with two tool results, the second with a user message."""

    max_turns = 3

    def build_dataset(self, tokenizer):
        return [{"prompt": [{"role": "user", "content": "Find the answer."}]}]

    @tool
    def lookup(self, q: str) -> str:
        """Look something up.

        Args:
            q: The query.
        """
        return q

    async def step(self, episode, completion):
        if episode.turns == 1:
            return [{"role": "tool", "name": "lookup", "content": '{"result": "forty-two"}'},
                    {"role": "tool", "name": "lookup", "content": '{"result": "seven"}'}]
        return "Thanks, and now?"

    def score_episode(self, episode):
        return 0.0


def test_tiny_template_renders_the_tools_itself(tiny_model_dir):
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    renderer = ChatRenderer(tokenizer, tools=HotelEnv().tools)
    assert renderer.tools_route == "tools reach the model through its chat template"
    prompt = renderer.render(HotelEnv().build_dataset(tokenizer)[0]["prompt"], add_generation_prompt=True)
    assert all(name in prompt for name in TOOL_NAMES)
    assert "<tools>" not in prompt  # the template's own wording, not the description added for others


def test_smollm2_template_drops_tools_so_they_go_into_the_system_message(smollm2_model_dir):
    tokenizer = AutoTokenizer.from_pretrained(smollm2_model_dir)
    env = HotelEnv()
    prompt_messages = env.build_dataset(tokenizer)[0]["prompt"]
    # What the template alone makes of the tools: nothing.
    assert "search_hotels" not in tokenizer.apply_chat_template(prompt_messages, tools=env.tools, tokenize=False)
    renderer = ChatRenderer(tokenizer, tools=env.tools)
    assert "ignores tools" in renderer.tools_route and "system message" in renderer.tools_route
    prompt = renderer.render(prompt_messages, add_generation_prompt=True)
    system = prompt.split("<|im_end|>")[0]
    assert system.startswith("<|im_start|>system\n") and "<tools>" in system and "<tool_call>" in system
    schemas = system.split("<tools>\n")[1].split("\n</tools>")[0].splitlines()
    assert [json.loads(line)["function"]["name"] for line in schemas] == list(TOOL_NAMES)
    assert renderer.check_append_only(prompt_messages) is None


@pytest.mark.parametrize("template, where", [(NO_TOOL_ROLE, "system"), (NO_SYSTEM_NO_TOOL_ROLE, "user")])
def test_episode_tokens_match_the_rewritten_conversation(tiny_model_and_tokenizer, template, where):
    model, base_tokenizer = tiny_model_and_tokenizer
    tokenizer = AutoTokenizer.from_pretrained(base_tokenizer.name_or_path)
    tokenizer.chat_template = template
    env = LookupEnv()
    engine = RolloutEngine(env, tokenizer, HFBackend.for_model(model, tokenizer),
                           EpisodeSettings(max_new_tokens=24, max_completion_length=512))
    renderer = engine.renderer
    assert "user messages in <tool_response>" in renderer.tools_route
    torch.manual_seed(0)
    with engine:
        batch = engine.run(env.build_dataset(None) * 8)
    played = [(ep, tr) for ep, tr in zip(batch.episodes, batch.traces) if ep.turns >= 2]
    assert played, "expected episodes that reach the tool results"
    for episode, trace in played:
        assert [m["role"] for m in episode.messages[2:4]] == ["tool", "tool"]  # the environment's own view
        decoded = tokenizer.decode(trace.prompt_ids + trace.completion_ids, skip_special_tokens=False)
        decoded += renderer.closing_text(trace.completion_ids[-1] == tokenizer.eos_token_id)
        assert decoded == renderer.render(episode.messages, add_generation_prompt=False)
        first = decoded.split("<|im_end|>")[0]
        assert first.startswith(f"<|im_start|>{where}\n") and '"name": "lookup"' in first
        # Both results of the one reply reach the model in a single user message.
        assert ('<|im_start|>user\n<tool_response>\n{"result": "forty-two"}\n</tool_response>\n'
                '<tool_response>\n{"result": "seven"}\n</tool_response><|im_end|>') in decoded
    assert renderer.check_append_only(env.build_dataset(None)[0]["prompt"]) is None


def test_env_check_shows_the_tools_in_smollm2_prompt(smollm2_model_dir):
    result = run_cli("env", "check", "--model", "smollm2", *HOTEL, "--policies", "oracle", "--episodes", "2")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    # The rendered prompt (cut at 1500 characters for display) holds the schemas in the system message.
    shown = result.stdout.split("row 0 as the model sees it")[1].split("tools (3;")[0]
    assert "<|im_start|>system" in shown and "<tools>" in shown
    assert '{"type": "function", "function": {"name": "search_hotels"' in shown
    assert "note: the chat template ignores tools: they are described in the system message" in result.stdout
