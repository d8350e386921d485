"""What changes a run: the TRL trainer wiring, the generation plan, weight sync, checkpoints and
early stops."""
