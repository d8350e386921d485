"""Shortcut probes for `aitrain env check`: scripted replies that an honest score must keep low.

GRPO follows whatever raises the score. If a reply that does none of the task (the prompt echoed back,
one word over and over, the answer's format with nothing in it, every tool called blindly) already
scores well, training will find it long before it finds the task. Env check plays each probe on the
same rows as its oracle and empty policies and warns, naming the probe, when the score pays for it.

Generic probes, for any environment (each a text policy `episode -> next message`, like `solve`):
- `echo`: each turn repeats the latest user message (the prompt on the first turn);
- `repeat`: the word "the" written over and over, past the turn's token limit, so the engine cuts it
  there as it cuts a model that never stops (`--rl-max-new-tokens`, `--rl-cut-turn`);
- `format` (an environment with `solve` only): the oracle's next message with its substance taken out.
  Tool calls keep their names and get empty arguments; in text, markup stays (`<tags>`, `\\commands`,
  JSON keys written `"key":`) and every word and number outside it goes. A `solve` that fails on the
  probe's episode (it was written for the oracle's own) gives an empty reply, not an error;
- `tools` (an environment with tools only): turn k calls the k-th tool of the episode once, with
  minimal arguments (each required parameter its type's empty value: "", 0, false, [], {}; an enum
  its first value), then the episode gets empty replies. Calls are written in the form the run's
  `--rl-tool-parser` reads (Hermes `<tool_call>` blocks under `auto`).

Declared probes: an environment's optional `probes()` returns `{name: probe}`, each probe either a text
policy `Callable[[Episode], str]` or a list of replies, one per turn (an empty reply after the last);
a probe named like a generic one replaces it; `oracle`, `empty` and `model` are refused as names (they
are env check's other rows). The probes' rows come last in env check's table, under a line.

The rule (`probe_warnings`): a probe is flagged when its mean score is at least ABOVE_EMPTY over the
empty reply's mean, or (where the oracle played and beats the empty reply) within NEAR_ORACLE of the
oracle's mean while above the empty reply's. Without an empty policy played the baseline is 0. Flags are
warnings (exit 0), as env check's other score warnings are; a probe's episode that fails (the
environment raised on the probe's text, or a declared probe raised) is a broken contract like any
policy's, since a model can write the same text.

During training the probes are asked, not played (`replies_at_turns`): what each would have written at
each model turn of a finished episode, for the shortcut warning to say which one the run's replies resemble
(training/rollout/probe_watch.py, runlog/probe_resemblance.py).

Left out: playing the probes (evaluation/envcheck.py plays them through the same engine as the model),
and probes that need a model (paraphrase, majority answer): an environment declares those itself.
"""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Any, Callable, Mapping

from aitrain_grpo.engine.tool_parsers import read_tool_calls, tool_names_of
from aitrain_grpo.env.base import Episode, has_solve, tools_for_row

Policy = Callable[[Episode], str]

TAKEN = ("oracle", "empty", "model")  # env check's other policies
# A probe earning a quarter of the score's range over an empty reply is paid for something other than the
# task. Graded partial credit that any text earns stays under it: on envs.letters (the share of a's),
# the echoed prompt scores 0.21 from English's own a's, where the declared fill-the-turn shortcut of
# `pay_cut_turns` scores 0.5. All policies play the same rows, so the gap is not a draw of easier tasks.
ABOVE_EMPTY = 0.25
# Within a tenth of the oracle: the script does about as well as the expert, whatever the empty reply does.
NEAR_ORACLE = 0.1
REPEATED_WORD = "the"
REPEAT_AT_LEAST = 4096  # words written by `repeat`: past any turn limit env check plays (its completion budget)

_MARKUP = re.compile(r'<[^<>\n]{1,80}>|\\[A-Za-z]+|"[^"\n]{0,80}"\s*:')
_SUBSTANCE = re.compile(r"[^\W_]+")
_EMPTY_OF_TYPE = {"string": "", "integer": 0, "number": 0, "boolean": False, "array": [], "object": {}}


