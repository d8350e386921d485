"""The rollout side of the step: playing a step's episodes (groups, curriculum, async steps) and keeping the generator's weights in sync."""
