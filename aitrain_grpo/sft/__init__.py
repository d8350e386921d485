"""`aitrain sft`: the warm start, supervised fine-tuning on an environment's oracle episodes: playing the
oracle and keeping the good episodes (`oracle`), then training on them (`trainer`), tokenized exactly as
the rollout engine tokenizes (engine/demos.py)."""
