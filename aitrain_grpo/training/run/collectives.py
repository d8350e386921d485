"""Waits on the other processes of a multi-process run (`accelerate launch`, torchrun), bounded and told in
one line.

Every process of a run meets the others in torch.distributed collectives: the episodes gathered after
each rollout, DDP's gradient all-reduce, the agreement on a signal (run/signals.py), the barriers around a
save. A process that died or stalls leaves the others waiting there, until torch's default (30 minutes
on gloo) and then a long traceback. Here:

- `start_process_group(seconds)` joins the other processes under the bound on a CPU, before transformers
  would (TrainingArguments creates the group without a timeout under `use_cpu`, and accelerate then finds
  it made): a process whose peer never started (a machine of a multi-machine run that failed on its way
  up) waited there 30 minutes, then printed a traceback; now it stops at the bound with one line (a
  rendezvous port another program holds gets its own line);
- `bound_collectives(seconds)` sets `--ddp-timeout` on the run's process group once it exists (after the
  trainer is built, before any training collective): on our own CPU path the group already has it, so this
  covers a group a Python caller created before `train`. transformers hands `ddp_timeout` to the process
  group it creates, except on a CPU (`use_cpu`: TrainingArguments leaves the timeout out there), so the
  bound is set on the gloo group itself: torch's `_set_pg_timeout`, the one private torch name read here,
  gives it the timeout of every later operation. NCCL (a GPU) gets the bound from transformers'
  `ddp_timeout` at the group's creation, its own well-trodden path, and is not touched here;
- `collective_failures(trainer, seconds)` wraps the training and turns a collective that timed out, or
  whose peer is gone (gloo: "Connection closed by peer", "Timed out waiting ...ms"; torch's
  `DistError`s), into `CollectiveFailed`: one line naming the process, the step and its phase, the bound
  and its option, and that another process likely died or hangs; exit 1. No checkpoint is saved (a save
  needs the other processes), and the checkpoints already written stay: the line names the newest.

Left out: NCCL's own watchdog, which on a GPU ends a process whose collective timed out by itself
(TORCH_NCCL_ASYNC_ERROR_HANDLING) before Python sees an error; the bound still holds there, the one
line does not (untested here: no GPU); a GPU run's process group is transformers' (ddp_timeout bounds its
start too, with its own error). The launcher's own rendezvous of its agents (torchrun's, before any
worker starts) keeps its own timeouts. A single process has no collective: nothing here does anything then.
"""

from __future__ import annotations

import contextlib
import os
from datetime import timedelta
from pathlib import Path
from typing import Iterator

import torch
import torch.distributed as dist

from aitrain_grpo.errors import UserError, one_line
from aitrain_grpo.runlog.step_timing import StepTiming
from aitrain_grpo.training.run.checkpoints import complete_checkpoints
from aitrain_grpo.training.run.stopping import EXIT_FAULT, TrainingStopped

OPTION = "--ddp-timeout"
# What gloo says when the process at the other end is gone (its errors are plain RuntimeErrors whose
# text names gloo's source file).
_GLOO = "/gloo/"
_TIMED_OUT = ("timed out", "timeout")


