"""The library behind `aitrain env check`: try an environment out before spending GPU hours on it.

`check_environment` builds the dataset and records what the model will see (rows, columns, a prompt
rendered through the model's chat template with its token count, the longest prompt, the tool schemas),
then plays episodes under these policies, each as one `EpisodeSettings` says (engine/settings.py: the
command's flags, with a completion budget of its own), and compares their scores:
- `oracle`: the environment's optional `solve(episode) -> str` (an expert's next message); it should
  score 1.0, or the scoring (or `solve`) is wrong;
- `empty`: every model turn is an empty message; it should score (near) 0;
- `probes`: shortcut probes (evaluation/probes.py: the prompt echoed, one word to the turn limit, the
  oracle's format hollowed, every tool called, the environment's own `probes()`), each a row of its own
  played by the token-level engine (`play_scripted`) so the turn limit cuts them as it cuts the model;
  a probe scoring well is a warning naming it;
- `model`: the model itself, sampled through the same `RolloutEngine` as training.

Broken contracts (an exception or a timeout in `reset`/`step`/`score_episode`/`solve`, a score
outside [0, 1], a dataset without prompts) are the report's problems (the command exits 1). Things that
make training pointless or inexact are warnings: scores that never vary, an oracle below 1.0, an empty
reply or a probe that scores well, a chat template that rewrites earlier turns, a ToolEnvironment without
tools. `env_check` loads the environment and the model as the command names them and checks.

An agent environment (env/agent.py) is checked the same way, its requests answered by each policy through
the run's endpoint; what differs (the prompt and tools come from its requests) is in envcheck_agent.py.

Left out: the command's options and printing the report (commands/envcheck.py), training, and judging
whether the tasks are hard enough (that is what `aitrain eval` and the first training steps show).
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field
from typing import Any

from aitrain_grpo.config import DEFAULT_TOOL_PARSER
from aitrain_grpo.engine.chat import ChatRenderer, template_kwargs_note
from aitrain_grpo.engine.backends.scripted import ScriptedBackend
from aitrain_grpo.engine.context import cuts_history, resolve_strategies
from aitrain_grpo.engine.rollout import RolloutEngine
from aitrain_grpo.engine.runner import EpisodeRunner, oracle_policy, play_text
from aitrain_grpo.engine.settings import EpisodeSettings
from aitrain_grpo.engine.stats import EpisodeStats, episode_scores, episode_stats
from aitrain_grpo.env.agent import is_agent_environment
from aitrain_grpo.env.base import Environment, Episode, has_solve, needs_policy, prompt_messages, tools_for_row
from aitrain_grpo.env.dataset import build_rows
from aitrain_grpo.env.loading import describe_interface, load_environment
from aitrain_grpo.env.tools import ToolEnvironment
from aitrain_grpo.evaluation.episode_warnings import episode_warnings
from aitrain_grpo.errors import EnvLoadError, TemplateError
from aitrain_grpo.evaluation import envcheck_agent
from aitrain_grpo.evaluation.probes import ProbeError, all_probes, probe_warnings
from aitrain_grpo.models.loading import load_for_generation, load_tokenizer, resolve_source

POLICIES = ("oracle", "empty", "probes", "model")
PROMPTS_MEASURED = 2000  # rows rendered to find the longest prompt
# The check has no completion-budget flag: room enough that turns and the turn cap, not the budget, end
# the model's episodes (a training run's budget is a run's choice, not the environment's contract).
COMPLETION_BUDGET = 4096


@dataclass
class PolicyResult:
    """The episodes one policy played and how long the environment took to answer each turn."""

    name: str
    episodes: list[Episode]
    step_seconds: list[float]
    wall_seconds: float
    generate_seconds_per_turn: float | None = None
    agent_counts: dict[str, int] = field(default_factory=dict)  # an agent environment's requests (model only)
    probe: bool = False  # a shortcut probe (evaluation/probes.py), not one of oracle, empty and model

    @property
    def scores(self) -> list[float]:
        return episode_scores(self.episodes)

    @property
    def stats(self) -> EpisodeStats:
        return episode_stats(self.episodes)

    @property
    def mean(self) -> float:
        return self.stats.score_mean

    @property
    def errors(self) -> list[str]:
        return [ep.error for ep in self.episodes if ep.error]


@dataclass
class EnvCheckReport:
    env_name: str
    interface: str = ""  # which environment interface the class was recognised by
    tool_parser: str = DEFAULT_TOOL_PARSER  # how the episodes' tool calls were read (--rl-tool-parser)
    rows: int = 0
    columns: list[str] = field(default_factory=list)
    sample_prompt: str = ""
    sample_tokens: int = 0
    longest_tokens: int = 0
    longest_row: int = 0
    rows_measured: int = 0
    prompt_source: str = ""  # what the sample prompt is, when not row 0's prompt (an agent's first request)
    scorer: str = "score_episode"  # what scores an episode, for the oracle's warning
    tools: list[dict[str, Any]] = field(default_factory=list)
    policies: list[PolicyResult] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)   # a broken contract: exit 1
    warnings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def pick_rows(rows: list[dict[str, Any]], count: int, seed: int) -> list[dict[str, Any]]:
    """`count` rows: a seeded sample without repeats when there are enough, else every row in turn."""
    if len(rows) >= count:
        picked = sorted(random.Random(seed).sample(range(len(rows)), count))
    else:
        picked = [i % len(rows) for i in range(count)]
    return [dict(rows[i]) for i in picked]


def play_text_policy(env: Environment, name: str, rows: list[dict[str, Any]], policy, settings: EpisodeSettings,
                     *, policy_name: str = "policy") -> PolicyResult:
    """`rows` played by a text `policy` (no model): only the settings' turn cap, timeout and tool parser apply."""
    started = time.perf_counter()
    with EpisodeRunner(env, max_turns=settings.max_turns, timeout=settings.env_timeout, policy_name=policy_name,
                       tool_parser=settings.tool_parser) as runner:
        episodes = play_text(runner, rows, policy)
    return PolicyResult(name, episodes, runner.step_seconds, time.perf_counter() - started)


