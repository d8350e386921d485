"""`aitrain sft`, the oracle warm start, as a user runs it: it writes whole demonstrations and a model
that `eval` and `grpo` take; the loss covers the assistant turns only, on exactly the tokens the
rollout engine builds for the same conversation; bad input gets one line and exit 2.

One short SFT run (16 HotelEnv demonstrations, 6 steps, tiny model) is shared by the CLI tests. The
measurement that SFT then GRPO beats GRPO alone is `test_warm_start_beats_grpo_alone` (slow) and
benchmarks/warm_start.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from helpers import REPO, command_options, in_process_cli, run_cli
from helpers.rollouts import OracleBackend

FIXTURES = REPO / "tests"
HOTEL = ["--rl-env-module", "envs.hotel", "--rl-env-class", "HotelEnv"]


def assert_one_line_error(result, *fragments: str) -> str:
    code = result.returncode if hasattr(result, "returncode") else result.exit_code  # a process's, or in_process_cli's
    assert code == 2, result.stdout + result.stderr + repr(getattr(result, "exception", None))
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


@pytest.fixture(scope="module")
def sft_run(tmp_path_factory, tiny_model_dir):
    out = tmp_path_factory.mktemp("sft") / "hotel-sft"
    result = run_cli("sft", *HOTEL, "--episodes", "16", "--max-steps", "6", "--lr", "2e-3", "--batch-size", "4",
                     "--output-dir", str(out))
    assert result.returncode == 0, result.stdout + result.stderr
    return out, result


def read_demos(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "demos.jsonl").read_text().splitlines()]


def test_sft_writes_whole_demonstrations_and_a_model(sft_run):
    out, result = sft_run
    demos = read_demos(out)
    assert len(demos) == 16 and "kept 16 scoring >= 1" in result.stdout
    for demo in demos:
        roles = [m["role"] for m in demo["messages"]]
        assert roles[:2] == ["system", "user"] and demo["prompt_length"] == 2 and demo["score"] == 1.0
        assert "tool" in roles and roles[-1] == "assistant"  # whole conversations, tool results included
        assert '"name": "book_hotel"' in demo["messages"][-1]["content"]
        assert {t["function"]["name"] for t in demo["tools"]} == {"search_hotels", "check_availability", "book_hotel"}
    assert [d["row"] for d in demos] == list(range(16))
    assert (out / "adapter_config.json").is_file() and (out / "tokenizer_config.json").is_file()
    run_config = json.loads((out / "run_config.json").read_text())
    assert (run_config["rl_env_class"], run_config["lr"], run_config["peft"]) == ("HotelEnv", 2e-3, True)
    assert "next: aitrain grpo --model" in result.stdout


def test_the_loss_goes_down(sft_run):
    out, result = sft_run
    losses = json.loads((out / "run_summary.json").read_text())["losses"]
    assert len(losses) == 6 and sum(losses[-2:]) < sum(losses[:2]) - 0.2, losses
    assert "step 6/6  loss" in result.stdout


def test_eval_takes_the_sft_output(sft_run):
    out, _ = sft_run
    result = run_cli("eval", "--model", str(out), "--episodes", "4", "--rl-max-turns", "2")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "mean score" in result.stdout and "HotelEnv" in result.stdout  # the environment came from run_config.json


def test_grpo_trains_a_new_adapter_on_the_merged_sft_model(sft_run, tiny_model_dir):
    from aitrain_grpo.models.loading import load_for_generation, resolve_source

    out, _ = sft_run
    grpo_out = out.parent / "hotel-sft-grpo"
    result = run_cli("grpo", "--model", str(out), *HOTEL, "--max-steps", "1", "--batch-size", "4",
                     "--rl-max-turns", "2", "--output-dir", str(grpo_out))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "UserWarning" not in result.stderr  # PEFT's "Could not find a config file" on every save
    # The new adapter names the SFT output as its base, so loading it brings the SFT weights along.
    assert json.loads((grpo_out / "adapter_config.json").read_text())["base_model_name_or_path"] == str(out.resolve())
    ids = torch.tensor([[5, 17, 230, 41, 99, 7]])
    logits = {}
    for name, spec in (("tiny", tiny_model_dir), ("sft", str(out)), ("grpo", str(grpo_out))):
        model, _ = load_for_generation(resolve_source(spec))
        with torch.no_grad():
            logits[name] = model(ids).logits
    assert not torch.allclose(logits["sft"], logits["tiny"], atol=1e-3)  # SFT moved the model
    assert torch.allclose(logits["grpo"], logits["sft"], atol=1e-2)  # one GRPO step at 1e-5 on top of it


# ----------------------------------------------------------------------------- tokens and the loss mask


def hotel_demos(count: int = 6):
    from aitrain_grpo.sft.oracle import play_demonstrations
    from aitrain_grpo.env.dataset import build_rows
    from envs.hotel import HotelEnv

    env = HotelEnv()
    demos, errors = play_demonstrations(env, build_rows(env, None), count, max_turns=None, timeout=10)
    assert not errors and all(d.score == 1.0 for d in demos)
    return env, demos


@pytest.mark.parametrize("model", ["tiny", "smollm2"])
def test_sft_tokens_are_what_the_rollout_engine_builds(model, request):
    """The dataset SFTTrainer gets is token for token the episodes GRPO plays (the prompt with the tools
    rendered as training renders them: through the tiny template, in SmolLM2's system message; the
    turns; the tool replies), and its loss mask is the engine's env_mask."""
    from aitrain_grpo.engine.rollout import RolloutEngine
    from aitrain_grpo.engine.settings import EpisodeSettings
    from aitrain_grpo.models.loading import load_tokenizer, resolve_source
    from aitrain_grpo.sft.trainer import demo_dataset

    folder = request.getfixturevalue("tiny_model_dir" if model == "tiny" else "smollm2_model_dir")
    tokenizer = load_tokenizer(resolve_source(folder))
    env, demos = hotel_demos()
    dataset = demo_dataset(tokenizer, demos)
    engine = RolloutEngine(env, tokenizer, OracleBackend(dataset, tokenizer.eos_token_id),
                           EpisodeSettings(max_new_tokens=512, max_completion_length=4096))
    with engine:
        batch = engine.run([dict(env.build_dataset(None)[d.row]) for d in demos])
    for demo, ids, mask, episode, trace in zip(demos, dataset["input_ids"], dataset["assistant_masks"],
                                               batch.episodes, batch.traces):
        assert episode.score == 1.0 and episode.messages == demo.messages
        assert trace.prompt_ids + trace.completion_ids == ids
        assert [0] * len(trace.prompt_ids) + trace.env_mask == mask


