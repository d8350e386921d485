"""Warnings the command line silences: each one that every command printed and that no user can act on,
matched by its exact text so that any other warning of the same kind still shows.

- transformers 5.23 renamed `is_gradient_checkpointing` to `is_activation_checkpointing` (and the
  `gradient_checkpointing_enable/_disable` methods) and warns (FutureWarning) on every use of the old
  names; peft, HF Trainer and TRL still use them while a model loads or trains (TRL's scoring passes
  switch checkpointing off and on each step under --activation-checkpointing), so every command printed it.

Imported by commands/cli.py for its effect; a Python caller of the library keeps its own warning settings,
but for the checkpointing one, which training/trainer.py silences too (`aitrain_grpo.train`).

Left out: warnings of training itself, silenced where the trainer is set up (training/trl/hf_args.py: DDP's
unused-parameters note; training/trainer.py: peft's vocabulary note).
"""

from __future__ import annotations

import warnings

warnings.filterwarnings("ignore", message="`(is_)?gradient_checkpointing(_enable|_disable)?` is deprecated",
                        category=FutureWarning)
