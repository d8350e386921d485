"""aitrain-grpo: train language-model agents with GRPO in environments you write.

Public API: `Environment`, `ToolEnvironment`, `tool`, `Episode` (the environment contract),
`load_environment` (import an environment class by module path with JSON keyword arguments),
`RunConfig` and `train` (a training run, as `aitrain grpo` does it).

Left out: everything else is imported from its layer (`aitrain_grpo.env`, `.engine`, `.training`, ...).
"""

from aitrain_grpo.config import RunConfig
from aitrain_grpo.env.base import Environment, Episode
from aitrain_grpo.env.loading import EnvLoadError, load_environment
from aitrain_grpo.env.tools import ToolEnvironment, tool

__version__ = "0.1.0"

__all__ = [
    "Environment",
    "ToolEnvironment",
    "tool",
    "Episode",
    "load_environment",
    "EnvLoadError",
    "train",
    "RunConfig",
]


def __getattr__(name: str):
    # `train` pulls in torch and TRL; importing it lazily keeps `import aitrain_grpo` and the CLI's
    # error paths fast.
    if name == "train":
        from aitrain_grpo.training.trainer import train_from_python

        return train_from_python
    raise AttributeError(f"module 'aitrain_grpo' has no attribute {name!r}")
