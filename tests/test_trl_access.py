"""The private TRL and transformers names this package reads, calls or sets without overriding them
(training/trl/access.py) still exist in the installed TRL (1.16.0) and transformers, and nothing else in the
package touches them: an upgrade that renames one fails here, naming it, instead of mid-run. The
overrides themselves are pinned by tests/test_trl_hooks.py."""

from __future__ import annotations

import ast
import importlib
import inspect
import re
from types import SimpleNamespace

import pytest
from trl import GRPOTrainer

from helpers import REPO
from aitrain_grpo.training.trl import access as trl_access
from aitrain_grpo.training.trl.access import (PINNED_ATTRIBUTES, PINNED_FUNCTIONS, PINNED_METHODS, PINNED_SAMPLER,
                                              PINNED_VLLM_GENERATION, RepeatSampler)

# The modules allowed to touch TRL's private names: the accessors and the overrides.
ALLOWED = {"aitrain_grpo/training/trl/access.py", "aitrain_grpo/training/trl/hooks.py"}
# Guarded names: every pinned private one, and the public-looking trainer attributes TRL does not document.
GUARDED = {name for name in [*PINNED_METHODS, *PINNED_ATTRIBUTES] if name.startswith("_")} | {"vllm_generation", "model_wrapped"}


def assigned_in(classes, name: str) -> bool:
    """Whether the source of one of `classes` assigns `self.<name>` (alone or in a tuple)."""
    pattern = re.compile(rf"self\.{re.escape(name)}\b[^=\n(]*=(?!=)")
    return any(pattern.search(inspect.getsource(cls)) for cls in classes)


def trl_classes():
    return [cls for cls in GRPOTrainer.__mro__ if cls.__module__.split(".")[0] in ("trl", "transformers")]


def test_every_called_method_has_the_parameters_it_was_read_with():
    changed = []
    for name, parameters in PINNED_METHODS.items():
        method = getattr(GRPOTrainer, name, None)
        found = tuple(inspect.signature(method).parameters) if method is not None else None
        if found != parameters:
            changed.append(f"{name}: read with {parameters}, now {found}")
    assert not changed, "re-read these methods before changing training/trl/access.py: " + "; ".join(changed)


def test_every_read_attribute_is_one_trl_or_transformers_assigns():
    missing = [name for name in PINNED_ATTRIBUTES if not assigned_in(trl_classes(), name)]
    assert not missing, f"TRL's trainer no longer sets {missing}: re-read it before changing training/trl/access.py"
    from trl.generation.vllm_generation import VLLMGeneration

    missing = [name for name in PINNED_VLLM_GENERATION if not assigned_in([VLLMGeneration], name)]
    assert not missing, f"TRL's VLLMGeneration no longer sets {missing}"


def test_the_pattern_finds_assignments_only():
    class Probe:
        def __init__(self):
            self.a = 1
            self.b, _ = 2, 3
            if self.c == 4:
                self.d(5)

    assert [assigned_in([Probe], n) for n in "abcd"] == [True, True, False, False]


def test_trls_loss_reads_the_batch_the_way_the_step_relies_on():
    # use_importance_sampling (trl/hooks.py): TRL's loss applies the weights only with use_vllm on; the loss-pass
    # weights (step/loss.py) are written into the micro-batch after its log-probabilities are computed
    # and before the loss reads them; a batch without old log-probabilities uses the pass's own, detached.
    loss = inspect.getsource(GRPOTrainer._compute_loss)
    assert "if self.use_vllm and self.vllm_importance_sampling_correction" in loss
    forward = loss.index("self._get_per_token_logps_and_entropies(")
    assert loss.index('inputs["importance_sampling_ratio"]') > forward
    assert "per_token_logps.detach() if old_per_token_logps is None else old_per_token_logps" in loss
    assert "advantages.dim() == 1" in loss  # (rows, tokens) advantages pass through as they are (step/batch.py)


def test_every_called_trl_function_takes_the_arguments_passed():
    for dotted, parameters in PINNED_FUNCTIONS.items():
        module_name, _, name = dotted.rpartition(".")
        found = getattr(importlib.import_module(module_name), name, None)
        assert found is not None, dotted
        assert tuple(inspect.signature(found).parameters)[:len(parameters)] == parameters, dotted


def test_the_repeat_sampler_has_what_the_resumable_one_reads():
    sampler = RepeatSampler(list(range(6)), mini_repeat_count=2, batch_size=3, shuffle=True, seed=0)
    assert all(hasattr(sampler, name) for name in PINNED_SAMPLER)
    # ResumableRepeatSampler replays the epochs before this one by drawing the same permutation.
    assert "torch.randperm(self.num_samples, generator=self.generator)" in inspect.getsource(RepeatSampler.__iter__)


def private_touches(path, root=REPO) -> list[str]:
    """Each use of a guarded name in a module: an attribute (`x._step`) or a string (`getattr(x, "_step")`)."""
    found = []
    where = path.relative_to(root)
    for node in ast.walk(ast.parse(path.read_text())):
        name = node.attr if isinstance(node, ast.Attribute) else \
            node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None
        if name in GUARDED:
            found.append(f"{where}:{node.lineno} {name}")
        elif isinstance(node, (ast.Assign, ast.AugAssign)):  # use_vllm is also a RunConfig field: only setting it
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            found += [f"{where}:{node.lineno} use_vllm set" for t in targets
                      if isinstance(t, ast.Attribute) and t.attr == "use_vllm"]
    return found


def test_only_the_accessors_and_the_hooks_touch_trls_private_names():
    offenders = [hit for path in sorted((REPO / "aitrain_grpo").rglob("*.py"))
                 if str(path.relative_to(REPO)) not in ALLOWED for hit in private_touches(path)]
    assert not offenders, f"go through training/trl/access.py (and pin the name there): {offenders}"


def test_the_scan_sees_each_kind_of_touch(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text("a = t._save_checkpoint\nb = getattr(t, 'model_wrapped', None)\nt.use_vllm = True\nc = config.use_vllm\n")
    assert sorted(hit.split(" ", 1)[1] for hit in private_touches(probe, tmp_path)) == ["_save_checkpoint", "model_wrapped", "use_vllm set"]


def test_no_engine_function_takes_a_trainer():
    """The engine is handed plain objects (trl_access.generation_handles), so it never needs TRL's trainer."""
    offenders = []
    for path in sorted((REPO / "aitrain_grpo" / "engine").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                arguments = node.args.args + node.args.kwonlyargs + node.args.posonlyargs
                offenders += [f"{path.relative_to(REPO)}:{node.lineno} {node.name}" for a in arguments if a.arg == "trainer"]
    assert not offenders, offenders


def test_the_handles_are_plain_objects_taken_from_the_trainer():
    llm, group = object(), object()
    trainer = SimpleNamespace(vllm_generation=SimpleNamespace(llm=llm, tp_group=group, tensor_parallel_size=2))
    assert trl_access.generation_handles(trainer, "vllm_colocate") == {"llm": llm, "tp_group": group, "tp_size": 2}
    assert trl_access.generation_handles(trainer, "vllm_server") == {}
    with pytest.raises(RuntimeError, match="no colocated vLLM engine"):
        trl_access.generation_handles(SimpleNamespace(), "vllm_colocate")
    tokenizer = object()
    trainer = SimpleNamespace(processing_class=tokenizer, accelerator=SimpleNamespace(device="cpu"))
    handles = trl_access.generation_handles(trainer, "hf")
    assert handles["tokenizer"] is tokenizer and handles["device"] == "cpu" and callable(handles["open_model"])
