"""Held-back evaluation during training (`--eval-every`, evaluation/held_back.py) and the best weights kept
(`--save-best`, evaluation/best_checkpoint.py): the evaluation runs before step 1 and at every N-th step,
its eval/* metrics reach metrics.jsonl and report.html; it scores exactly what `aitrain eval` scores on the
same weights, tasks and seed; best/ holds the weights of the best logged value, which `aitrain eval` and
`aitrain export` read; a `--save-best` naming a metric the run never logs is refused before a model loads;
and the health warning for held-back success falling while the training score rises."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import re
from types import SimpleNamespace

import pytest
from rich.console import Console
from safetensors.torch import load_file

from aitrain_grpo import RunConfig, train
from aitrain_grpo.commands.evaluation import RUN_FLAGS, run_eval
from aitrain_grpo.runlog.health import HealthCallback, first_warnings, held_back_below_start, held_back_falls
from aitrain_grpo.runlog.report import report_data
from helpers import REPO, in_process_cli
from helpers.cli import refused

RUN = dict(rl_env_module="envs.letters", rl_env_class="LetterEnv", batch_size=8, rl_max_new_tokens=16, lr=1e-2,
           rl_kl_coef=0.0, seed=3, log_episodes_every=2)
HELD_BACK = {"letter": "a", "turns": 2}  # another environment configuration than the training one
EVAL_KEYS = ("eval/mean_score", "eval/success", "eval/pass@1", "eval/turns", "eval/tool_errors", "eval/truncated", "eval/errors")
# The summary of `aitrain eval` (EvalResult.summary) that each logged metric is.
SUMMARY_OF = dict(zip(EVAL_KEYS, ("mean_score", "success_rate", "pass@1", "mean_turns", "tool_errors", "truncated",
                                  "errors")))


def records(out) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def trained(config: RunConfig) -> str:
    """Train; what it printed."""
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert train(config)["global_step"] == config.max_steps
    return printed.getvalue()


@pytest.fixture(scope="module")
def evaluated_run(tiny_model_dir, tmp_path_factory):
    """Four steps, held-back evaluation every two on four tasks of another configuration, the best
    mean score kept: (output folder, what the run printed)."""
    out = tmp_path_factory.mktemp("held_back") / "letters"
    config = RunConfig(model=tiny_model_dir, output_dir=str(out), **RUN, max_steps=4, eval_every=2, eval_episodes=4,
                       eval_env_config=HELD_BACK, save_best="eval/mean_score")
    return out, trained(config)


def test_evaluation_runs_at_the_steps_asked_and_reaches_metrics_and_report(evaluated_run):
    out, printed = evaluated_run
    logged = records(out)
    assert [r["step"] for r in logged if "eval/success" in r] == [0, 2, 4]  # before step 1, then every 2
    assert [r["step"] for r in logged] == [0, 1, 2, 3, 4]
    for record in (r for r in logged if "eval/success" in r):
        assert set(EVAL_KEYS) <= set(record) and record["time/eval_s"] > 0
        assert record["eval/turns"] == 2.0  # the held-back configuration's two turns, not training's three
    assert all("time/elapsed_s" in r for r in logged)
    lines = [line for line in printed.splitlines() if line.startswith("held-back eval at step")]
    assert [line.split(":")[0] for line in lines] == [f"held-back eval at step {s}" for s in (0, 2, 4)]
    assert "(4 tasks x 1," in lines[0]
    data = report_data(out)  # what report.html embeds
    assert [r["step"] for r in data["metrics"] if "eval/success" in r] == [0, 2, 4]
    page = (out / "report.html").read_text()
    assert "eval/success" in page and "chart-held-back" in page and "time/eval_s" in page
    # The report states the held-back gain an hour: first to last evaluation over the wall-clock hours between.
    evaluated = [r for r in logged if "eval/success" in r]
    hours = (evaluated[-1]["time/elapsed_s"] - evaluated[0]["time/elapsed_s"]) / 3600
    gain = data["held_back_gain"]
    assert gain["first"] == evaluated[0]["eval/success"] and gain["last"] == evaluated[-1]["eval/success"]
    assert gain["per_hour"] == pytest.approx((gain["last"] - gain["first"]) / hours) and "an hour" in page
    # From the second evaluation on, success since step 0 on the same tasks, with its interval paired by task.
    assert "eval/success_gain" not in evaluated[0]
    for record, line in zip(evaluated[1:], lines[1:]):
        change = record["eval/success"] - evaluated[0]["eval/success"]
        assert record["eval/success_gain"] == pytest.approx(change)  # one episode a task: the plain difference
        assert record["eval/success_gain_low"] <= change <= record["eval/success_gain_high"]
        assert f"; since step 0: success {change * 100:+.1f} pts, 95% interval [" in line
        score_change = record["eval/mean_score"] - evaluated[0]["eval/mean_score"]
        assert record["eval/score_gain"] == pytest.approx(score_change)
        assert record["eval/score_gain_low"] <= score_change <= record["eval/score_gain_high"]
        assert f"mean score {score_change:+.3f}, 95% interval [" in line
    assert gain["interval"] == [evaluated[-1]["eval/success_gain_low"], evaluated[-1]["eval/success_gain_high"]]


def test_the_report_shows_the_held_back_gain_with_its_interval_in_a_browser(evaluated_run, tmp_path):
    from helpers.browser import rendered_dom

    out, _ = evaluated_run
    final = [r for r in records(out) if "eval/success" in r][-1]
    low, high = final["eval/success_gain_low"], final["eval/success_gain_high"]
    dom = rendered_dom(out / "report.html", tmp_path)
    assert f"an hour; the gain's 95% interval [{low:+.3f}, {high:+.3f}]" in dom.replace("&amp;", "&")


def test_the_held_back_gain_needs_two_evaluations_apart_in_time():
    from aitrain_grpo.runlog.report import held_back_gain

    assert held_back_gain([{"eval/success": 0.5, "time/elapsed_s": 10.0}]) is None
    gain = held_back_gain([{"eval/success": 0.25, "time/elapsed_s": 0.0}, {"reward": 1.0, "time/elapsed_s": 900.0},
                           {"eval/success": 0.5, "time/elapsed_s": 1800.0}])
    assert gain == {"first": 0.25, "last": 0.5, "hours": 0.5, "per_hour": 0.5}
    interval = {"eval/success_gain": 0.25, "eval/success_gain_low": 0.05, "eval/success_gain_high": 0.45}
    assert held_back_gain([{"eval/success": 0.25, "time/elapsed_s": 0.0},
                           {"eval/success": 0.5, "time/elapsed_s": 1800.0, **interval}])["interval"] == [0.05, 0.45]


def test_training_plays_and_learns_the_same_with_or_without_evaluation(evaluated_run, tiny_model_dir, tmp_path):
    """An evaluation seeds every random generator (as `aitrain eval` does); training's state is put back."""
    out, _ = evaluated_run
    plain = tmp_path / "plain"
    trained(RunConfig(model=tiny_model_dir, output_dir=str(plain), **RUN, max_steps=4))
    learned = [[(r["step"], r["reward"], r["loss"]) for r in records(folder) if "reward" in r]
               for folder in (out, plain)]
    assert learned[0] == learned[1]


