"""Checks before a run's first step: options against the environment and model, prompt lengths, memory, a dataset smaller than a step."""
