"""Environments written for other trainers, wrapped into the `Environment` contract.

Each adapter recognises its kind of class and wraps an instance; nothing outside `env/` needs to know
which kind it runs. `aitraining` wraps AITraining's `score_episode(model, tokenizer, completion, case_idx)`.
"""