def test_the_loss_is_on_the_assistant_turns_only(tiny_model_and_tokenizer, tmp_path):
    """SFTTrainer's labels (what its loss reads) decode to exactly the assistant turns, each closed by EOS."""
    from trl import SFTTrainer

    from aitrain_grpo.config import RunConfig
    from aitrain_grpo.sft.trainer import demo_dataset, sft_config

    model, tokenizer = tiny_model_and_tokenizer
    env, demos = hotel_demos(3)
    config = RunConfig(rl_env_module="envs.hotel", rl_env_class="HotelEnv", max_steps=1)
    dataset = demo_dataset(tokenizer, demos)
    trainer = SFTTrainer(model=model, args=sft_config(config, tmp_path), train_dataset=dataset, processing_class=tokenizer)
    for demo, example in zip(demos, trainer.train_dataset):
        labels, ids = example["labels"], example["input_ids"]
        assert len(labels) == len(ids)
        runs, current = [], []
        for token, label in zip(ids, labels):
            if label != -100:
                assert label == token
                current.append(token)
            elif current:
                runs.append(current)
                current = []
        runs += [current] if current else []
        turns = [m["content"] for m in demo.messages if m["role"] == "assistant"]
        assert [tokenizer.decode(run) for run in runs] == [turn + tokenizer.eos_token for turn in turns]


# ----------------------------------------------------------------------------- options and one-line errors


