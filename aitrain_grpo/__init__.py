"""aitrain-grpo: train language-model agents with GRPO in environments you write.

Public API: `Environment`, `ToolEnvironment`, `tool`, `AgentEnvironment` and `AgentResult` (an
environment written as agent code on an OpenAI client), `Episode` and the types that cross the contract
(`Message`, `ToolCall`, `EnvReply`), `MCPTools` (an MCP server's tools for a `ToolEnvironment`), `load_environment` (import an environment class by module path with
JSON keyword arguments), `RunConfig` and `train` (a training run, as `aitrain grpo` does it), and the
errors a caller may catch: `UserError` (bad input, with a one-line message; `EnvLoadError` and
`ConfigError` are kinds of it) and `TrainingStopped` (a run stopped early with a checkpoint).

Left out: everything else is imported from its layer (`aitrain_grpo.env`, `.engine`, `.training`, ...).
"""

from aitrain_grpo.config import RunConfig
from aitrain_grpo.env.agent import AgentEnvironment, AgentResult
from aitrain_grpo.env.base import Environment, EnvReply, Episode, Message, ToolCall
from aitrain_grpo.errors import ConfigError, UserError
from aitrain_grpo.env.loading import EnvLoadError, load_environment
from aitrain_grpo.env.mcp_tools import MCPTools
from aitrain_grpo.env.tools import ToolEnvironment, tool

__version__ = "0.1.0"

__all__ = [
    "Environment",
    "ToolEnvironment",
    "tool",
    "AgentEnvironment",
    "AgentResult",
    "MCPTools",
    "Episode",
    "Message",
    "ToolCall",
    "EnvReply",
    "load_environment",
    "EnvLoadError",
    "ConfigError",
    "UserError",
    "TrainingStopped",
    "train",
    "RunConfig",
]


def __getattr__(name: str):
    # `train` and `TrainingStopped` pull in torch and TRL; importing them lazily keeps `import aitrain_grpo` and the CLI's
    # error paths fast.
    if name == "train":
        from aitrain_grpo.training.trainer import train_from_python

        return train_from_python
    if name == "TrainingStopped":
        from aitrain_grpo.training.run.stopping import TrainingStopped

        return TrainingStopped
    raise AttributeError(f"module 'aitrain_grpo' has no attribute {name!r}")