def played_by_aitrain_eval(model: str, seed: int, **flags) -> dict[str, float]:
    """`aitrain eval --model MODEL --episodes 4 --rl-env-config HELD_BACK --seed SEED`'s summary; `flags`:
    the environment's module and class (default: the training run's) and sampling and budget flags."""
    module, class_name = flags.pop("rl_env_module", None), flags.pop("rl_env_class", None)
    results = run_eval(model=model, baseline=None, module=module, class_name=class_name,
                       env_config=json.dumps(HELD_BACK), episodes=4, samples=1, use_vllm=False, output=None,
                       options={name: flags.get(name) for name in RUN_FLAGS}, seed=seed, batch_size=32,
                       console=Console(file=io.StringIO()))
    return results[0].summary()


def test_eval_in_training_equals_aitrain_eval_on_the_same_weights_tasks_and_seed(evaluated_run):
    out, _ = evaluated_run
    logged = {r["step"]: r for r in records(out)}
    best = json.loads((out / "best" / "best.json").read_text())
    for model, step in ((out, 4), (out / "best", best["step"])):  # the final weights are step 4's
        played = played_by_aitrain_eval(str(model), RUN["seed"])
        assert {key: played[SUMMARY_OF[key]] for key in EVAL_KEYS} == {key: logged[step][key] for key in EVAL_KEYS}
    assert logged[4]["eval/mean_score"] != logged[0]["eval/mean_score"]  # the weights did move


