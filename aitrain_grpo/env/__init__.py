"""The environment author's contract: what a user writes, with no notion of tokens or TRL.

`base` holds `Environment` and `Episode` (and `EpisodeLog`, what the engine records about one); `tools` the `@tool` decorator, tool schemas and
`ToolEnvironment`; `agent` the `AgentEnvironment` whose episodes are agent code on an OpenAI client; `loading` imports a user's class; `dataset` checks the rows it builds.

Left out: playing episodes (engine/), which is where tokens, budgets and timeouts live.
"""

from aitrain_grpo.env.agent import AgentEnvironment, AgentResult
from aitrain_grpo.env.base import Environment, Episode, Message, ToolCall
from aitrain_grpo.env.tools import ToolEnvironment, tool

__all__ = ["AgentEnvironment", "AgentResult", "Environment", "Episode", "Message", "ToolCall", "ToolEnvironment", "tool"]
