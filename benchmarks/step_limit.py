"""How close a training step comes to this machine's limit: real `aitrain` steps (the package's own
trainer), then, in the same process and on the same model, the last step's work done bare
(bare_step.py), and per phase the ratio step / bare.

    OMP_NUM_THREADS=1 python benchmarks/step_limit.py                      # tiny model, seconds
    OMP_NUM_THREADS=1 python benchmarks/step_limit.py --model smollm2 --env envs.rewrite:RewriteEnv \\
        --record benchmarks/STEP_LIMIT.md --label before
    OMP_NUM_THREADS=1 python benchmarks/step_limit.py --model smollm2 --env envs.stations:StationEnv \\
        --batch-size 16 --record benchmarks/STEP_LIMIT.md --label before

The phases are the step's `time/*` metrics (training/step/phases.py), read from the run's
metrics.jsonl and timed, like the bare parts, by this process's CPU time (`--clock cpu`, the default:
on a machine shared with other jobs wall time mostly measures the neighbours; `--clock wall` for an
idle machine, which also shows the rollout's generate and environment time): the rollout against bare generation of the same number of tokens (Hugging Face
`generate`, and vLLM where installed: the faster counts), the reference forward, the loss forward and
backward, the optimizer step; TRL's scoring has no bare counterpart and counts as overhead. The
figure of issue 33 is `step / bare`; `training / bare` leaves the rollout out.

Keep runs short on a real model (`--steps 2`: the first warms up, the last is compared); the bare work
replays the last step's episodes once. Timings on a shared machine move by 10 % or more between runs,
which is why the step and its bare work run back to back in one process.

Left out: a generation engine in its own process (a vLLM server), evaluation, checkpoints, and any
assertion on the figures (tests/test_step_limit.py only checks that the profile runs and prints).
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")  # before torch: two threads on two shared cores are slower
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")  # vLLM on the one thread the rest gets

import argparse
import contextlib
import importlib.util
import io
import json
import shlex
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from aitrain_grpo.config import RunConfig
from aitrain_grpo.models.loading import resolve_model
from aitrain_grpo.training.trainer import build_trainer

import bare_step as bare_parts
from bare_step import build_vllm, bare_step

PHASES = ("rollout", "score", "ref_logprobs", "loss_forward_backward", "optimizer_step")


def run_steps(config: RunConfig, clock) -> tuple[Any, list[dict[str, Any]], float]:
    """Train `config.max_steps` steps with the package's trainer, its step phases timed by `clock`; the
    trainer, its metrics records and the wall time of `trainer.train()`."""
    trainer = build_trainer(config)
    trainer.run.timing.clock.clock = clock
    started = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()):
        trainer.train()
    wall = time.perf_counter() - started
    trainer.rollout.close()
    records = [json.loads(line) for line in (trainer.plan.output_dir / "metrics.jsonl").read_text().splitlines()]
    return trainer, records, wall


def compare(step: dict[str, float], bare: dict[str, Any], wall: bool) -> list[tuple[str, float, float | None]]:
    """(phase, step seconds, bare seconds) per phase, then the training part and the whole step."""
    gens = [bare[k]["seconds"] for k in ("generate_hf", "generate_vllm") if k in bare]
    bare_of = {"rollout": min(gens), "score": None, "ref_logprobs": bare["ref_forward"],
               "loss_forward_backward": bare["forward_backward"], "optimizer_step": bare["optimizer_step"]}
    rows = [(phase, step[f"time/{phase}_s"], bare_of[phase]) for phase in PHASES]
    if wall:  # inside the rollout: wall time while a generate call (an environment call) was under way
        rows[1:1] = [("rollout: generate", step["time/generate_s"], bare_of["rollout"]),
                     ("rollout: environment", step["time/env_s"], None)]
    training = sum(step[f"time/{p}_s"] for p in PHASES if p != "rollout")
    bare_training = sum(v for p, v in bare_of.items() if p != "rollout" and v is not None)
    rows.append(("training (all but the rollout)", training, bare_training))
    rows.append(("step", step["time/step_s"], bare_training + bare_of["rollout"]))
    return rows


def ratio(a: float, b: float | None) -> str:
    return f"{a / b:.2f}x" if b else "-"


def table(rows, bare: dict[str, Any], unit: str = "s") -> str:
    lines = [f"| phase | step {unit} | bare {unit} | step / bare |", "| --- | ---: | ---: | ---: |"]
    for name, s, b in rows:
        lines.append(f"| {name} | {s:.2f} | {'-' if b is None else f'{b:.2f}'} | {ratio(s, b)} |")
    gen = ", ".join(f"{k[9:]} {v['seconds']:.2f} {unit} ({v['tokens']} tokens)" for k, v in bare.items()
                    if k.startswith("generate_"))
    if "lockstep_hf" in bare:
        gen += (f"; hf with every turn as long as its longest episode's (lockstep's stragglers) "
                f"{bare['lockstep_hf']['seconds']:.2f} {unit} ({bare['lockstep_hf']['tokens']} tokens)")
    shape = bare["shape"]
    lines.append("")
    lines.append(f"Bare generation: {gen}{'; ' + bare['vllm_error'] if 'vllm_error' in bare else ''}. "
                 f"The step trained {shape['sequences']} sequences, {shape['tokens']} tokens "
                 f"({shape['prompt_share']:.0%} prompt, {shape['sampled_tokens']} sampled), in "
                 f"{shape['micro_batches']} micro-batches ({shape['padding_share']:.0%} of the bare passes' "
                 f"positions are padding; TRL's left padding of the prompts to the batch's longest adds "
                 f"{shape['prompt_padding']:.0%} of the tokens); torch ran {bare['torch_threads']} thread(s).")
    return "\n".join(lines)


def profile(args) -> dict[str, Any]:
    module, _, cls = args.env.partition(":")
    fields: dict[str, Any] = dict(
        model=args.model, rl_env_module=module, rl_env_class=cls, rl_env_config=args.env_config,
        max_steps=args.steps, batch_size=args.batch_size or RunConfig().batch_size, seed=args.seed,
        output_dir=str(Path(args.workdir) / "run"), overwrite=True,
    )
    for item in args.set:
        key, _, value = item.partition("=")
        default = getattr(RunConfig(), key)
        if isinstance(default, bool):
            fields[key] = value.lower() in ("1", "true", "yes")
        else:
            fields[key] = type(default)(value) if default is not None else value
    config = RunConfig(**fields)
    clock = time.process_time if args.clock == "cpu" else time.perf_counter
    bare_parts.now = clock
    trainer, records, wall = run_steps(config, clock)
    step = records[-1]
    traces = trainer.rollout.last_batch.traces
    temperature, beta = float(trainer.temperature), float(trainer.beta)
    make_llm = None
    if args.vllm == "on" or (args.vllm == "auto" and importlib.util.find_spec("vllm") is not None):
        make_llm = lambda: build_vllm(resolve_model(config.model))  # noqa: E731
    bare = bare_step(trainer.model, trainer.processing_class, trainer.optimizer, traces,
                     micro=trainer.args.per_device_train_batch_size, temperature=temperature, beta=beta,
                     make_llm=make_llm, lockstep=args.lockstep)
    rows = compare(step, bare, wall=args.clock == "wall")
    return {"config": {k: v for k, v in fields.items() if k not in ("output_dir", "overwrite")}, "step": step,
            "bare": bare, "rows": rows, "wall": wall, "records": len(records),
            "unit": "CPU s" if args.clock == "cpu" else "wall s",
            "settings": f"generation {'vLLM' if config.use_vllm else 'hf'}, shared-prefix loss "
                        f"{trainer.run.config.shared_prefix_loss}, micro-batch {trainer.args.per_device_train_batch_size}"}


def record(path: Path, label: str, command: str, result: dict[str, Any]) -> None:
    step_ratio = next(s / b for name, s, b in result["rows"] if name == "step")
    text = (f"\n## {label}: {result['config']['model']} on {result['config']['rl_env_module']}, batch "
            f"{result['config']['batch_size']} ({time.strftime('%Y-%m-%d')})\n\n```bash\n{command}\n```\n\n"
            f"Step {result['records']} of {result['records']} ({result['settings']}) against its bare work: "
            f"**{step_ratio:.2f}x**.\n\n"
            f"{table(result['rows'], result['bare'], result['unit'])}\n")
    with path.open("a") as f:
        f.write(text)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="tiny", help="tiny, smollm2, or a model folder")
    parser.add_argument("--env", default="envs.letters:LetterEnv", help="module:Class of the environment")
    parser.add_argument("--env-config", default=None, help="the environment's keyword arguments, as JSON")
    parser.add_argument("--batch-size", type=int, default=None, help="episodes per step (default: aitrain's)")
    parser.add_argument("--steps", type=int, default=2, help="training steps; the last is compared (default 2)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                        help="another RunConfig field, e.g. --set rl_max_new_tokens=16")
    parser.add_argument("--vllm", choices=("auto", "on", "off"), default="auto",
                        help="also time vLLM-CPU generation (auto: when vllm is importable)")
    parser.add_argument("--lockstep", action="store_true",
                        help="also time HF generation with each turn as long as its longest episode's")
    parser.add_argument("--clock", choices=("cpu", "wall"), default="cpu",
                        help="time the step's phases and the bare parts by this process's CPU time (default: "
                             "other jobs on a shared machine barely move it) or by wall time")
    parser.add_argument("--record", type=Path, default=None, help="append the result to this markdown file")
    parser.add_argument("--label", default="run", help="the recorded section's title, e.g. before or after")
    args = parser.parse_args(argv)
    torch.manual_seed(args.seed)
    with tempfile.TemporaryDirectory() as workdir:
        args.workdir = workdir
        result = profile(args)
    print(f"aitrain: {result['settings']}")
    print(table(result["rows"], result["bare"], result["unit"]))
    step_ratio = next(s / b for name, s, b in result["rows"] if name == "step")
    training_ratio = next(s / b for name, s, b in result["rows"] if name.startswith("training"))
    print(f"ratio step / bare: {step_ratio:.2f}x (training part: {training_ratio:.2f}x)")
    if args.record is not None:
        command = "OMP_NUM_THREADS=1 python benchmarks/step_limit.py " + " ".join(
            shlex.quote(a) for a in (argv if argv is not None else sys.argv[1:]) if a)
        record(args.record, args.label, command, result)


if __name__ == "__main__":
    main()
