"""`python -m aitrain_grpo ...` runs the `aitrain` command (what `accelerate launch -m` needs)."""

from aitrain_grpo.commands.cli import app

app()
