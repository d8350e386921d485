"""`aitrain env check`: the command's options checked, the check run (evaluation/envcheck.py), the report
printed with rich: the dataset, the prompt as the model sees it, the tools and how the model called them,
then a table of the policies' scores (a row per shortcut probe), the notes and the warnings.

Left out: everything the check does (evaluation/envcheck.py, and evaluation/envcheck_agent.py for agent
environments); the exit status is the CLI's (commands/cli.py: 1 when the report has problems).
"""

from __future__ import annotations

import json
from typing import Any

from rich.markup import escape
from rich.table import Table

from aitrain_grpo.commands.options import check_positive
from aitrain_grpo.config import CONTEXT_OPTIONS, check_options
from aitrain_grpo.engine.settings import EpisodeSettings
from aitrain_grpo.engine.tool_parsers import read_tool_calls, tool_names_of
from aitrain_grpo.errors import ConfigError
from aitrain_grpo.evaluation.envcheck import COMPLETION_BUDGET, POLICIES, EnvCheckReport, env_check
from aitrain_grpo.option_rules import check_seed

# The episode flags of `aitrain env check` (RunConfig's names), handed to `run_env_check` as `options`.
CHECK_FLAGS = ("rl_max_new_tokens", "rl_max_turns", "rl_temperature", "rl_env_timeout", "rl_tool_parser",
               "chat_template_kwargs", *CONTEXT_OPTIONS)

# ------------------------------------------------------------------------------------------- display


def _tool_line(schema: dict[str, Any]) -> tuple[str, str]:
    function = schema.get("function", schema)
    params = function.get("parameters", {}) or {}
    required = set(params.get("required", []))
    names = [p if p in required else f"{p}?" for p in (params.get("properties") or {})]
    return f"{function.get('name', '?')}({', '.join(names)})", str(function.get("description", "")).split("\n")[0]


def tool_call_line(report: EnvCheckReport) -> str:
    """Which parser read the tool calls, and a call the model wrote (or that it wrote none)."""
    line = f"tool calls read with --rl-tool-parser {report.tool_parser}"
    model = next((p for p in report.policies if p.name == "model"), None)
    if model is None:
        return line
    for episode in model.episodes:
        for message, form in zip((m for m in episode.messages if m["role"] == "assistant"), episode.tool_call_forms):
            if form:
                first = read_tool_calls(str(message.get("content") or ""), report.tool_parser,
                                        tool_names_of(report.tools)).calls
                if first:
                    shown = json.dumps(first[0]["arguments"], ensure_ascii=False)[:120]
                    return f"{line}; the model wrote e.g. {first[0]['name']}({shown}) in the {form} form"
    return f"{line}; the model wrote no tool call in {len(model.episodes)} episodes"