def test_a_run_whose_engine_cannot_play_the_current_weights_evaluates_with_its_model(tiny_model_dir, tmp_path, capsys):
    """A run whose engine cannot play the current weights between steps (--rl-async-steps: the server's
    weights belong to the steps played ahead; rollout/parts.py `evaluation_backend` says None): the
    evaluation plays Hugging Face generate on the trainer's model, as `aitrain eval` would on those weights."""
    from aitrain_grpo.evaluation.held_back import HeldBackEvaluation
    from aitrain_grpo.models.loading import load_model_and_tokenizer
    from aitrain_grpo.runlog.step_metrics import StepMetrics

    config = RunConfig(model=tiny_model_dir, **RUN, eval_every=1, eval_episodes=4, eval_env_config=HELD_BACK).validate()
    async_run = SimpleNamespace(parts=SimpleNamespace(weight_sync=object(), evaluation_backend=lambda: None),
                                metrics=StepMetrics())
    callback = HeldBackEvaluation(config, async_run, tmp_path)
    model, tokenizer = load_model_and_tokenizer(tiny_model_dir)  # as the trainer loads them
    logged = callback.evaluate(0, SimpleNamespace(is_world_process_zero=True), model, tokenizer)
    played = played_by_aitrain_eval(tiny_model_dir, RUN["seed"], **{name: RUN[name] for name in (
        "rl_env_module", "rl_env_class", "rl_max_new_tokens")})  # a base model has no run_config.json to give them
    assert {key: played[SUMMARY_OF[key]] for key in EVAL_KEYS} == {key: logged[key] for key in EVAL_KEYS}
    assert "held-back eval at step 0" in capsys.readouterr().out


def test_an_evaluation_syncs_the_engine_and_leaves_the_next_rollout_nothing_to_sync():
    """A vLLM run's evaluation syncs the engine through the run's own weight sync (rollout/parts.py
    `evaluation_backend`, colocated vLLM's reload here, the engine faked): the current weights, and the
    rollout that follows on the same weights does not sync them again. With --rl-async-steps it syncs nothing."""
    import torch

    from aitrain_grpo.runlog.step_metrics import StepMetrics
    from aitrain_grpo.training.rollout.parts import RolloutParts
    from aitrain_grpo.training.rollout.weight_sync import ColocateWeightSync

    reloads = []
    llm = SimpleNamespace(reset_prefix_cache=lambda: None,
                          collective_rpc=lambda name, kwargs: reloads.append(dict(kwargs["weights_iterator"])))
    model = torch.nn.Linear(2, 2)
    trainer = SimpleNamespace(state=SimpleNamespace(global_step=0), model=model,
                              accelerator=SimpleNamespace(unwrap_model=lambda m: m))
    engine = SimpleNamespace(backend=SimpleNamespace(), on_episode_done=None)
    parts = RolloutParts(engine, sink=StepMetrics(), weight_sync=ColocateWeightSync(llm), trainer=trainer)
    assert parts.evaluation_backend() is engine.backend and len(reloads) == 1  # before step 1
    parts.sync_weights(trainer)  # step 1's rollout, on the same weights
    assert len(reloads) == 1
    with torch.no_grad():
        model.weight += 1.0  # step 1's optimizer step
    trainer.state.global_step = 1
    assert parts.evaluation_backend() is engine.backend and len(reloads) == 2
    assert reloads[-1]["weight"].equal(model.weight)
    parts.sync_weights(trainer)  # step 2's rollout
    assert len(reloads) == 2
    played_ahead = RolloutParts(engine, sink=StepMetrics(), weight_sync=ColocateWeightSync(llm), trainer=trainer,
                                async_rollout=SimpleNamespace())
    assert played_ahead.evaluation_backend() is None and len(reloads) == 2


def test_the_evaluation_is_a_phase_of_its_step(evaluated_run):
    """`time/eval_s` at a step is the step's `eval` phase: inside `time/step_s`, 0 at steps without one."""
    out, printed = evaluated_run
    phases = ("rollout", "score", "ref_logprobs", "loss_forward_backward", "optimizer_step", "eval")
    steps = {r["step"]: r for r in records(out) if r["step"] > 0}
    for step, record in steps.items():
        assert sum(record[f"time/{p}_s"] for p in phases) == pytest.approx(record["time/step_s"], rel=1e-6)
        assert (record["time/eval_s"] > 0) == (step % 2 == 0), record
    assert "(4 tasks x 1, Hugging Face generate," in printed
    assert re.search(r"train [\d.]+s \(ref [\d.]+s, loss [\d.]+s, optim [\d.]+s\)  eval [\d.]+s", printed)


