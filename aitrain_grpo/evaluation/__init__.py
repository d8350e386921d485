"""Playing a model on an environment without training: `evaluate` (the library behind `aitrain eval`) and
`envcheck` (behind `aitrain env check`: the oracle, an empty policy and the model compared; an agent
environment's requests read in `envcheck_agent`); and the same `evaluate` during training, on held-back
tasks (`held_back`, `held_back_play`), with the best held-back weights kept (`best_checkpoint`)."""
