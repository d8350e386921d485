"""The run's life: its plan, context, output folder and lock, checkpoints, signals, early stops and waits on the other processes."""