def test_options_are_grpos_and_the_differing_defaults_are_shown():

    sft, grpo = command_options("sft"), command_options("grpo")
    for flag in ("--model", "--max-steps", "--seed", "--peft", "--rl-env-module", "--rl-env-config", "--lora-r"):
        assert sft[flag][0] == grpo[flag][0], flag
    assert sft["--lr"] == ("Learning rate (higher than grpo's 1e-05: a LoRA adapter learning a new format from a few "
                           "demonstrations). (default: 0.0002)", 2e-4)
    assert sft["--epochs"][1] == 3.0 and "(default: 3.0)" in sft["--epochs"][0]


# The refusals run in this process (`in_process_cli`: the same code and exit codes without a command's start,
# 9 CPU seconds); the last, on a finished run, runs as the command, where nothing else reaches stderr.
@pytest.mark.integration  # a command, run in this process
@pytest.mark.usefixtures("isolated_imports")
def test_an_environment_without_solve_is_refused(tmp_path, monkeypatch):
    out = tmp_path / "never"
    result = in_process_cli(monkeypatch, FIXTURES)("sft", "--rl-env-module", "envs_fixtures.good", "--rl-env-class",
                                                  "GoodEnv", "--rl-env-config", '{"num_tasks": 2}', "--output-dir", out)
    assert_one_line_error(result, "GoodEnv has no solve(episode) -> str", "add one")
    assert not out.exists()


@pytest.mark.integration  # a command, run in this process
@pytest.mark.usefixtures("isolated_imports")
def test_no_demonstration_good_enough_is_refused(tmp_path, monkeypatch):
    cli = in_process_cli(monkeypatch, REPO)
    # One turn lets the oracle search but never book: every episode scores 0.2.
    result = cli("sft", *HOTEL, "--episodes", "4", "--rl-max-turns", "1", "--output-dir", tmp_path / "o")
    assert_one_line_error(result, "none of the 4 oracle episodes of HotelEnv scored at least --min-score 1",
                          "best: 0.2", "4 of them stopped at --rl-max-turns 1, perhaps before the oracle finished: "
                          "raise it or leave it out", "lower --min-score")
    result = cli("sft", *HOTEL, "--min-score", "1.5", "--output-dir", tmp_path / "o")
    assert_one_line_error(result, "--min-score must be in [0, 1]")
    # The oracle plays under the budgets, and the printed `next: aitrain grpo` repeats them: checked as grpo does.
    result = cli("sft", *HOTEL, "--rl-max-completion-length", "64", "--output-dir", tmp_path / "o")
    assert_one_line_error(result, "--rl-max-new-tokens 128 exceeds --rl-max-completion-length 64")


@pytest.mark.integration  # a command, run in this process
@pytest.mark.usefixtures("isolated_imports")
def test_a_run_refused_after_its_demonstrations_leaves_a_folder_the_fixed_run_takes(tmp_path, monkeypatch, tiny_model_dir):
    # The model is checked after demos.jsonl is written; that folder used to be refused as "files this tool
    # did not write", with or without --overwrite, until deleted by hand.
    cli = in_process_cli(monkeypatch, REPO)
    out = tmp_path / "o"
    common = ["sft", *HOTEL, "--model", tiny_model_dir, "--episodes", "4", "--max-steps", "1", "--batch-size", "4",
              "--output-dir", out]
    assert_one_line_error(cli(*common, "--target-modules", "nosuch_proj"), "--target-modules nosuch_proj names no module")
    assert (out / "demos.jsonl").is_file()
    fixed = cli(*common)
    assert fixed.exit_code == 0, fixed.output
    assert (out / "run_summary.json").is_file()


