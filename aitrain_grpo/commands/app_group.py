"""The `aitrain` command group: click's own, with an unknown flag that another trainer names (TRL's
`--learning-rate`, `--num-generations`, `--beta`) answered with this package's name for it.

Click refuses an unknown flag while a command parses its arguments, inside the group's `invoke`, and
guesses by spelling (`--learning-rate` -> `--logging-steps`). The group catches that refusal once for
every command, subcommands of `aitrain env` included, and replaces the guess when peer_options.py knows the
name and the command has the flag it names. Left out: other unknown flags keep click's message.

Recent typer releases carry their own copy of click (`typer._click`), whose exceptions are not `click`'s; the
refusal's class is read from the package TyperGroup is built on, so either kind of typer works.
"""

from __future__ import annotations

import importlib
from typing import Any

from typer.core import TyperGroup

from aitrain_grpo.commands.options import flag_name
from aitrain_grpo.peer_options import ours_for, peer_name_hint

_CLICK = TyperGroup.__mro__[1].__module__.rsplit(".", 1)[0]  # "click" or "typer._click"
NoSuchOption = importlib.import_module(f"{_CLICK}.exceptions").NoSuchOption


class AitrainGroup(TyperGroup):
    def invoke(self, ctx: Any):
        try:
            return super().invoke(ctx)
        except NoSuchOption as exc:
            ours = ours_for(exc.option_name)
            flags = {flag for param in getattr(exc.ctx.command, "params", []) for flag in param.opts}
            if ours is None or flag_name(ours) not in flags:  # not a flag of this command either
                raise
            hint = peer_name_hint(exc.option_name, as_flag=True)
            raise NoSuchOption(exc.option_name, message=f"No such option: {exc.option_name} ({hint})",
                                     ctx=exc.ctx) from None
