"""Warnings the command line silences: each one that every command printed and that no user can act on,
matched by its exact text so that any other warning of the same kind still shows.

- transformers 5.23 renamed `is_gradient_checkpointing` to `is_activation_checkpointing` and warns
  (FutureWarning) on every read of the old name; peft and HF Trainer still read it while a model loads or
  trains, so every command printed it.

Imported by commands/cli.py for its effect; a Python caller of the library keeps its own warning settings,
but for the checkpointing one, which training/trainer.py silences too (`aitrain_grpo.train`).

Left out: warnings of training itself, silenced where the trainer is set up (training/trl/hf_args.py: DDP's
unused-parameters note; training/trainer.py: peft's vocabulary note).
"""

from __future__ import annotations

import warnings

warnings.filterwarnings("ignore", message="`is_gradient_checkpointing` is deprecated", category=FutureWarning)