def play_scripted(env: Environment, name: str, rows: list[dict[str, Any]], policy, tokenizer,
                  settings: EpisodeSettings, *, probe: bool = True, policy_name: str | None = None) -> PolicyResult:
    """`rows` played by the text `policy` (a probe `name`, or with `probe` False the oracle or empty policy)
    through the token-level engine (engine/backends/scripted.py), so the settings' budgets apply as they do
    to the model: a turn past --rl-max-new-tokens is cut there, and --rl-cut-turn, the context strategy and
    the token budgets follow. A policy that raises fails its episode (scored 0, named `policy_name`). An
    agent environment, or a tokenizer without EOS to end a turn with, plays at text level instead
    (`play_text_policy`, as sft does)."""
    policy_name = policy_name or f"the {name} probe"
    if is_agent_environment(env) or tokenizer.eos_token_id is None:
        result = play_text_policy(env, name, rows, policy, settings, policy_name=policy_name)
        result.probe = probe
        return result
    backend = ScriptedBackend(policy, tokenizer)
    started = time.perf_counter()
    with RolloutEngine(env, tokenizer, backend, settings) as engine:
        episodes = engine.run(rows).episodes
    for order, why in backend.errors.items():
        episodes[order].error, episodes[order].score = f"{policy_name}: {why}", 0.0
    return PolicyResult(name, episodes, engine.runner.step_seconds, time.perf_counter() - started, probe=probe)


def play_reference_policy(env: Environment, name: str, rows: list[dict[str, Any]], policy, tokenizer,
                          settings: EpisodeSettings, *, policy_name: str = "policy") -> PolicyResult:
    """The oracle or the empty policy: at text level, unless the engine may cut or rewrite the episode
    (engine/context.py `cuts_history`: a context strategy, a window, a token budget), where it plays as
    training plays it, through the token-level engine, so a budget that cuts the oracle shows here."""
    if cuts_history(env, settings):
        return play_scripted(env, name, rows, policy, tokenizer, settings, probe=False, policy_name=policy_name)
    return play_text_policy(env, name, rows, policy, settings, policy_name=policy_name)


