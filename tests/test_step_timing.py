"""Where a training step's time goes: every step's metrics say how long the rollout, generation, the
environment, TRL's scoring, the reference forward, the loss forward and backward and the optimizer step
took, and how fast the model generated, in numbers that add up; the same metrics carry why episodes
stopped, and the transcripts say it per episode."""

from __future__ import annotations

import io
import re
import json
import time
from contextlib import redirect_stdout

import pytest

from aitrain_grpo import RunConfig
from aitrain_grpo.env.base import STOP_REASONS
from aitrain_grpo.training.trainer import train
from envs.letters import LetterEnv

STEPS = 3
PHASE_KEYS = ("time/rollout_s", "time/score_s", "time/ref_logprobs_s", "time/loss_forward_backward_s",
              "time/optimizer_step_s")
TIME_KEYS = (*PHASE_KEYS, "time/generate_s", "time/env_s", "time/step_s", "time/tokens_per_s")


@pytest.fixture(scope="module")
def timed_run(tiny_model_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("timing") / "run"
    config = RunConfig(
        model=tiny_model_dir, output_dir=str(out), rl_env_module="envs.letters", rl_env_class="LetterEnv",
        max_steps=STEPS, batch_size=8, rl_num_generations=4, rl_max_new_tokens=12, log_episodes_every=1,
        log_episodes_count=2, seed=3,
    )
    printed = io.StringIO()
    started = time.perf_counter()
    with redirect_stdout(printed):
        train(config, LetterEnv(turns=2, num_tasks=8))
    wall = time.perf_counter() - started
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return out, records, wall, printed.getvalue()


def test_every_step_says_where_its_time_went(timed_run):
    _, records, wall, _ = timed_run
    assert [r["step"] for r in records] == list(range(1, STEPS + 1))
    for r in records:
        assert all(isinstance(r.get(key), float) for key in TIME_KEYS), r
        assert 0 < r["time/generate_s"] and 0 <= r["time/env_s"]
        # With the hf backend (lockstep turns) generation and the environment are parts of the rollout;
        # rollout and optimizer make the step.
        assert r["time/generate_s"] + r["time/env_s"] <= r["time/rollout_s"]
        assert all(r[key] > 0 for key in PHASE_KEYS), r  # the default KL (0.1) needs a reference forward
        assert sum(r[key] for key in PHASE_KEYS) == pytest.approx(r["time/step_s"], rel=1e-6)
        assert "time/optimizer_s" not in r  # renamed: it held the loss as well as the optimizer
        assert r["time/tokens_per_s"] > 0
    # The steps fit in the run's wall time (which also loads the model and saves it).
    assert sum(r["time/step_s"] for r in records) <= wall


def test_tokens_per_second_counts_the_tokens_the_model_generated(timed_run):
    _, records, _, _ = timed_run
    for r in records:
        # Letters turns are at most --rl-max-new-tokens (12) long, 2 turns, 8 episodes a step.
        tokens = r["time/tokens_per_s"] * r["time/generate_s"]
        assert 8 <= round(tokens) <= 8 * 2 * 12


def test_the_progress_line_shows_the_split(timed_run):
    _, _, _, printed = timed_run
    lines = [line for line in printed.splitlines() if line.startswith("step ")]
    assert len(lines) == STEPS
    for line in lines:
        assert "rollout " in line and "s (gen " in line and "s, env " in line and " tok/s" in line
        assert re.search(r"train [\d.]+s \(ref [\d.]+s, loss [\d.]+s, optim [\d.]+s\)", line), line


def test_stop_reasons_are_logged_and_shown_in_transcripts(timed_run):
    out, records, _, _ = timed_run
    for r in records:
        shares = [r[f"env/stop/{reason}"] for reason in STOP_REASONS]
        assert sum(shares) == pytest.approx(1.0)
        assert "env/truncated_turns_mean" in r
    episodes = [json.loads(line) for line in (out / "episodes.jsonl").read_text().splitlines()]
    assert episodes and all(e["stop_reason"] in STOP_REASONS for e in episodes)


def test_the_report_charts_the_time_split_and_the_stop_reasons(timed_run, tmp_path):
    from helpers.browser import rendered_dom

    out, _, _, _ = timed_run
    dom = rendered_dom(out / "report.html", tmp_path)
    for chart, legend in (("time", "loss forward+backward"), ("speed", "tokens/s"), ("stops", "turn_tokens")):
        svg = re.search(rf'<svg[^>]*data-chart="{chart}".*?</svg>', dom, re.S)
        assert svg and svg.group(0).count("<circle") >= STEPS, chart  # a point per step, per series
        assert f"</i>{legend}</span>" in dom, legend  # in the chart's legend, not just the page's script
    # Each transcript says why its episode ended.
    assert re.search(r'class="badge[^"]*">stopped: (env|max_turns|turn_tokens|completion_budget|error)<', dom)


class FakeTime:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_the_clock_charges_each_second_to_the_innermost_phase():
    from aitrain_grpo.training.step.phases import PhaseClock

    t = FakeTime()
    clock = PhaseClock(t)
    with clock.phase("rollout"):  # outside a step: nothing is charged
        t.now += 5
    clock.start()  # TRL's scoring first
    t.now += 1
    with clock.phase("rollout"):
        t.now += 10
    t.now += 2
    clock.base("loss_forward_backward")
    t.now += 7
    clock.base("optimizer_step")
    t.now += 0.5
    metrics = clock.stop()
    assert metrics == {"time/rollout_s": 10, "time/score_s": 3, "time/ref_logprobs_s": 0,
                       "time/loss_forward_backward_s": 7, "time/optimizer_step_s": 0.5, "time/eval_s": 0,
                       "time/step_s": 20.5}


def test_a_step_without_a_kl_term_spends_nothing_on_reference_forwards(tiny_model_dir, tmp_path):
    # The step times its scoring forwards by name (training/step/flow.py): with --rl-kl-coef 0 and no
    # reused batch there is none, while the timed run above (KL 0.1) spends time there every step.
    out = tmp_path / "run"
    config = RunConfig(model=tiny_model_dir, output_dir=str(out), rl_env_module="envs.letters", rl_env_class="LetterEnv",
                       max_steps=1, batch_size=4, rl_num_generations=2, rl_max_new_tokens=8, rl_kl_coef=0.0, seed=3)
    with redirect_stdout(io.StringIO()):
        train(config, LetterEnv(turns=1, num_tasks=4))
    record = json.loads((out / "metrics.jsonl").read_text().splitlines()[0])
    assert record["time/ref_logprobs_s"] == 0.0 and record["time/score_s"] > 0


def test_work_that_closes_a_step_is_a_phase_of_the_step():
    """How the held-back evaluation enters the step's clock (runlog/step_timing.py `close_steps_with`): at a step
    it evaluates, its time is `time/eval_s` inside `time/step_s`, with its own peak memory; at any other step
    `time/eval_s` is 0. A clock made to advance by hand, no model."""
    from types import SimpleNamespace

    from aitrain_grpo.runlog.step_metrics import StepMetrics
    from aitrain_grpo.runlog.step_timing import StepTiming
    from aitrain_grpo.training.step.phases import PhaseClock

    now = [0.0]
    sink = StepMetrics()
    timing = StepTiming(sink, PhaseClock(clock=lambda: now[0]))

    def evaluate(args, state, control, model=None, **kwargs) -> None:
        if state.global_step % 2 == 0:
            with timing.phase("eval"):
                now[0] += 5.0
            timing.mark("eval")
            control.should_log = True

    timing.close_steps_with(evaluate)
    logged = {}
    for step in (1, 2):
        state, control = SimpleNamespace(global_step=step), SimpleNamespace(should_log=False)
        timing.on_step_begin(None, state, control)
        now[0] += 1.0  # the batch and the loss
        timing.on_pre_optimizer_step(None, state, control)
        now[0] += 0.5  # the optimizer step
        assert timing.on_step_end(None, state, control, model=None) is control
        assert control.should_log == (step == 2)
        logged[step] = sink.drain()
    assert (logged[1]["time/eval_s"], logged[1]["time/step_s"]) == (0.0, 1.5)
    assert (logged[2]["time/eval_s"], logged[2]["time/optimizer_step_s"], logged[2]["time/step_s"]) == (5.0, 0.5, 6.5)
    assert "memory/eval_peak_rss_gb" in logged[2] and "memory/eval_peak_rss_gb" not in logged[1]