def several_processes() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def start_process_group(seconds: float) -> None:
    """Create the run's gloo process group with the bound, where transformers would create it unbounded
    (see the module docstring): more than one process (WORLD_SIZE), no CUDA, no DeepSpeed (its own group),
    and no group yet. A peer that does not join within `seconds` is `StartFailed`, one line."""
    world = int(os.environ.get("WORLD_SIZE", "1") or 1)
    if (world <= 1 or not dist.is_available() or dist.is_initialized() or torch.cuda.is_available()
            or os.environ.get("ACCELERATE_USE_DEEPSPEED", "false").lower() == "true"):
        return
    try:
        dist.init_process_group(backend="gloo", timeout=timedelta(seconds=seconds))
    except (dist.DistError, RuntimeError) as exc:
        if "address already in use" in str(exc).lower():  # rank 0 hosts the rendezvous on MASTER_PORT
            raise StartFailed(
                f"process {os.environ.get('RANK', '?')} of {world} could not open the rendezvous port "
                f"{os.environ.get('MASTER_ADDR', '?')}:{os.environ.get('MASTER_PORT', '?')}: another program "
                f"holds it; launch again with another port (accelerate launch --main_process_port, torchrun "
                f"--master_port)") from None
        raise StartFailed(
            f"process {os.environ.get('RANK', '?')} of {world} waited {seconds:g}s for the other processes to start "
            f"and gave up ({OPTION} {seconds:g}): another process likely failed on its way up or was never started; "
            f"look at its output ({one_line(str(exc), 160)})") from None


class StartFailed(UserError):
    """The other processes did not join within the bound: one line, exit 1, nothing trained yet."""

    exit_code = EXIT_FAULT


def bound_collectives(seconds: float) -> None:
    """Give every later collective of the run's process group at most `seconds` (see the module docstring)."""
    if several_processes() and dist.get_backend() == "gloo" and hasattr(dist.distributed_c10d, "_set_pg_timeout"):
        dist.distributed_c10d._set_pg_timeout(timedelta(seconds=seconds))


class CollectiveFailed(TrainingStopped):
    """A collective timed out or lost its peer: one line, exit 1, no checkpoint saved now."""

    def lines(self, argv: list[str] | None = None) -> list[str]:
        return [f"error: {self.reason}"]


def failure_kind(exc: BaseException) -> str | None:
    """"timed out" or "lost" when `exc` (or an exception it was raised from) is a collective's failure in a
    run of several processes, else None."""
    if not several_processes():
        return None
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        text = str(current)
        if isinstance(current, dist.DistError) or isinstance(current, RuntimeError) and _GLOO in text:
            return "timed out" if any(word in text.lower() for word in _TIMED_OUT) else "lost"
        current = current.__cause__ or current.__context__
    return None


def where(trainer) -> str:
    """The step and its phase (training/step/phases.py) the process was in, as far as known."""
    step = trainer.state.global_step
    clock = next((cb.clock for cb in trainer.callback_handler.callbacks if isinstance(cb, StepTiming)), None)
    phase = getattr(clock, "current", None)
    if phase is None:
        return f"after step {step} (logging or saving)" if step else "before step 1"
    return f"in step {step + 1} (phase {phase})"


def failure_line(kind: str, *, rank: int, world: int, place: str, seconds: float, output_dir: Path) -> str:
    """The one line a process prints when a collective failed; see the module docstring."""
    if kind == "timed out":
        what = (f"process {rank} of {world} waited {seconds:g}s for the other processes in a collective {place} "
                f"and gave up ({OPTION} {seconds:g}); another process likely died or hangs: look at its output")
    else:
        what = (f"process {rank} of {world} lost the other processes in a collective {place}: the connection "
                f"closed ({OPTION} {seconds:g} bounds the wait for one that hangs); another process likely died: "
                f"look at its output")
    written = complete_checkpoints(output_dir)
    kept = (f"the checkpoints written stay (newest: {written[-1]}); resume with --resume-from-checkpoint auto"
            if written else "no checkpoint had been written")
    return f"{what}; {kept}"


@contextlib.contextmanager
def collective_failures(trainer, seconds: float) -> Iterator[None]:
    """Turn a collective's timeout or lost peer inside the block into `CollectiveFailed`."""
    try:
        yield
    except Exception as exc:
        kind = failure_kind(exc)
        if kind is None:
            raise
        line = failure_line(kind, rank=dist.get_rank(), world=dist.get_world_size(), place=where(trainer),
                            seconds=seconds, output_dir=Path(trainer.args.output_dir))
        raise CollectiveFailed(line, EXIT_FAULT, None) from exc