def play_model(env: Environment, rows, model, tokenizer, settings: EpisodeSettings) -> PolicyResult:
    # Imported here: the hf backend pulls in torch (seconds), and `env check`'s option errors come first.
    from aitrain_grpo.engine.backends.hf import HFBackend

    engine = RolloutEngine(env, tokenizer, HFBackend.for_model(model, tokenizer), settings)
    started = time.perf_counter()
    with engine:
        batch = engine.run(rows)
    per_turn = batch.generate_seconds / batch.generate_calls if batch.generate_calls else None
    return PolicyResult("model", batch.episodes, engine.runner.step_seconds, time.perf_counter() - started, per_turn,
                        batch.agent_counts)


def sequence_notes(result: PolicyResult) -> list[str]:
    """Where the context strategy (engine/context.py) cut the policy's episodes into sequences, and the
    results it cut short; nothing when it did neither."""
    cut = [(i, ep) for i, ep in enumerate(result.episodes) if ep.log.rewrite_turns]
    notes = [f"{len(cut)} of {len(result.episodes)} {result.name} episodes were cut into sequences by the context "
             f"strategy: " + "; ".join(f"episode {i} after turn(s) {', '.join(map(str, ep.log.rewrite_turns))} "
                                       f"({ep.log.tokens_saved} tokens left out)" for i, ep in cut[:3])] if cut else []
    results = sum(ep.log.tool_results_cut for ep in result.episodes)
    return notes + ([f"{results} tool results were cut to --rl-max-tool-result-tokens"] if results else [])


def read_rows(env: Environment, tokenizer, report: EnvCheckReport) -> list[dict[str, Any]] | None:
    """The dataset's rows, their count and columns into `report`; None when building it failed."""
    try:
        rows = build_rows(env, tokenizer)  # as training stores them (env/arrow_rows.py)
    except EnvLoadError as exc:
        report.problems.append(str(exc))
        return None
    report.rows = len(rows)
    report.columns = list(dict.fromkeys(k for row in rows[:100] for k in row))
    return rows


def inspect_dataset(env: Environment, tokenizer, report: EnvCheckReport,
                    template_kwargs: Any = None) -> list[dict[str, Any]] | None:
    """Rows, columns, prompt token counts and tools into `report`; the rows, or None on a problem.
    `template_kwargs`: the chat template's variables the run renders with (`--chat-template-kwargs`)."""
    rows = read_rows(env, tokenizer, report)
    if rows is None:
        return None
    try:
        report.tools = list(env.tools)
    except Exception as exc:
        report.problems.append(f"{report.env_name}.tools raised {type(exc).__name__}: {exc}")
        return None
    if isinstance(env, ToolEnvironment) and not report.tools and not env.mcp_servers:
        methods = [n for n, v in vars(type(env)).items() if callable(v) and not n.startswith("_")
                   and not hasattr(ToolEnvironment, n)]
        report.warnings.append(f"{report.env_name} is a ToolEnvironment with no tools: the model is offered none; "
                               f"mark each tool method with @tool" + (f" (e.g. {methods[0]})" if methods else ""))
    try:
        renderer = ChatRenderer(tokenizer, tools=tools_for_row(env, rows[0]),  # a mixture's first row's own
                                template_kwargs=template_kwargs)
        report.sample_prompt = renderer.render(prompt_messages(rows[0]["prompt"]), add_generation_prompt=True)
        report.sample_tokens = len(renderer.encode(report.sample_prompt))
        report.rows_measured = min(len(rows), PROMPTS_MEASURED)
        lengths = [len(renderer.prompt_ids(prompt_messages(r["prompt"]))) for r in rows[:report.rows_measured]]
        report.longest_tokens = max(lengths)
        report.longest_row = lengths.index(report.longest_tokens)
        rewrite = renderer.check_append_only(prompt_messages(rows[0]["prompt"]))
        report.notes += [renderer.tools_route] if renderer.tools_route else []
        unread = template_kwargs_note(tokenizer, template_kwargs)
        report.notes += [unread.removeprefix("note: ")] if unread else []
    except TemplateError as exc:
        report.problems.append(f"the model's chat template cannot be used: {exc}")
        return None
    if rewrite:
        report.warnings.append(
            f"{rewrite}. The token-in/token-out rules cannot hold exactly with this template: episode tokens "
            f"will differ from the rendered conversation; use a model whose template only appends turns"
        )
    return rows