@pytest.mark.integration  # a command, run in this process
@pytest.mark.usefixtures("isolated_imports")
def test_sft_over_an_earlier_grpo_run_leaves_none_of_its_logs(tmp_path, monkeypatch, tiny_model_dir):
    # `report` and `eval RUN/best` read these; after sft --overwrite they described the replaced training.
    from aitrain_grpo.config import RunConfig
    from aitrain_grpo.training.run.folder import write_run_config

    out = tmp_path / "o"
    write_run_config(out, RunConfig(rl_env_module="envs.hotel", rl_env_class="HotelEnv"))
    earlier = ["metrics.jsonl", "scores.jsonl", "episodes.jsonl", "report.html", "run_summary.json", "best/best.json"]
    for name in earlier:
        (out / name).parent.mkdir(exist_ok=True)
        (out / name).write_text("{}\n")
    result = in_process_cli(monkeypatch, REPO)("sft", *HOTEL, "--model", tiny_model_dir, "--episodes", "4", "--max-steps",
                                               "1", "--batch-size", "4", "--output-dir", out, "--overwrite")
    assert result.exit_code == 0, result.output
    assert [name for name in earlier[:-1] if (out / name).is_file() and (out / name).read_text() == "{}\n"] == []
    assert not (out / "best").exists() and (out / "demos.jsonl").is_file()


@pytest.mark.integration  # a command, run in this process
@pytest.mark.usefixtures("isolated_imports")
def test_demonstrations_longer_than_the_context_are_refused(tmp_path, monkeypatch, tiny_model_dir):
    # They trained whole past the model's positions after one transformers warning (or crawled for minutes).
    result = in_process_cli(monkeypatch, FIXTURES)(
        "sft", "--rl-env-module", "envs_fixtures.workbench", "--rl-env-class", "LongAnswerEnv", "--model",
        tiny_model_dir, "--episodes", "2", "--max-steps", "1", "--batch-size", "2", "--output-dir", tmp_path / "o")
    assert_one_line_error(result, "2 of 2 demonstration sequences are longer than", "context of 4096 tokens",
                          "make the oracle's episodes shorter")
    assert not list((tmp_path / "o").glob("checkpoint-*")) and not (tmp_path / "o" / "run_summary.json").exists()


def test_a_finished_run_is_not_overwritten(sft_run):
    out, _ = sft_run
    result = run_cli("sft", *HOTEL, "--output-dir", str(out))
    assert_one_line_error(result, "already holds a finished run", "--overwrite")


# ----------------------------------------------------------------------------- the warm start pays off


def greedy_mean(model: str, out: Path, tasks: int = 16) -> float:
    episodes = out / f"eval-{Path(model).name}.jsonl"
    result = run_cli("eval", "--model", model, *HOTEL, "--rl-env-config", '{"seed": 0}', "--episodes", str(tasks),
                     "--rl-temperature", "0", "--rl-max-turns", "4", "--rl-max-new-tokens", "96", "--output", str(episodes))
    assert result.returncode == 0, result.stdout + result.stderr
    scores = [json.loads(line)["score"] for line in episodes.read_text().splitlines()]
    return sum(scores) / len(scores)


@pytest.mark.slow
def test_warm_start_beats_grpo_alone(tmp_path):
    """`sft` on the oracle's demonstrations of other tasks (another catalogue, `{"seed": 1}`) then 2 GRPO
    steps evaluates above the same 2 GRPO steps from the cold tiny model (greedy, same 16 tasks). The
    cold model almost never writes a well-formed tool call, so its groups score 0 and GRPO has nothing to
    learn from; benchmarks/WARM_START.md has the full measurement. 3-8 minutes on two busy cores."""
    grpo = [*HOTEL, "--rl-env-config", '{"seed": 0}', "--max-steps", "2", "--batch-size", "8", "--lr", "1e-3",
            "--rl-max-turns", "4", "--rl-max-new-tokens", "96"]
    sft = ["--rl-env-config", '{"seed": 1}', "--episodes", "64", "--max-steps", "30", "--lr", "1e-2"]
    for args in (["grpo", "--model", "tiny", *grpo, "--output-dir", str(tmp_path / "grpo")],
                 ["sft", *HOTEL, *sft, "--output-dir", str(tmp_path / "sft")],
                 ["grpo", "--model", str(tmp_path / "sft"), *grpo, "--output-dir", str(tmp_path / "sft-grpo")]):
        result = run_cli(*args)
        assert result.returncode == 0, result.stdout + result.stderr
    alone, warm = greedy_mean(str(tmp_path / "grpo"), tmp_path), greedy_mean(str(tmp_path / "sft-grpo"), tmp_path)
    assert warm >= alone + 0.05, (alone, warm)
