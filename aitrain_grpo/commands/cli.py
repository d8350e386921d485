"""The `aitrain` command line (also `python -m aitrain_grpo`). Commands:

- `grpo`: train a model with GRPO in an environment;
- `sft`: warm a model up on the environment's oracle demonstrations before GRPO (commands/sft.py);
- `env check`: try an environment out (dataset, prompts, tools, oracle/empty/model episodes);
- `eval`: measure a model or a training run in an environment, optionally against a baseline;
- `report`: write report.html for a training output directory;
- `export`: a training output as a standalone model folder, checked, optionally uploaded (commands/export.py);
- `vllm-serve`: start a vLLM server set up for training against it;
- `tiny-model`: build the tiny local demo model into a folder;
- `init`: write a new environment and its test, ready to edit (commands/scaffold.py).

Every option of `aitrain grpo` is a `RunConfig` field, and so is every run option of `eval` and `env
check`: their flags are generated from those fields (options.py), so names, defaults and help texts
live in one place (config.py). A flag given on the command line overrides the same option in
`--config`. Problems a user can fix (bad options, an environment that does not load) print one line,
`error: ...`, and exit with code 2; `--debug` shows the traceback. What a person reads goes through
rich consoles (`out`, `err`); diagnostics go through `logging`.

Left out: the library logic itself; each command is a thin call into the modules.
"""

from __future__ import annotations

import inspect
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Optional

import typer

import aitrain_grpo.commands.quiet  # noqa: F401 - silences warnings no user can act on
from aitrain_grpo.commands.app_group import AitrainGroup
from aitrain_grpo.commands.envcheck import CHECK_FLAGS, POLICIES, run_env_check
from aitrain_grpo.commands.evaluation import RUN_FLAGS, run_eval
from aitrain_grpo.commands.exits import (
    early_stops, err, exit_without_waiting_for_env_calls, fail, out, reported_errors, user_errors,
)
from aitrain_grpo.commands.export import EXPORT_SIGNATURE, run_export
from aitrain_grpo.commands.sft import SFT_SIGNATURE, run_sft
from aitrain_grpo.commands.options import (
    as_in_grpo, command_option, field_option, from_training_run, grpo_parameters, with_default,
)
from aitrain_grpo.commands.scaffold import print_next_steps, write_scaffold
from aitrain_grpo.commands.vllm_serve import (
    SERVER_STOP_GRACE, ServeOptions, signal_server, start_server, stop_server, trainer_flags, wait_until_ready,
)
from aitrain_grpo.config import RunConfig
from aitrain_grpo.env_spec import environment_of
from aitrain_grpo.engine.backends.choice import require_vllm
from aitrain_grpo.env.loading import describe_interface, load_environment
from aitrain_grpo.errors import EXIT_USAGE, one_line
from aitrain_grpo.option_rules import check_seed
from aitrain_grpo.outputs import check_file_output, replaced_contents
from aitrain_grpo.training.preflight.run_checks import check_run
from aitrain_grpo.runlog.records import METRICS_FILE, read_jsonl
from aitrain_grpo.runlog.report import REPORT_FILE, is_report_page, write_report
from aitrain_grpo.models.tiny import build_tiny_model
from aitrain_grpo.training.preflight.small_dataset import steps_short
from aitrain_grpo.training.run.lock import release_all

# aitrain_grpo.training's other modules import torch and TRL (seconds, and TRL imports vLLM, which
# prints): `grpo` imports them once its options are checked, so `--help` and option errors stay fast.

app = typer.Typer(
    cls=AitrainGroup,  # another trainer's flag name answered with ours
    help="Train language-model agents with GRPO in environments you write.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    # Plain click help: rich's option table cuts long flag names (--rl-max-completion-le…) at 80 columns.
    rich_markup_mode=None,
)
# ------------------------------------------------------------------------------ aitrain grpo

def build_run_config(config_file: str | None, flags: dict[str, Any]) -> RunConfig:
    """Options from `--config`, then the flags that were given, into a RunConfig (checked once, by plan_run)."""
    options = RunConfig.from_file(config_file) if config_file else {}
    options.update({k: v for k, v in flags.items() if v is not None})
    return RunConfig(**options)