def judge(report: EnvCheckReport) -> None:
    """Turn the played episodes into problems and warnings."""
    by_name = {p.name: p for p in report.policies}
    failing: dict[str, list[PolicyResult]] = {}  # one problem per distinct first error, naming every policy it hit
    for result in report.policies:
        if result.errors:
            failing.setdefault(_without_policy_name(result.errors[0]), []).append(result)
    for error, results in failing.items():
        under = [f"{len(r.errors)} of {len(r.episodes)}{' episodes' if not i else ''} under the {r.name} "
                 f"{'probe' if r.probe else 'policy'}" for i, r in enumerate(results)]
        report.problems.append(f"{', '.join(under[:-1]) + ' and ' if len(under) > 1 else ''}{under[-1]} failed; "
                               f"the first: {results[0].errors[0]}")
    if report.problems:  # scores of failed episodes say nothing about the scoring
        return
    # Probes are meant to score low: equal scores among them say nothing about the learning signal.
    compared = [p for p in report.policies if not p.probe]
    all_scores = [s for p in compared for s in p.scores]
    if len(compared) > 1 and len(all_scores) > 1 and len(set(all_scores)) == 1:  # one policy: nothing to compare
        report.warnings.append(
            f"every episode scored {all_scores[0]:g} under every policy: there is no learning signal. GRPO learns "
            f"from score differences within a group; make score_episode depend on what the model does, with "
            f"partial credit"
        )
    elif "model" in by_name and len(set(by_name["model"].scores)) == 1 and len(by_name["model"].scores) > 1:
        report.warnings.append(
            f"all {len(by_name['model'].scores)} model episodes scored {by_name['model'].scores[0]:g}: groups of "
            f"equal scores teach nothing. Give partial credit for progress, use easier tasks, or start from a "
            f"stronger model"
        )
    oracle = by_name.get("oracle")
    if oracle is not None:
        below = [(i, s) for i, s in enumerate(oracle.scores) if s < 1.0]
        if below:
            truncated = sum(1 for ep in oracle.episodes if ep.truncated)
            cap = f"; {truncated} hit the turn cap (max_turns)" if truncated else ""
            report.warnings.append(
                f"the oracle (solve) scored below 1.0 in {len(below)} of {len(oracle.scores)} episodes (mean "
                f"{oracle.mean:.3f}, e.g. {below[0][1]:g}){cap}: either solve or {report.scorer} is wrong"
            )
    empty = by_name.get("empty")
    if empty is not None and empty.mean >= 0.5:
        report.warnings.append(
            f"an empty reply scores {empty.mean:.3f} on average: the score rewards doing nothing, so the "
            f"model may learn to say nothing"
        )
    report.warnings += probe_warnings([p for p in report.policies if p.probe], oracle, empty)
    report.warnings += episode_warnings(ep for p in report.policies for ep in p.episodes)


def _without_policy_name(error: str) -> str:
    """An episode's error without the policy named at its start (`solve: ...`, `the echo probe: ...`), so the
    same fault of the environment under several policies is one problem."""
    head, sep, rest = error.partition(": ")
    return rest if sep and (head in ("solve", "policy") or head.endswith(" probe")) else error


