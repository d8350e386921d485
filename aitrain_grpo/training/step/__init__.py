"""The step: a step's episodes as typed sequence records, and the one function that turns them into TRL's loss inputs (flow.py)."""