def grpo(**kwargs) -> None:
    """Train a model with GRPO in your environment (multi-turn episodes, tools, LoRA)."""
    debug = bool(kwargs.get("debug"))
    started = time.monotonic()  # the environment calls this run waits for at its end began after this
    try:
        config = build_run_config(kwargs.pop("config", None), kwargs)
        from aitrain_grpo.training.run.plan import plan_run

        plan = plan_run(config)  # a bad option or a clobbered output dir fails before the environment loads
        config = plan.config  # checked and typed; a taken default output folder becomes the next numbered one
        if config.model == "tiny":
            out.print(
                "Using the built-in tiny model (a few hundred thousand parameters, built locally); "
                "pass --model Qwen/Qwen2.5-0.5B-Instruct (or a local path) to train a real one.",
                markup=False,
            )
        env = load_environment(*config.environment())
        out.print(f"environment {type(env).__name__}: {describe_interface(env)}", markup=False, highlight=False)
        notes = check_run(config, env)  # refusals that need the environment, before the model loads (preflight/run_checks.py)
        for note in notes if os.environ.get("RANK", "0") == "0" else ():
            err.print(note, markup=False)
        from aitrain_grpo.training.trainer import train  # after the checks: TRL imports vLLM, which prints

        summary = train(config, env=env, plan=plan)
    except user_errors() as exc:
        release_all()  # a refused run leaves no lock, nor the folder the lock made
        if debug:
            raise
        fail(str(exc), code=getattr(exc, "exit_code", EXIT_USAGE))
    except KeyboardInterrupt:  # outside the training steps, or a second Ctrl-C
        # Before early_stops(): its import (torch) fails where the Ctrl-C cut an import of torch short.
        err.print("interrupted; nothing saved since the last checkpoint", markup=False)
        exit_without_waiting_for_env_calls(130, err, since=started)
    except early_stops() as stop:  # signal, error rate, dead backend: stopped with a checkpoint
        for line in stop.lines(sys.argv[1:]) if stop.is_error or os.environ.get("RANK", "0") == "0" else ():
            err.print(line, markup=False)  # a planned stop is the same on every process: said once
        exit_without_waiting_for_env_calls(stop.exit_code, err, since=started, at_once=stop.hurried)  # a signal: in a hurry
        return  # exit code 0: a planned stop (--max-time)
    if not summary["completed"]:  # e.g. the data ran out: saved, but never a "done"
        fail(str(steps_short(summary["global_step"], summary["steps_asked"])), code=1)
    if os.environ.get("RANK", "0") != "0":  # under accelerate/torchrun, one process reports
        return
    output_dir = config.resolved_output_dir()
    out.print(f"done: {summary['global_step']} steps in {summary['runtime_seconds']:.0f}s; model saved to {output_dir}")
    if (output_dir / REPORT_FILE).is_file():
        out.print(f"report: {output_dir / REPORT_FILE} (open it in a browser)", markup=False)
    out.print(f"next: aitrain eval --model {output_dir} --baseline {config.model} --episodes 32", markup=False)
    if config.rl_env_class != "HotelEnv":
        out.print("then the worked tool example: aitrain env check --rl-env-module envs.hotel --rl-env-class HotelEnv "
                  "(the tiny model writes no valid tool call, so GRPO on it learns nothing: tool use needs a real model "
                  "and an `aitrain sft` start, benchmarks/TOOL_USE.md)", markup=False)
    exit_without_waiting_for_env_calls(0, err, since=started)


grpo.__signature__ = inspect.Signature(grpo_parameters())
app.command("grpo")(grpo)


# ------------------------------------------------------------------------------ aitrain vllm-serve


