"""`aitrain export RUN_DIR --to DIR`: a training output (of `grpo` or `sft`) as a standalone model folder.

The work is in export/merge.py (merge, save, check, upload); this module holds the command's
options and what it prints. Checks that need nothing loaded (the dtype, DIR, the Hub token and repo id)
run first, so a mistake costs no model load. `--dtype auto` (the default) keeps the precision the base
model was published in (its config.json's dtype: float32 for `tiny` and `smollm2`, bfloat16 for most hub
models), so an export is the size of the model it came from; `--dtype float32` keeps every bit of the
merge.

Left out: private repositories, model cards and revisions on the Hub (the folder is uploaded as it is;
`hf upload` does the rest).
"""

from __future__ import annotations

import inspect
from typing import Any, Optional

import typer

from aitrain_grpo.commands.options import as_in_grpo, command_option
from aitrain_grpo.errors import ConfigError, UserError, one_line
from aitrain_grpo.export.merge import DTYPES, ExportResult, check_hub_repo, export_model, push_to_hub
from aitrain_grpo.outputs import replaced_contents


class UploadFailed(UserError):
    """The model was exported, but the Hub upload did not go through (exit 1)."""

    exit_code = 1


def describe_check(result: ExportResult) -> list[str]:
    check = result.check
    line = (f"check: log-probabilities of {check.tokens} tokens differ by up to {check.max_abs_diff:.2g} from the "
            f"trained model's (tolerance {check.tolerance:g} for {check.dtype})")
    if check.adapter_effect is not None:
        line += f"; the adapter itself moves them by up to {check.adapter_effect:.2g}"
    return [line] + ([check.rounding_note()] if check.rounding_note() else [])


def run_export(options: dict[str, Any], console) -> ExportResult:
    """Export (and upload, with --push-to-hub) as the options say; UserError for what the user can fix."""
    if options["dtype"] not in DTYPES:
        raise ConfigError(f"--dtype {options['dtype']} is not supported; use one of {', '.join(DTYPES)}")
    repo = options.get("push_to_hub")
    token = check_hub_repo(repo) if repo else None  # before any model is loaded
    replaced = replaced_contents(options["to"], options["overwrite"])  # read before it is replaced
    result = export_model(options["run_dir"], options["to"], dtype=options["dtype"], base=options.get("base"),
                          overwrite=options["overwrite"])
    removed = [f"replaced {options['to']}: removed {replaced}"] if replaced else []
    for line in [*result.notes, *removed, *describe_check(result)]:
        console.print(line, markup=False)
    what = f"merged into {result.base}" if result.base else "full model"
    console.print(f"exported {options['run_dir']} ({what}) to {result.folder} as {result.check.dtype}; use it with "
                  f"--model {result.folder} (transformers, aitrain eval, aitrain vllm-serve)", markup=False)
    if repo:
        try:
            url = push_to_hub(result.folder, repo, token)
        except Exception as exc:  # noqa: BLE001 - network, permission and quota errors all end here
            raise UploadFailed(f"uploading {result.folder} to {repo} failed ({one_line(exc)}); the model is exported, "
                               f"retry with: hf upload {repo} {result.folder}") from None
        console.print(f"uploaded to {url}", markup=False)
    return result


EXPORT_SIGNATURE = inspect.Signature([
    inspect.Parameter("run_dir", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=str, default=typer.Argument(
        ..., help="A training output directory (the --output-dir of grpo or sft): a LoRA adapter or a full model.")),
    inspect.Parameter("to", inspect.Parameter.KEYWORD_ONLY, annotation=str, default=typer.Option(
        ..., "--to", help="Folder to write the standalone model to (refused when it exists and is not empty).")),
    command_option("dtype", "auto", f"Weights' dtype: {', '.join(DTYPES)} (auto: the base model's own).", str),
    command_option("base", None, "The base model to merge the adapter into, when the one the run names is gone "
                                 "(a folder, a hub id, 'tiny' or 'smollm2').", str),
    inspect.Parameter("overwrite", inspect.Parameter.KEYWORD_ONLY, annotation=bool, default=typer.Option(
        False, "--overwrite", help="Replace --to when it exists (only once the new model passed its check).")),
    inspect.Parameter("push_to_hub", inspect.Parameter.KEYWORD_ONLY, annotation=Optional[str], default=typer.Option(
        None, "--push-to-hub", help="Also upload the folder to this Hugging Face model repo (NAME or ORG/NAME); "
                                    "needs a token (hf auth login, or HF_TOKEN).")),
    as_in_grpo("debug"),
])
