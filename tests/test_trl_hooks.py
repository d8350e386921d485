"""The private TRL methods this package overrides (training/trl/hooks.py) still have the parameters
they were read with: a TRL or transformers upgrade that changes one fails here, naming the method,
instead of mid-run."""

from __future__ import annotations

import inspect

from trl import GRPOTrainer

from aitrain_grpo.training.trainer import EpisodeGRPOTrainer
from aitrain_grpo.training.trl.hooks import PINNED, PINNED_FUNCTIONS, TRLHooks


def test_every_pinned_method_has_the_parameters_it_was_read_with():
    changed = []
    for name, parameters in PINNED.items():
        method = getattr(GRPOTrainer, name, None)
        found = tuple(inspect.signature(method).parameters) if method is not None else None
        if found != parameters:
            changed.append(f"{name}: read with {parameters}, TRL now has {found}")
    assert not changed, "re-read these TRL methods before changing training/trl/hooks.py: " + "; ".join(changed)


def test_the_hooks_are_every_private_override_and_come_first():
    # Each private method the trainer overrides is defined in TRLHooks and pinned, and nowhere else.
    private = {name for cls in EpisodeGRPOTrainer.__mro__ if cls.__module__.startswith("aitrain_grpo")
               for name, value in vars(cls).items()
               if name.startswith("_") and not name.startswith("__") and callable(value) and hasattr(GRPOTrainer, name)}
    assert private == set(PINNED) == {n for n in vars(TRLHooks) if n in PINNED}
    assert EpisodeGRPOTrainer.__mro__[1] is TRLHooks


def test_every_replaced_trl_function_has_the_parameters_and_the_one_use_it_was_read_with():
    import importlib

    for dotted, parameters in PINNED_FUNCTIONS.items():
        module_name, _, name = dotted.rpartition(".")
        module = importlib.import_module(module_name)
        found = getattr(module, name, None)
        assert found is not None and tuple(inspect.signature(found).parameters) == parameters, dotted
    # trl/lm_head.py relies on trl.trainer.utils reading `_use_triton` only to choose the positions it scores.
    source = inspect.getsource(importlib.import_module("trl.trainer.utils"))
    calls = [line.strip() for line in source.splitlines() if "_use_triton(" in line]
    assert calls == ["compact = _use_triton(hidden_states.device)"], calls