def test_best_holds_the_weights_of_the_best_logged_value_and_outlives_a_resume(tiny_model_dir, tmp_path, monkeypatch):
    out = tmp_path / "run"
    # The held-back episodes score 0.2, 0.9 and 0.5 at the evaluations of steps 0, 1 and 2, whatever the model.
    schedule = {"scores": [0.2, 0.9, 0.5], "per_call": 4}
    config = RunConfig(model=tiny_model_dir, output_dir=str(out), **RUN, max_steps=2, save_steps=1, eval_every=1,
                       eval_episodes=4, eval_env_module="envs_fixtures.scheduled_scores",
                       eval_env_class="ScheduledScores", eval_env_config=schedule, save_best="eval/mean_score")
    printed = trained(config)
    assert [r["eval/mean_score"] for r in records(out) if "eval/mean_score" in r] == [0.2, 0.9, 0.5]
    best_record = json.loads((out / "best" / "best.json").read_text())
    assert best_record == {"metric": "eval/mean_score", "value": 0.9, "step": 1}
    assert "best eval/mean_score 0.9 at step 1: kept in" in printed
    best = load_file(out / "best" / "adapter_model.safetensors")
    step_1 = load_file(out / "checkpoint-1" / "adapter_model.safetensors")
    final = load_file(out / "adapter_model.safetensors")
    assert best.keys() == step_1.keys() and all(best[k].equal(step_1[k]) for k in best)
    assert any(not best[k].equal(final[k]) for k in best)  # not the last weights
    aitrain = in_process_cli(monkeypatch, REPO)
    exported = aitrain("export", out / "best", "--to", tmp_path / "exported")
    assert exported.exit_code == 0, exported.output
    assert (tmp_path / "exported" / "config.json").is_file() and (tmp_path / "exported" / "run_config.json").is_file()
    # A resume keeping the best of another metric is refused before a model loads: its first evaluation
    # would replace best/'s weights of eval/mean_score without a word.
    from aitrain_grpo.errors import ConfigError

    with pytest.raises(ConfigError, match=r"best holds the best eval/mean_score \(0.9 at step 1\), and this run keeps "
                                          r"save_best=eval/turns; resume with save_best=eval/mean_score"):
        trained(dataclasses.replace(config, max_steps=3, resume_from_checkpoint="auto", save_best="eval/turns"))
    # Resumed from checkpoint-2, the run keeps best/ of step 1: its first evaluation (step 3, a fresh
    # schedule: 0.2) is worse, and no evaluation before its first step repeats step 2's.
    trained(dataclasses.replace(config, max_steps=3, resume_from_checkpoint="auto"))
    assert [(r["step"], r["eval/mean_score"]) for r in records(out) if "eval/mean_score" in r] == [
        (0, 0.2), (1, 0.9), (2, 0.5), (3, 0.2)]
    # The start's per-task scores came back with the checkpoint: the resumed run still measures from step 0.
    assert records(out)[-1]["eval/success_gain"] == 0.0
    assert json.loads((out / "best" / "best.json").read_text())["step"] == 1


@pytest.fixture
def no_training(monkeypatch):
    """`aitrain grpo` from the repository root, where loading a model fails the test."""
    import aitrain_grpo.training.trainer as trainer

    def loaded(*args, **kwargs):
        raise AssertionError("a model was loaded before the refusal")

    monkeypatch.setattr(trainer, "load_model_and_tokenizer", loaded)
    monkeypatch.chdir(REPO)


ALLOWED = "eval/mean_score, eval/success, eval/pass@1, eval/turns, eval/tool_errors, eval/truncated, eval/errors"


@pytest.mark.parametrize("flags, expected", [
    (["--save-best", "eval/success"], ["--save-best eval/success", "without --eval-every", ALLOWED]),
    (["--eval-every", "2", "--save-best", "eval/accuracy"], ["--save-best eval/accuracy is not a metric", ALLOWED]),
    (["--eval-every", "2", "--eval-num-generations", "4", "--save-best", "eval/pass@1"],
     ["--save-best eval/pass@1 is not a metric", "eval/pass@4"]),
    (["--eval-every", "2", "--eval-patience", "3"], ["--eval-patience 3 counts evaluations without a better --save-best"]),
])
def test_a_save_best_never_logged_is_refused_before_a_model_loads(tmp_path, no_training, flags, expected):
    out = tmp_path / "run"
    refused(["grpo", "--rl-env-module", "envs.letters", "--rl-env-class", "LetterEnv", "--output-dir", str(out),
             *flags], tmp_path, *expected)
    assert not out.exists()