def check_environment(
    env: Environment,
    tokenizer,
    *,
    model=None,
    episodes: int = 16,
    policies: tuple[str, ...] = POLICIES,
    seed: int = 0,
    settings: EpisodeSettings = EpisodeSettings(max_completion_length=COMPLETION_BUDGET),
) -> EnvCheckReport:
    """Everything `aitrain env check` reports. `model` is needed for the `model` policy only; every
    policy plays by `settings` (the oracle and empty policies only by its turn cap, timeout and tool
    parser, unless the engine may cut or rewrite an episode: then by all of it; the model and the probes
    by all of it)."""
    agent = is_agent_environment(env)
    report = EnvCheckReport(env_name=type(env).__name__, tool_parser=settings.tool_parser,
                            interface=describe_interface(env))
    if agent:
        report.scorer = f"the score {report.env_name}.rollout returns"
    # An agent's prompt and tools come from its requests: envcheck_agent reads them after playing.
    rows = read_rows(env, tokenizer, report) if agent else inspect_dataset(env, tokenizer, report, settings.template_kwargs)
    if rows is None:
        return report
    rows = pick_rows(rows, episodes, seed)
    for name in policies:
        if name == "oracle":
            if not has_solve(env):
                why = getattr(env, "no_oracle", None)  # an adapter's reason (no stored answers) beats "add one"
                report.notes.append(f"no oracle to check with: {why}" if why else f"{report.env_name} has no "
                                    f"solve(episode) -> str, so no oracle was played; add one to check that a "
                                    f"perfect episode scores 1.0")
                continue
            result = play_reference_policy(env, "oracle", rows, oracle_policy(env), tokenizer, settings,
                                           policy_name="solve")
        elif name == "empty":
            result = play_reference_policy(env, "empty", rows, lambda episode: "", tokenizer, settings)
        elif name == "probes":
            try:
                probes = all_probes(env, settings.tool_parser, rows)
            except ProbeError as exc:
                report.problems.append(str(exc))
                continue
            report.policies += [play_scripted(env, probe, rows, policy, tokenizer, settings)
                                for probe, policy in probes.items()]
            continue
        else:
            result = play_model(env, rows, model, tokenizer, settings)
            report.notes += sequence_notes(result)
        report.policies.append(result)
    if agent:
        envcheck_agent.describe_requests(report, tokenizer, rows[0])
    judge(report)
    return report


def env_check(*, module: str, class_name: str, env_config: str | None, model_name: str,
              policies: tuple[str, ...], **options: Any) -> EnvCheckReport:
    """Load the environment and the model (`model_name`) and check them (`check_environment`'s `options`).
    Loading mistakes raise EnvLoadError (exit 2); a broken contract is in the report's problems."""
    env = load_environment(module, class_name, env_config)
    resolve_strategies(env, getattr(options.get("settings"), "context", None))  # refused before a model loads
    source = resolve_source(model_name)
    settings = options.get("settings")
    if settings is not None and not is_agent_environment(env):  # what `aitrain grpo` refuses, before a model loads
        from aitrain_grpo.training.preflight.run_checks import check_prompts_fit, model_config_of

        try:
            check_prompts_fit(env, load_tokenizer(source), model_config_of(source.weights),
                              reply_tokens=settings.max_new_tokens, window=settings.context_window, model_name=model_name,
                              template_kwargs=dict(settings.template_kwargs or {}))
        except EnvLoadError:
            pass  # rows that do not build are the report's problem (a broken contract, exit 1), read below
    model = None
    # A score_episode that takes the policy model (needs_policy: AITraining's interface) scores every
    # policy's episodes with the --model model (loaded even when only text policies play).
    if "model" in policies or needs_policy(env):
        model, tokenizer = load_for_generation(source)
        if needs_policy(env):
            env.use_policy(model, tokenizer)
    else:
        tokenizer = load_tokenizer(source)
    report = check_environment(env, tokenizer, model=model, policies=policies, **options)
    if needs_policy(env):
        report.notes.append(f"score_episode was given {model_name} as its model under every policy")
    return report
