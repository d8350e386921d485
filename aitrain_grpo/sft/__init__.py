"""`aitrain sft`: the warm start, supervised fine-tuning on an environment's oracle episodes
(`trainer`), tokenized exactly as the rollout engine tokenizes (engine/demos.py)."""
