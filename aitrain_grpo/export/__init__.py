"""`aitrain export`: a trained run as a plain model folder. `merge` merges the LoRA adapter(s) and
writes the folder; `check` compares its log-probabilities with the run's before it is published."""
