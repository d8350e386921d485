"""The library behind `aitrain sft`: play an environment's oracle, keep its good episodes, fine-tune on them.

Many agent tasks give RL no signal from a cold model: every episode scores 0 (`env check` warns about
it), and GRPO learns only from score differences. An environment with `solve(episode) -> str` can teach
the format first. `warm_start` plays the oracle on the first `episodes` rows of the dataset through the
same `EpisodeRunner` as `env check` (engine/runner.py; where a context strategy rewrites the history,
through the token-level engine instead, `play_sequences`, so each demonstration is the sequences GRPO
will show), keeps the episodes that scored at least
`min_score`, writes them to `demos.jsonl` (one whole conversation a line, tool messages included, with
its score, row and the tool schemas; an agent environment's are its requests', each answered by
`solve`, engine/demos.py), and fine-tunes the model on them (sft/trainer.py). The output folder is a
training run like `grpo`'s (adapter, tokenizer, run_config.json, run_summary.json), so `aitrain grpo
--model DIR` trains on top of it and `aitrain eval --model DIR` measures it.

Left out: the command's options and what it prints after training (commands/sft.py), the training itself
(sft/trainer.py), demonstrations from anything but `solve` (a file of your own conversations, a stronger
model), and resuming an interrupted run.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any, Callable

from aitrain_grpo.config import RunConfig
from aitrain_grpo.engine.backends.scripted import ScriptedBackend
from aitrain_grpo.engine.context import cuts_history
from aitrain_grpo.engine.demos import Demonstration, demonstration, has_turns, trace_tokens
from aitrain_grpo.engine.rollout import RolloutEngine
from aitrain_grpo.engine.runner import oracle_policy, play
from aitrain_grpo.engine.settings import EpisodeSettings
from aitrain_grpo.env.agent import is_agent_environment
from aitrain_grpo.env.base import has_solve
from aitrain_grpo.env.dataset import build_rows
from aitrain_grpo.env.loading import load_environment
from aitrain_grpo.errors import ConfigError, UserError
from aitrain_grpo.models.loading import load_tokenizer, resolve_source
from aitrain_grpo.runlog.records import write_jsonl

DEMOS_FILE = "demos.jsonl"


def play_demonstrations(env, rows: list[dict[str, Any]], episodes: int, *, max_turns: int | None,
                        timeout: float) -> tuple[list[Demonstration], list[str]]:
    """The oracle's episodes on the first `episodes` rows (cycled), as `Demonstration`s, and the errors
    of those that failed (an exception in solve, step or score_episode: scored 0)."""
    indices = [i % len(rows) for i in range(episodes)]
    played = play(env, [dict(rows[i]) for i in indices], oracle_policy(env), max_turns=max_turns, timeout=timeout,
                  policy_name="solve")
    demos = [demonstration(env, ep, rows[i], i) for i, ep in zip(indices, played)]
    return demos, [ep.error for ep in played if ep.error]


def plays_tokens(env, config: RunConfig) -> bool:
    """Whether the oracle is played by the token-level engine: where the engine may cut or rewrite an
    episode (engine/context.py `cuts_history`: a context strategy, tool results cut, a token budget GRPO
    enforces), what the model sees is the engine's history, not the conversation, and an episode a budget
    cuts is scored as GRPO scores it. Agent environments own their messages (text level; a strategy other
    than keep is refused for them, as GRPO refuses it)."""
    cuts = cuts_history(env, EpisodeSettings.from_options(config))  # resolves (and refuses) the strategy first
    return cuts and not is_agent_environment(env)


def play_sequences(env, tokenizer, rows: list[dict[str, Any]], episodes: int,
                   settings: EpisodeSettings) -> tuple[list[Demonstration], list[str]]:
    """`play_demonstrations` by the token-level engine under `settings` (budgets, context strategy): each
    demonstration keeps the sequences the engine cut it into, as GRPO will show them (backends/scripted.py)."""
    indices = [i % len(rows) for i in range(episodes)]
    backend = ScriptedBackend(oracle_policy(env), tokenizer)
    with RolloutEngine(env, tokenizer, backend, settings) as engine:
        batch = engine.run([dict(rows[i]) for i in indices])
    demos, errors = [], []
    for order, (i, episode) in enumerate(zip(indices, batch.episodes)):
        error = backend.errors.get(order) or episode.error
        if error:
            errors.append(error)
        traces = [*batch.earlier[order], batch.traces[order]]
        demos.append(replace(demonstration(env, episode, rows[i], i), score=0.0 if error else float(episode.score or 0.0),
                             sequences=[t for t in map(trace_tokens, traces) if t is not None],
                             earlier_messages=list(episode.log.earlier_messages)))
    return demos, errors


def keep_good(played: list[Demonstration], errors: list[str], min_score: float, env_name: str,
              max_turns: int | None = None) -> list[Demonstration]:
    """The demonstrations scoring at least `min_score`; none is a one-line error naming the cause (the turn
    cap `max_turns`, --rl-max-turns, when episodes reached it: it may have ended them before the oracle did)."""
    kept = [demo for demo in played if demo.score >= min_score and has_turns(demo)]
    if kept:
        return kept
    if any(demo.score >= min_score for demo in played):
        raise UserError(f"the oracle episodes of {env_name} that scored at least {min_score:g} have no reply to learn "
                        f"from: the agent sent no request; make rollout ask the model (client.chat.completions)")
    if errors:
        raise UserError(f"all {len(played)} oracle episodes failed or scored below {min_score:g} ({len(errors)} "
                        f"failed; the first: {errors[0]}); fix solve, check it with `aitrain env check`")
    best = max(demo.score for demo in played)
    capped = sum(max_turns is not None and demo.turns >= max_turns for demo in played)
    cause = (f"{capped} of them stopped at --rl-max-turns {max_turns}, perhaps before the oracle finished: raise "
             f"it or leave it out; or " if capped else "")
    raise UserError(f"none of the {len(played)} oracle episodes of {env_name} scored at least --min-score "
                    f"{min_score:g} (best: {best:g}); {cause}fix solve or score_episode (`aitrain env check` shows "
                    f"both), or lower --min-score")



def warm_start(config: RunConfig, episodes: int, min_score: float, show: Callable[[str], None]) -> dict[str, Any]:
    """Play, keep, write demos.jsonl and fine-tune (see the module doc); each line worth printing goes to
    `show`. Returns the run summary (sft/trainer.train_sft's) with the config the run had (`config`:
    its output folder may be the next free numbered one). Bad environments raise `UserError`."""
    from aitrain_grpo.training.run.folder import check_output_dir_for_run, with_fresh_default_output_dir  # torch
    from aitrain_grpo.training.run.folder import check_overwrite_target, write_run_config
    from aitrain_grpo.training.run.lock import claim_output_dir

    config, note = with_fresh_default_output_dir(config)
    if note:
        show(note)
    check_output_dir_for_run(config)
    replacing = check_overwrite_target(config, None)  # --overwrite: only a run of this environment
    claim_output_dir(config, movable=False)  # one live run per folder (run/lock.py)
    if replacing:
        show(replacing)
    env = load_environment(*config.environment())
    env_name = type(env).__name__
    if not has_solve(env) and getattr(env, "no_oracle", None):  # an adapter's reason: no stored answers
        raise ConfigError(f"no oracle to learn from: {env.no_oracle}")
    if not has_solve(env):
        raise ConfigError(f"{env_name} has no solve(episode) -> str, so there is no oracle to learn from; add "
                          f"one that returns an expert's next message (see HotelEnv.solve in envs/hotel.py)")
    tokenizer = load_tokenizer(resolve_source(config.model))
    rows = build_rows(env, tokenizer)
    if plays_tokens(env, config):
        played, errors = play_sequences(env, tokenizer, rows, episodes, EpisodeSettings.from_options(config))
    else:
        played, errors = play_demonstrations(env, rows, episodes, max_turns=config.rl_max_turns,
                                             timeout=config.rl_env_timeout)
    demos = keep_good(played, errors, min_score, env_name, config.rl_max_turns)
    output_dir = Path(config.resolved_output_dir())
    write_run_config(output_dir, config)  # first: a run that fails after this leaves a folder of ours
    write_jsonl(output_dir / DEMOS_FILE, [demo.record() for demo in demos])
    mean = sum(demo.score for demo in played) / len(played)
    cut = sum(len(demo.sequences) for demo in demos)
    sequences = f" ({cut} sequences as the context strategy cut them)" if cut > len(demos) else ""
    show(f"oracle: {len(played)} episodes of {env_name} (mean score {mean:.3f}); kept {len(demos)} scoring "
         f">= {min_score:g}{sequences}, written to {output_dir / DEMOS_FILE}")
    from aitrain_grpo.sft.trainer import train_sft  # TRL imports vLLM, which prints: only now

    summary = train_sft(config, demos, output_dir, show=show)
    return {**summary, "config": config}
