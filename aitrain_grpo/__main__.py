"""`python -m aitrain_grpo ...` runs the `aitrain` command (what `accelerate launch -m` needs).

Left out: anything of its own; commands/cli.py is the command line.
"""

from aitrain_grpo.commands.cli import app

app()