def show_report(report: EnvCheckReport, console, *, module: str, model_name: str, prompt_chars: int = 1500) -> None:
    """Print the report with rich: dataset, prompt, tools, then a table of the policies."""
    console.print(f"[bold]{escape(report.env_name)}[/bold] from {escape(module)}, model {escape(model_name)}")
    console.print(f"interface: {report.interface}", markup=False, highlight=False)
    if not report.rows:
        return
    info = Table.grid(padding=(0, 2))
    info.add_row("rows", str(report.rows))
    info.add_row("columns", ", ".join(report.columns))
    longest = f"{report.longest_tokens} (row {report.longest_row}"
    longest += f" of the first {report.rows_measured})" if report.rows_measured < report.rows else ")"
    sample = "row 0"
    if report.prompt_source:  # an agent's requests: measured over the episodes played
        sample, longest = "the first request", f"{report.longest_tokens} (of {report.rows_measured} first requests)"
    info.add_row("prompt tokens", f"{report.sample_tokens} in {sample}; longest {longest}")
    console.print(info)
    shown = report.sample_prompt
    if len(shown) > prompt_chars:
        shown = shown[:prompt_chars] + f"\n... ({len(report.sample_prompt) - prompt_chars} more characters)"
    title = report.prompt_source or "row 0 as the model sees it (chat template applied)"
    console.rule(title, align="left", style="dim")
    console.print(shown, markup=False, highlight=False)
    console.rule(style="dim")
    if report.tools:
        console.print(f"tools ({len(report.tools)}; ? marks an optional argument)", markup=False)
        for schema in report.tools:
            call, description = _tool_line(schema)
            console.print(f"  [bold]{escape(call)}[/bold]  {escape(description)}")
        console.print(tool_call_line(report), markup=False, highlight=False)
    if report.policies:
        table = Table(title=f"episodes ({len(report.policies[0].episodes)} per policy)", title_justify="left")
        table.add_column("policy", justify="left", overflow="fold")  # a probe's name stays whole when narrow
        table_rows: list = []
        for column in ("mean", "min", "max", "turns", "errors", "cut", "step ms", "time s"):
            table.add_column(column, justify="right")
        # Probes last, under a line: they are meant to score low, the others are the environment's range.
        for p in sorted(report.policies, key=lambda p: p.probe):
            if p.probe and not any(q.probe for q in table_rows):
                table.add_section()
            table_rows.append(p)
            latency = "-"
            if p.step_seconds:
                latency = f"{1000 * sum(p.step_seconds) / len(p.step_seconds):.1f}/{1000 * max(p.step_seconds):.1f}"
            table.add_row(p.name, f"{p.mean:.3f}", f"{min(p.scores):.3f}", f"{max(p.scores):.3f}", f"{p.stats.turns_mean:.2f}",
                          str(p.stats.errors), str(p.stats.truncated), latency, f"{p.wall_seconds:.1f}")
        console.print(table)
        console.print("mean/min/max: episode scores; cut: truncated by a budget; step ms: environment reply time, mean/max"
                      + ("; under the line: shortcut probes, scripted replies that should score low" if table_rows[-1].probe
                         else ""), style="dim", markup=False)
        model = next((p for p in report.policies if p.generate_seconds_per_turn is not None), None)
        if model is not None:
            console.print(f"the model took {model.generate_seconds_per_turn:.2f} s per batched generate call", markup=False)
    for note in report.notes:
        console.print(f"note: {note}", markup=False)
    for warning in report.warnings:
        console.print(f"[yellow]warning:[/yellow] {escape(warning)}")


def run_env_check(
    *,
    module: str,
    class_name: str,
    env_config: str | None,
    model_name: str,
    episodes: int,
    policies: str,
    seed: int,
    options: dict[str, Any],
    console,
) -> EnvCheckReport:
    """What the CLI command does: validate the options, check (`env_check`: load and play), print. `options`
    holds the episode flags (`CHECK_FLAGS`, RunConfig's names). Option and loading mistakes raise
    ConfigError/EnvLoadError (exit 2); a broken contract is in the report's problems."""
    chosen = tuple(dict.fromkeys(p.strip() for p in policies.split(",") if p.strip()))  # each once, in order
    unknown = [p for p in chosen if p not in POLICIES]
    if unknown or not chosen:
        raise ConfigError(f"--policies takes a comma-separated list of {', '.join(POLICIES)}; got {policies!r}")
    check_positive(episodes=episodes)
    check_seed(seed)
    check_options(options)
    # No flags for these: the model samples untruncated, with room for long episodes (COMPLETION_BUDGET).
    settings = EpisodeSettings.from_options({**options, "rl_top_k": 0, "rl_top_p": 1.0,
                                             "rl_max_completion_length": COMPLETION_BUDGET})
    report = env_check(module=module, class_name=class_name, env_config=env_config, model_name=model_name,
                       policies=chosen, episodes=episodes, seed=seed, settings=settings)
    show_report(report, console, module=module, model_name=model_name)
    return report
