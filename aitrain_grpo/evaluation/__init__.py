"""Playing a model on an environment without training: `evaluate` (the library behind `aitrain eval`)."""