@app.command("vllm-serve")
def vllm_serve(
    model: str = typer.Option(..., "--model", help="Model id or path to serve ('tiny' for the built-in model); the same as the trainer's --model."),
    host: str = typer.Option("127.0.0.1", help="Address to bind. Anyone who can reach it can generate and replace the weights."),
    port: int = typer.Option(8000, help="Port."),
    gpu_memory_utilization: float = typer.Option(0.9, help="Share of GPU memory for the server."),
    tensor_parallel_size: int = typer.Option(1, help="GPUs the server shards the model over."),
    max_model_len: Optional[int] = typer.Option(None, help="Longest prompt plus completion, in tokens (default: the model's)."),
    enable_lora: bool = typer.Option(False, "--enable-lora", help="Accept LoRA adapters at run time (for --vllm-sync lora)."),
    max_lora_rank: int = typer.Option(16, help="Largest LoRA rank to accept (at least the trainer's --lora-r)."),
    sync_dir: Optional[str] = typer.Option(None, help="Folder shared with the trainer for lora/disk weight sync (shown in the trainer flags)."),
    enforce_eager: bool = typer.Option(False, "--enforce-eager", help="Skip graph compilation: starts much faster, generates slower (tests, small models on CPU)."),
    timeout: float = typer.Option(600.0, help="Seconds to wait for the server to be ready."),
) -> None:
    """Start a vLLM server set up for RL training (token-id prompts, log-probabilities, weight sync)."""
    try:
        require_vllm("aitrain vllm-serve")
    except user_errors() as exc:
        fail(str(exc))
    if not 1 <= port <= 65535:
        fail(f"--port must be between 1 and 65535, got {port}")
    options = ServeOptions(
        model=model, host=host, port=port, gpu_memory_utilization=gpu_memory_utilization,
        tensor_parallel_size=tensor_parallel_size, max_model_len=max_model_len, enable_lora=enable_lora,
        max_lora_rank=max_lora_rank, sync_dir=sync_dir, enforce_eager=enforce_eager,
    )
    try:
        process, url = start_server(options)  # resolves --model: converts smollm2 or a .gguf on first use
    except user_errors() as exc:
        fail(str(exc))
    received: list[tuple[int, float]] = []

    def forward(signum, frame):
        # The server runs in its own session; pass the signal on and let the wait below return.
        # Waiting here would deadlock with that wait; a second signal kills the server outright.
        received.append((signum, time.monotonic()))
        signal_server(process, signal.SIGTERM if len(received) == 1 else signal.SIGKILL)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    try:
        wait_until_ready(process, url, timeout)
    except RuntimeError as exc:
        stop_server(process)
        if received:
            raise typer.Exit(128 + received[0][0])
        fail(str(exc), code=1)
    out.print(f"vLLM server ready at {url}", markup=False)
    out.print(f"train against it with: aitrain grpo --model {model} ... {trainer_flags(options, url)}", markup=False)
    sys.stdout.flush()  # someone may be waiting for these lines in a log file
    while True:
        try:
            code = process.wait(timeout=1.0)
            break
        except subprocess.TimeoutExpired:
            if received and time.monotonic() - received[0][1] > SERVER_STOP_GRACE:
                signal_server(process, signal.SIGKILL)  # a graceful shutdown that hangs
    raise typer.Exit(128 + received[0][0] if received else code)


# ------------------------------------------------------------------------------ aitrain env check / eval / report

env_app = typer.Typer(help="Work on an environment before training on it.", no_args_is_help=True, rich_markup_mode=None)
app.add_typer(env_app, name="env")

def env_check(**options) -> None:
    """Check an environment: dataset, prompts, tools, and episodes under the oracle, empty and model policies.

    Exits 1 when the environment breaks its contract, 0 otherwise (warnings included)."""
    with reported_errors(options.pop("debug")):
        module, class_name, env_config = environment_of(options["rl_env"], options["rl_env_module"],
                                                        options["rl_env_class"], options["rl_env_config"],
                                                        options["rl_env_weights"])
        report = run_env_check(
            module=module, class_name=class_name, env_config=env_config,
            model_name=options["model"], episodes=options["episodes"], policies=options["policies"],
            seed=options["seed"], options={name: options[name] for name in CHECK_FLAGS}, console=out,
        )
    for problem in report.problems:
        err.print(f"error: {one_line(problem, limit=10_000)}", markup=False)
    if report.problems:
        raise typer.Exit(1)
    out.print(f"env check passed with {len(report.warnings)} warning(s)", markup=False)


env_check.__signature__ = inspect.Signature([
    as_in_grpo("rl_env_module"),
    as_in_grpo("rl_env_class"),
    as_in_grpo("rl_env_config"),
    as_in_grpo("rl_env"),
    as_in_grpo("rl_env_weights"),
    as_in_grpo("model", help_text="Model whose chat template renders the prompts and that plays the 'model' policy."),
    command_option("episodes", 16, "Episodes per policy.", int),
    command_option("policies", ",".join(POLICIES), f"Which of {', '.join(POLICIES)} to play.", str),
    *[as_in_grpo(name) for name in CHECK_FLAGS],  # the episode flags, as grpo has them
    field_option("seed", 0, with_default("Seed for picking rows and sampling.", 0)),
    as_in_grpo("debug"),
])
env_app.command("check")(env_check)


def eval_command(**options) -> None:
    """Evaluate a model (or a training run) in an environment: mean score, success rate, pass@k, turns, errors."""
    with reported_errors(options.pop("debug")):
        run_eval(model=options["model"], baseline=options["baseline"], spec=options["rl_env"],
                 weights=options["rl_env_weights"],
                 module=options["rl_env_module"], class_name=options["rl_env_class"], env_config=options["rl_env_config"],
                 episodes=options["episodes"],
                 samples=options["rl_num_generations"], use_vllm=options["use_vllm"], output=options["output"],
                 options={name: options[name] for name in RUN_FLAGS}, seed=options["seed"],
                 batch_size=options["batch_size"], console=out, checkpoints=options["checkpoints"])