@pytest.mark.parametrize("config, expected", [
    ('{"no_such_argument": 1}', ["no_such_argument"]),
    ("{num_tasks: 3}", ["--eval-env-config is not valid JSON", "e.g. --eval-env-config '{"]),  # the flag named
    ("[1]", ["--eval-env-config must be a JSON object", "got an array"]),
    ('{"turns": "x"}', ["config key 'turns' is annotated int", "pass a value of that type in --eval-env-config"]),
])
def test_a_held_back_environment_that_cannot_load_is_refused_before_a_model_loads(tmp_path, no_training, config,
                                                                                  expected):
    out = tmp_path / "run"
    refused(["grpo", "--rl-env-module", "envs.letters", "--rl-env-class", "LetterEnv", "--output-dir", str(out),
             "--eval-every", "2", "--eval-env-config", config], tmp_path, *expected)
    assert not out.exists()


def history(successes: dict[int, float], rewards: list[float]) -> list[dict]:
    """Logged records of steps 1.., with `reward` and, at the steps given, `eval/success`."""
    return [{"step": step, "reward": reward, **({"eval/success": successes[step]} if step in successes else {})}
            for step, reward in enumerate(rewards, start=1)]


def test_held_back_success_falling_while_the_reward_rises_is_a_warning():
    rising = [0.1 + 0.01 * i for i in range(90)]
    falling = {30: 0.5, 60: 0.4, 90: 0.3}  # 30 steps apart: beyond the other checks' history
    warning = held_back_falls(history(falling, rising))
    assert warning and "held-back success fell at two evaluations in a row (50.0% -> 40.0% -> 30.0%)" in warning.message
    assert held_back_falls(history({30: 0.5, 60: 0.4, 90: 0.45}, rising)) is None  # fell once
    assert held_back_falls(history(falling, rising[::-1])) is None  # the reward fell too
    assert held_back_falls(history({60: 0.4, 90: 0.3}, rising)) is None  # two evaluations: one fall
    # The evaluation before step 1 has no training score to compare and is not counted.
    assert held_back_falls([{"step": 0, "eval/success": 0.9}] + history({60: 0.4, 90: 0.3}, rising)) is None
    assert [w.key for w in first_warnings(history(falling, rising))] == ["held_back_falls"]
    console = io.StringIO()
    callback = HealthCallback(Console(file=console, width=400))
    for record in history(falling, rising):
        callback.on_log(None, SimpleNamespace(is_world_process_zero=True, global_step=record["step"]), None,
                        logs={k: v for k, v in record.items() if k != "step"})
    assert console.getvalue().count("held-back success fell") == 1


def test_held_back_success_below_the_start_beyond_its_interval_is_a_warning():
    def evaluated(gain, low, high):
        return [{"step": 10, "reward": 0.6, "eval/success": 0.3, "eval/success_gain": gain, "eval/success_gain_low": low,
                 "eval/success_gain_high": high}]

    warning = held_back_below_start(evaluated(-0.2, -0.3, -0.1))
    assert warning and warning.message == ("held-back success is below the start's: -20.0 pts since step 0, 95% interval "
                                           "[-30.0, -10.0] over the same tasks")
    assert held_back_below_start(evaluated(-0.2, -0.4, 0.0)) is None  # a tie with the start: noise
    assert held_back_below_start(evaluated(0.2, 0.1, 0.3)) is None
    assert held_back_below_start([{"step": 3, "reward": 0.5}]) is None  # no evaluation since step 0


def test_eval_patience_stops_a_run_whose_best_is_that_many_evaluations_old_as_finished(tiny_model_dir, tmp_path):
    """Held-back mean scores 0.2, 0.9, 0.5 at steps 0, 1, 2: with --eval-patience 1 the best (step 1) is one
    evaluation old at step 2, so the run of 5 steps ends there, finished, its best kept."""
    out = tmp_path / "run"
    config = RunConfig(model=tiny_model_dir, output_dir=str(out), **RUN, max_steps=5, eval_every=1, eval_episodes=4,
                       eval_env_module="envs_fixtures.scheduled_scores", eval_env_class="ScheduledScores",
                       eval_env_config={"scores": [0.2, 0.9, 0.5, 0.4, 0.3, 0.2], "per_call": 4},
                       save_best="eval/mean_score", eval_patience=1)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        summary = train(config)
    assert [r["step"] for r in records(out)] == [0, 1, 2]
    reason = ("stopped early at step 2: eval/mean_score has not improved for 1 evaluation (--eval-patience); best "
              f"eval/mean_score 0.9 at step 1, kept in {out / 'best'}")
    assert summary["completed"] and summary["stopped_early"] == reason and reason in printed.getvalue()
    assert json.loads((out / "run_summary.json").read_text())["stopped_early"] == reason
    assert json.loads((out / "best" / "best.json").read_text())["step"] == 1
