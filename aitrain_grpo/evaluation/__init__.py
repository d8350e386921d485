"""Playing a model on an environment without training: `evaluate` (the library behind `aitrain eval`) and
`envcheck` (behind `aitrain env check`: the oracle, an empty policy and the model compared; an agent
environment's requests read in `envcheck_agent`)."""