eval_command.__signature__ = inspect.Signature([
    as_in_grpo("model", help_text="Model to evaluate: 'tiny', a model path or id, or a training output directory."),
    from_training_run("rl_env_module"),
    from_training_run("rl_env_class"),
    as_in_grpo("rl_env_config"),
    from_training_run("rl_env"),
    from_training_run("rl_env_weights"),
    command_option("episodes", 32, "Tasks to play: the first N rows of the dataset.", int),
    field_option("rl_num_generations", 1, with_default("Episodes per task (k of pass@k).", 1)),
    command_option("baseline", None, "A second model to compare against, on the same tasks and seed.", str),
    command_option("checkpoints", None, "With a training run's folder as --model: play its checkpoints ('all', "
                                        "'last', or steps such as 10,20) and its start (or --baseline) on the same "
                                        "tasks, one row each, and name the best.", str),
    command_option("output", None, "Write one JSON line per episode here (messages, score, turns, error).", str),
    field_option("use_vllm", False, "Generate with vLLM instead of Hugging Face generate (the default here: a short "
                                    "evaluation does not pay vLLM's 20-50 s start)."),
    *[from_training_run(name) for name in RUN_FLAGS],
    field_option("batch_size", 32, with_default("Episodes generated together.", 32)),
    field_option("seed", 0, with_default("Sampling seed (both models use it).", 0)),
    as_in_grpo("debug"),
])
app.command("eval")(eval_command)


def sft_command(**options) -> None:
    """Warm a model up on the environment's oracle (solve): play it, keep the good episodes, fine-tune (SFT)."""
    with reported_errors(options.pop("debug")):
        run_sft(options, console=out)


sft_command.__signature__ = SFT_SIGNATURE
app.command("sft")(sft_command)


@app.command("report")
def report_command(
    output_dir: str = typer.Argument(..., help="A training output directory (it holds metrics.jsonl)."),
    output: Optional[str] = typer.Option(None, "--output", help="Where to write the page (default: OUTPUT_DIR/report.html)."),
) -> None:
    """Write report.html for a training run: reward curve, score distribution, turns, errors, transcripts."""
    if not Path(output_dir).is_dir():
        fail(f"{output_dir} is not a directory; pass a training output directory (e.g. outputs/hotelenv)")
    if not (Path(output_dir) / METRICS_FILE).is_file():
        fail(f"{output_dir} has no metrics.jsonl; pass the --output-dir of a training run that has logged a step")
    if not any(isinstance(r.get("step"), int) for r in read_jsonl(Path(output_dir) / METRICS_FILE)):
        fail(f"{output_dir}/metrics.jsonl holds no step's record (empty, or not a run's metrics); pass the --output-dir "
             f"of a training run that has logged a step")
    with reported_errors(False):
        if output is not None:  # a page may replace our page; never a folder, '.', or another file
            check_file_output(output, flag="--output", suffixes=(".html", ".htm"), written_by=is_report_page,
                              kind="a page `aitrain report` wrote")
        out.print(f"report written to {write_report(output_dir, output)}", markup=False)


def export_command(**options) -> None:
    """Make a standalone model from a training output: merge its LoRA adapter, save, check it, optionally upload."""
    with reported_errors(options.pop("debug")):
        run_export(options, console=out)


export_command.__signature__ = EXPORT_SIGNATURE
app.command("export")(export_command)


@app.command("init")
def init_command(
    name: str = typer.Argument(..., help="Name of the environment: a Python identifier, e.g. my_task (module envs.my_task, class MyTaskEnv)."),
    directory: str = typer.Option(".", "--dir", help="Project folder to write envs/ and tests/ into."),
) -> None:
    """Write a small multi-turn environment (envs/NAME.py) and its test (tests/test_NAME.py), ready to edit."""
    with reported_errors(False):
        scaffold = write_scaffold(name, directory)  # scaffold.py; refuses to overwrite
    print_next_steps(scaffold, directory, out)


# ------------------------------------------------------------------------------ aitrain tiny-model


@app.command("tiny-model")
def tiny_model(
    output_dir: str = typer.Argument(..., help="Directory to write the model and tokenizer to (a new or empty one)."),
    seed: int = typer.Option(0, help="Seed of the build (same seed, same weights): 0 to 4294967295."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace OUTPUT_DIR when it holds a tiny model built before."),
) -> None:
    """Build the tiny local model (Llama architecture, byte-level BPE, ChatML template with tools)."""
    with reported_errors(False):
        check_seed(seed)  # before the folder is looked at or anything is built
    replaced = replaced_contents(output_dir, overwrite)
    with reported_errors(False):
        path = build_tiny_model(output_dir, seed=seed, overwrite=overwrite)
    if replaced:
        out.print(f"replaced {output_dir}: removed {replaced}", markup=False)
    out.print(f"tiny model written to {path}; train it with: aitrain grpo --model {path} --rl-env-module envs.hotel --rl-env-class HotelEnv")


def main() -> None:  # pragma: no cover - console entry point
    app()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
