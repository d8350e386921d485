"""Two warnings every run printed, that a user can do nothing about, are silenced, and only they (issue 35,
item 9): transformers 5.23's FutureWarning for `is_gradient_checkpointing` (read by peft and HF Trainer)
on the command line, and torch DDP's note that `find_unused_parameters=True` found none, where torch routes
it through Python. Checked in a fresh interpreter, whose warning filters are Python's defaults, with the
exact texts of transformers 5.23 and torch 2.13. torch 2.13 prints the DDP note from C++, past these filters:
a LoRA run does not ask DDP to search (tests/test_scaleout.py checks a real two-process run's output)."""

from __future__ import annotations

import subprocess
import sys

CHECKPOINTING = ("`is_gradient_checkpointing` is deprecated and will be removed in v6. Use "
                 "`is_activation_checkpointing` instead.")
DDP = ("find_unused_parameters=True was specified in DDP constructor, but did not find any unused parameters in the "
       "forward pass. This flag results in an extra traversal of the autograd graph every iteration,  which can "
       "adversely affect performance.")


def warnings_printed(module: str) -> str:
    code = (f"import warnings, {module}\n"
            f"warnings.warn({CHECKPOINTING!r}, FutureWarning)\n"
            f"warnings.warn({DDP!r}, UserWarning)\n"
            "warnings.warn('another deprecation', FutureWarning)\n"
            "warnings.warn('find_unused_parameters something else', UserWarning)\n")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300).stderr


def test_the_command_line_silences_the_checkpointing_rename_only():
    printed = warnings_printed("aitrain_grpo.commands.cli")
    assert "is_gradient_checkpointing" not in printed
    assert "another deprecation" in printed


def test_training_silences_ddps_unused_parameters_note_only():
    printed = warnings_printed("aitrain_grpo.training.trl.hf_args")
    assert "did not find any unused parameters" not in printed
    assert "find_unused_parameters something else" in printed