class ProbeError(ValueError):
    """An environment's `probes()` broke its contract (raised, or returned another shape)."""


def last_user_message(episode: Episode) -> str:
    """The latest user message's text ('' when there is none)."""
    for message in reversed(episode.messages):
        if message.get("role") == "user":
            return str(message.get("content") or "")
    return ""


def repeat_policy(word: str = REPEATED_WORD, times: int = REPEAT_AT_LEAST) -> Policy:
    text = " ".join([word] * times)
    return lambda episode: text


def minimal_arguments(schema: Mapping[str, Any]) -> dict[str, Any]:
    """Each required parameter of a tool schema (chat-template or bare) at its type's empty value."""
    function = schema.get("function", schema)
    parameters = function.get("parameters") or {}
    properties = parameters.get("properties") or {}
    arguments = {}
    for name in parameters.get("required") or []:
        spec = properties.get(name) or {}
        kind = spec.get("type")
        kind = kind[0] if isinstance(kind, list) and kind else kind
        arguments[name] = spec["enum"][0] if spec.get("enum") else _EMPTY_OF_TYPE.get(kind, "")
    return arguments


def write_call(name: str, arguments: dict[str, Any], parser: str) -> str:
    """One tool call written in the form `parser` (config.TOOL_PARSERS) reads; Hermes for `auto`."""
    call = {"name": name, "arguments": arguments}
    if parser == "json":
        return json.dumps(call)
    if parser == "llama3_json":
        return "<|python_tag|>" + json.dumps({"name": name, "parameters": arguments})
    if parser == "mistral":
        return "[TOOL_CALLS] " + json.dumps([call])
    if parser == "pythonic":
        return f"[{name}({', '.join(f'{k}={v!r}' for k, v in arguments.items())})]"
    return f"<tool_call>\n{json.dumps(call)}\n</tool_call>"


def tools_policy(env: Any, parser: str) -> Policy:
    """Turn k calls the episode's k-th tool with minimal arguments; empty replies after the last."""
    def policy(episode: Episode) -> str:
        schemas = episode.log.tools if episode.log.tools is not None else tools_for_row(env, episode.row)
        if episode.turns >= len(schemas):
            return ""
        schema = schemas[episode.turns]
        return write_call(tool_names_of([schema])[0], minimal_arguments(schema), parser)

    return policy


def hollow(text: str, parser: str, tool_names: list[str]) -> str:
    """`text` with its substance taken out: tool calls with empty arguments, else markup without content."""
    calls = read_tool_calls(text, parser, tool_names).calls
    if calls:
        return "\n".join(write_call(call["name"], {}, parser) for call in calls)
    pieces, start = [], 0
    for match in _MARKUP.finditer(text):
        pieces += [_SUBSTANCE.sub("", text[start:match.start()]), match.group(0)]
        start = match.end()
    pieces.append(_SUBSTANCE.sub("", text[start:]))
    return re.sub(r"\s+", " ", "".join(pieces)).strip()


def format_policy(env: Any, parser: str) -> Policy:
    """The oracle's next message, hollowed (see `hollow`); an empty reply where `solve` fails."""
    def policy(episode: Episode) -> str:
        try:
            message = env.solve(episode)
        except Exception:  # solve was written for the oracle's episodes, not the probe's
            return ""
        names = tool_names_of(episode.log.tools if episode.log.tools is not None else tools_for_row(env, episode.row))
        return hollow(message, parser, names) if isinstance(message, str) else ""

    return policy


def replies_policy(replies: list[str]) -> Policy:
    """A list of replies as a policy: reply k on turn k, empty after the last."""
    return lambda episode: replies[episode.turns] if episode.turns < len(replies) else ""


def generic_probes(env: Any, tool_parser: str, rows: list[dict[str, Any]]) -> dict[str, Policy]:
    """The generic probes that apply to `env` (see the module doc), by name."""
    probes: dict[str, Policy] = {"echo": last_user_message, "repeat": repeat_policy()}
    if has_solve(env):
        probes["format"] = format_policy(env, tool_parser)
    if rows and any(tools_for_row(env, row) for row in rows):
        probes["tools"] = tools_policy(env, tool_parser)
    return probes


