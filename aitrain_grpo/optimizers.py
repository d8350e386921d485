"""The optimizer a run trains with: transformers' optimizer names, Adam's constants, and a check before
anything loads.

`--optim` takes transformers' `optim` names as they are (`adamw_torch_fused`, TRL's default; `sgd`;
`adamw_8bit` from bitsandbytes; `schedule_free_adamw`; ...), so a TRL or axolotl config's value works
unchanged, and `--adam-beta1/--adam-beta2/--adam-epsilon` Adam's constants (transformers' names too). Each
option left unset keeps transformers' default, which stays the one source of it.

Why a check: transformers imports an optimizer's package when the trainer builds its optimizer, after the
model has loaded and the output folder has been written; a missing `bitsandbytes` then ended a run in a
traceback. `check_optimizer` asks transformers itself (`Trainer.get_optimizer_cls_and_kwargs`, which
imports the package and names it when missing) while the options are validated, so the refusal is one
line and comes first, in transformers' own words.

Left out: optimizers that need the model to choose their parameters (GaLore, APOLLO: transformers'
`optim_target_modules`) are refused with transformers' message; `optim_args` strings.
"""

from __future__ import annotations

import tempfile
import warnings
from typing import Any

from aitrain_grpo.errors import ConfigError, one_line

# RunConfig field -> transformers' TrainingArguments field (the same names: one list, so the check and the
# run hand transformers the same arguments).
OPTIMIZER_FIELDS = ("optim", "adam_beta1", "adam_beta2", "adam_epsilon")


def optimizer_arguments(values: Any) -> dict[str, Any]:
    """The optimizer arguments of a RunConfig (`values`: anything with its fields as attributes) for
    transformers' TrainingArguments: only those given, so that the rest keep transformers' defaults."""
    return {name: getattr(values, name) for name in OPTIMIZER_FIELDS if getattr(values, name) is not None}


def optimizer_keywords(values: Any) -> dict[str, Any] | None:
    """The keyword arguments transformers builds the named optimizer with (None when no `--optim` is
    given: transformers' default, an AdamW, then takes every Adam option). Raises ConfigError when
    transformers does not know the name or the optimizer's package is not installed."""
    arguments = optimizer_arguments(values)
    if "optim" not in arguments:
        return None
    from transformers import Trainer, TrainingArguments  # seconds to import: only when an optimizer is named
    from transformers.training_args import OptimizerNames

    names = [o.value for o in OptimizerNames]
    if arguments["optim"] not in names:
        raise ConfigError(f"--optim {arguments['optim']!r} is not an optimizer transformers knows; use one of "
                          f"{', '.join(names)}")
    with tempfile.TemporaryDirectory() as folder, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            args = TrainingArguments(output_dir=folder, use_cpu=True, report_to=[], **arguments)
            return Trainer.get_optimizer_cls_and_kwargs(args)[1]
        except (ImportError, ValueError) as exc:
            raise ConfigError(f"--optim {arguments['optim']} cannot be built here: {one_line(exc)}") from None


def check_optimizer(values: Any) -> None:
    """Refuse (ConfigError) an `--optim` transformers does not know or whose package is not installed,
    before a model loads. Does nothing when no optimizer is named (no transformers import)."""
    optimizer_keywords(values)


def unused_adam_options(values: Any) -> list[str]:
    """The Adam options given (as flags) that the named optimizer does not read: transformers hands Adam's
    constants only to the optimizers that take them (not sgd, adagrad, rmsprop, adafactor, ...)."""
    given = [name for name in OPTIMIZER_FIELDS[1:] if getattr(values, name) is not None]
    keywords = optimizer_keywords(values) if given else None
    if keywords is None:
        return []
    read = {"adam_beta1": "betas", "adam_beta2": "betas", "adam_epsilon": "eps"}
    return ["--" + name.replace("_", "-") for name in given if read[name] not in keywords]
