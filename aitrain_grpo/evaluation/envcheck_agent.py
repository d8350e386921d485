"""`aitrain env check` for agent environments (env/agent.py): what differs from an environment with `step`.

An agent's episode is its own code sending chat-completion requests to the run's endpoint, so what the
model sees is known only once the agent has sent something: the dataset row's `prompt` is a label, the
tools are those each request sends (not `env.tools`), and there is no `step` to time. The check plays
the policies as for any environment (the oracle and the empty policy answer each request as text, the
model through the `RolloutEngine`), then reads the first request of the first episode played: rendered
through the chat template with the tools it sent (the prompt shown, its token count, the append-only
check), and the tools of every episode's requests (the tools listed). The model's requests are counted
as training logs them (`agent/requests`, `agent/history_rewrites`, ...).

Left out: the requests between the first and the last of an episode (transcripts show the last one's
conversation), and the tools of the model's episodes (the text policies' requests show the agent's tools).
"""

from __future__ import annotations

import json
from typing import Any

from aitrain_grpo.engine.chat import ChatRenderer
from aitrain_grpo.env.base import Episode, Message, prompt_messages
from aitrain_grpo.errors import TemplateError

TOOLS_NOTE = ("tools come with each request of an agent environment (the agent sends them), not from env.tools: "
              "those listed are the ones its requests sent")
# The counts training logs as agent/<name>, in the order shown.
COUNTS = ("requests", "history_rewrites", "clipped_requests", "ignored_sampling", "earlier_segment_tokens")


def first_request(episode: Episode) -> list[Message]:
    """The messages before the model's first reply: the first request, as the chat template renders it."""
    messages = episode.messages
    first = next((i for i, m in enumerate(messages) if m.get("role") == "assistant"), len(messages))
    return list(messages[:first])


def describe_requests(report, tokenizer, first_row: dict[str, Any]) -> None:
    """After the policies played: the prompt, tools and template check of the agent's first request, and
    the model's request counts, into `report` (see the module doc)."""
    text_episodes = [ep for p in report.policies if p.name != "model" for ep in p.episodes]
    sent = [ep for ep in text_episodes if "agent_tools" in ep.state]
    tool_sets = {json.dumps(ep.state["agent_tools"], sort_keys=True, default=str): ep.state["agent_tools"] for ep in sent}
    report.tools = list({json.dumps(t, sort_keys=True, default=str): t for ts in tool_sets.values() for t in ts}.values())
    if not report.tools:
        report.notes.append(f"{TOOLS_NOTE.split(':')[0]}: the requests seen sent none")
    else:
        report.notes.append(TOOLS_NOTE + (f" ({len(tool_sets)} different sets)" if len(tool_sets) > 1 else ""))
    if not sent:  # no text policy played, or the agent sent nothing: the row's own prompt stands in
        report.prompt_source = "row 0's prompt (no request of the agent was seen; the agent decides what it sends)"
        episode, tools = Episode(row=first_row, messages=prompt_messages(first_row["prompt"])), []
    else:
        report.prompt_source = "the agent's first request (chat template applied, with its tools)"
        episode, tools = sent[0], sent[0].state["agent_tools"]
    try:
        renderer = ChatRenderer(tokenizer, tools=tools)
        request = first_request(episode)
        report.sample_prompt = renderer.render(request, add_generation_prompt=True)
        report.sample_tokens = len(renderer.encode(report.sample_prompt))
        lengths = [len(ChatRenderer(tokenizer, tools=ep.state["agent_tools"]).prompt_ids(first_request(ep)))
                   for ep in sent] or [report.sample_tokens]
        report.longest_tokens, report.rows_measured = max(lengths), len(lengths)
        report.longest_row = lengths.index(report.longest_tokens)
        rewrite = renderer.check_append_only(request)
        report.notes += [renderer.tools_route] if renderer.tools_route else []
    except TemplateError as exc:
        report.problems.append(f"the model's chat template cannot be used: {exc}")
        return
    if rewrite:
        report.warnings.append(f"{rewrite}. Each request extends the episode's tokens by the template's suffix, which "
                               f"cannot hold exactly with this template; use a model whose template only appends turns")
    model = next((p for p in report.policies if p.name == "model"), None)
    if model is not None and model.agent_counts:
        counts = model.agent_counts
        shown = ", ".join(f"{counts.get(k, 0)} {k.replace('_', ' ')}" for k in COUNTS)
        report.notes.append(f"the model's episodes: {shown} (training logs them as agent/<name>)")
        if counts.get("history_rewrites"):
            report.notes.append(f"{counts['history_rewrites']} requests did not extend their episode's last one "
                                f"(the agent rewrote its history): each starts a new training sequence of its episode, "
                                f"with the episode's score ({counts.get('earlier_segment_tokens', 0)} model tokens in sequences "
                                f"before an episode's last)")


__all__ = ["describe_requests", "first_request"]