def declared_probes(env: Any) -> dict[str, Policy]:
    """The environment's own probes (`probes()`), as policies; {} without the method. ProbeError when it
    raises or returns anything but a dict of names to policies or lists of replies."""
    declare = getattr(env, "probes", None)
    if not callable(declare):
        return {}
    owner = type(env).__name__
    try:
        declared = declare()
    except Exception as exc:
        raise ProbeError(f"{owner}.probes raised {type(exc).__name__}: {exc}") from exc
    if not isinstance(declared, Mapping):
        raise ProbeError(f"{owner}.probes returned {type(declared).__name__}; return a dict of names to "
                         f"policies (episode -> str) or lists of replies")
    probes = {}
    for name, probe in declared.items():
        if not isinstance(name, str) or not name or any(c.isspace() for c in name) or name in TAKEN:
            raise ProbeError(f"{owner}.probes named a probe {name!r}; names are non-empty strings without spaces, "
                             f"other than {', '.join(TAKEN)}")
        if isinstance(probe, (list, tuple)) and all(isinstance(r, str) for r in probe):
            probes[name] = replies_policy(list(probe))
        elif callable(probe):
            probes[name] = probe
        else:
            raise ProbeError(f"{owner}.probes gave {name!r} a {type(probe).__name__}; give a policy "
                             f"(episode -> str) or a list of replies, one per turn")
    return probes


def all_probes(env: Any, tool_parser: str, rows: list[dict[str, Any]]) -> dict[str, Policy]:
    """Every probe env check plays on `env`, by name: generic, then declared."""
    return {**generic_probes(env, tool_parser, rows), **declared_probes(env)}


def probe_warnings(probes: list[Any], oracle: Any | None, empty: Any | None) -> list[str]:
    """One warning per probe the score pays for (the rule in the module doc). Each argument is a played
    policy with `name` and `mean` (evaluation/envcheck.PolicyResult)."""
    baseline = empty.mean if empty is not None else 0.0
    what = f"the empty reply's {baseline:.3f}" if empty is not None else "0"
    warnings = []
    for probe in probes:
        gain = round(probe.mean - baseline, 9)  # a mean of 0.35 over 0.1 is 0.25, not 0.2499999
        near = (oracle is not None and oracle.mean > baseline and gain > 0
                and round(oracle.mean - probe.mean, 9) <= NEAR_ORACLE)
        if gain < ABOVE_EMPTY and not near:
            continue
        why = (f"within {NEAR_ORACLE:g} of the oracle's {oracle.mean:.3f}" if near
               else f"{gain:.3f} above {what}")
        warnings.append(
            f"the {probe.name} probe scores {probe.mean:.3f}, {why}: a scripted reply that does not do the task "
            f"is paid for, and GRPO will find it. Read its episodes' transcripts against score_episode and "
            f"pay only for what the task means"
        )
    return warnings


def replies_at_turns(probes: Mapping[str, Policy], episode: Episode, turns: int) -> dict[str, list[str]]:
    """What each probe would have written at each of the episode's first `turns` model turns, asked with the
    episode as it stood before that turn: its messages up to there and `turns` at that turn's index (row,
    log and a shallow copy of its state as they are now: a probe reads them, the episode is over). '' where
    a probe raises or returns no text, which the comparison skips."""
    starts = [i for i, message in enumerate(episode.messages) if message.get("role") == "assistant"][:turns]
    replies: dict[str, list[str]] = {name: [] for name in probes}
    for turn, start in enumerate(starts):
        view = dataclasses.replace(episode, messages=episode.messages[:start], turns=turn, done=False,
                                   state=dict(episode.state), metrics=dict(episode.metrics))
        for name, probe in probes.items():
            try:
                text = probe(view)
            except Exception:  # a probe written for env check's episodes; the run goes on without its reply
                text = ""
            replies[name].append(text if isinstance(text, str) else "")
    return replies
