"""Environments written for other trainers and ecosystems, wrapped into the `Environment` contract.

Nothing outside `env/` needs to know which kind it runs. `aitraining` wraps AITraining's
`score_episode(model, tokenizer, completion, case_idx)` (recognised by that signature); the others are
`Environment` classes built from their ecosystem's objects with JSON keyword arguments, named on the
command line by `--rl-env KIND:NAME` (aitrain_grpo/env_spec.py): `trl_factory` (TRL's
`environment_factory` classes), `skyrl` (skyrl-gym's `BaseTextEnv`), `reasoning_gym`, `textarena` and
`openenv` (a running OpenEnv server); `mixture` plays several environments in one run.
Each imports its package only when built; `common` holds what they share (rows, imports, rewards).
"""
