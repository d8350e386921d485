"""Plays episodes token in, token out: chat rendering, the episode runner, the rollout engine and
the generation backends. Knows the environment contract, nothing of TRL's trainer."""
