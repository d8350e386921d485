"""Where a command may write: the one rule every output path passes before anything is written.

No command removes or replaces something it did not create in that same call, except what the user
asked to replace and this package recognises as its own:
- a file output (`eval --output x.jsonl`, `report --output page.html`) may replace an existing file only
  when the command recognises it as what it writes (`written_by`: episode records, a report page) or it is
  empty; a user's dataset or notes in `.jsonl`, another run's metrics.jsonl, a hand-written page, a folder,
  `.`, or a file inside a run or model being read are refused;
- a folder output (`tiny-model DIR`, `export --to DIR`) is written only where nothing is, or into an empty
  folder; an existing non-empty folder needs `--overwrite`, and even then only a folder this package
  wrote (it holds one of `OURS_MARKERS`) of the same kind (`folder_kind`: a tiny model replaces a tiny
  model, an export an export, never a training run with its checkpoints) is replaced, and the command says
  what it removed; the current folder and the home folder never are.

Refusals are `ConfigError`s: one line naming the path and the fix, exit 2, nothing touched.

What is written goes into place whole: `written_atomically` / `publish` write next to the target, then
rename, so a reader (a browser on report.html, a vLLM server loading weights, a resume looking for
checkpoints) never sees half a file or folder. They live here, below every layer, because runlog/,
training/ (checkpoints, weight sync) and the commands all write that way. Nothing is fsync'd: the case
handled is a killed process, not a power cut.

Left out: the training output folder (`grpo`/`sft` --output-dir), whose rules involve checkpoints and
resuming (training/run/checkpoints.py), and the model cache, which only ever gains new folders.
"""

from __future__ import annotations

import contextlib
import json
import shutil
from pathlib import Path
from typing import Callable, Iterable, Iterator

from aitrain_grpo.errors import ConfigError

# Files only this package writes at the top of a folder: a run (grpo, sft), an export, a tiny model.
OURS_MARKERS = ("run_config.json", "run_summary.json", "export_info.json", "aitrain_tiny.json")
# The lock a live training run holds in its folder (training/run/lock.py). It is no content of the folder:
# a folder holding only a lock left by a killed run counts as empty.
LOCK_NAME = ".aitrain.lock"
_KINDS = {"run": "a training run", "export": "an exported model", "tiny": "a tiny model"}


def _is_our_marker(path: Path) -> bool:
    """Whether the marker file `path` is ours. `run_config.json` is a name other tools use too, so it
    counts only as a JSON object with this package's run options (every one has `rl_*` keys); the
    other markers are names only this package writes."""
    if not path.is_file():
        return False
    if path.name != "run_config.json":
        return True
    try:
        options = json.loads(path.read_text(errors="replace"))
    except (OSError, ValueError):
        return False
    return isinstance(options, dict) and any(str(key).startswith("rl_") for key in options)


def is_ours(folder: Path) -> bool:
    """Whether `folder` was written by this package (a run, an export or a tiny model)."""
    return folder.is_dir() and any(_is_our_marker(folder / name) for name in OURS_MARKERS)


def has_entries(folder: Path) -> bool:
    """Whether `folder` holds anything but a run's lock file."""
    return any(entry.name != LOCK_NAME for entry in folder.iterdir())


def folder_kind(folder: Path) -> str | None:
    """Which of our outputs `folder` is: 'export' (export_info.json; an export also copies its run's
    run_config.json, so this comes first), 'run' (run_config.json, run_summary.json or a checkpoint),
    'tiny' (aitrain_tiny.json), or None. `--overwrite` replaces a folder only with one of the same kind."""
    if not folder.is_dir():
        return None
    if (folder / "export_info.json").is_file():
        return "export"
    if _is_our_marker(folder / "run_config.json") or (folder / "run_summary.json").is_file() \
            or any(folder.glob("checkpoint-*/trainer_state.json")):
        return "run"
    if (folder / "aitrain_tiny.json").is_file():
        return "tiny"
    return None


def describe_kind(kind: str | None) -> str:
    return _KINDS.get(kind or "", "files of another kind")


def replaced_contents(path: str | Path, overwrite: bool) -> str | None:
    """'a tiny model (9 files)': what `--overwrite` would remove at `path`, read before the command runs so
    that it can say afterwards what it removed; None when nothing would be."""
    folder = Path(path).expanduser()
    if not overwrite or not folder.is_dir() or folder.is_symlink() or not has_entries(folder):
        return None
    files = sum(1 for p in folder.rglob("*") if p.is_file() and p.name != LOCK_NAME)
    return f"{describe_kind(folder_kind(folder))} ({files} file{'s' if files != 1 else ''})"


def _resolved(path: Path) -> Path:
    return path.expanduser().resolve()


def _within(path: Path, folder: Path) -> bool:
    path, folder = _resolved(path), _resolved(folder)
    return path == folder or folder in path.parents


def special_folder(path: Path) -> str | None:
    """'the current folder' / 'your home folder' when `path` is one of them (never an output)."""
    resolved = _resolved(path)
    if resolved == Path.cwd().resolve():
        return "the current folder"
    if resolved == Path.home().resolve():
        return "your home folder"
    return None


def check_file_output(path: str | Path, *, flag: str, suffixes: tuple[str, ...], written_by: Callable[[Path], bool],
                      kind: str, reads: Iterable[str | Path] = ()) -> Path:
    """`path` as a file this call may write: new (in a folder that exists), or an existing file ending in one
    of `suffixes` that is empty or that `written_by` recognises as this command's `kind` of output, outside
    every folder in `reads` (the runs and models the command reads)."""
    example = f"results{suffixes[0]}"
    if not str(path).strip():  # '' once meant "not given"
        raise ConfigError(f"{flag} needs a value: a file path, e.g. {example} (or leave the option out)")
    target = Path(path).expanduser()
    if not target.parent.is_dir():
        raise ConfigError(f"{flag} {path}: the folder {target.parent} does not exist; create it first (mkdir -p "
                          f"{target.parent}) or pass a path in an existing folder")
    special = special_folder(target)
    if special or target.is_dir():
        what = special or "a folder"
        raise ConfigError(f"{flag} {path} is {what}; pass a file path, e.g. {Path(path) / example if not special else example}")
    if target.exists() or target.is_symlink():
        if not target.is_file():
            raise ConfigError(f"{flag} {path} exists and is not a regular file; pass a new file path")
        if target.suffix not in suffixes:
            raise ConfigError(f"{flag} {path} exists and is not a {' or '.join(suffixes)} file, so it is not "
                              f"replaced; pass a new file path or an existing {suffixes[0]} file")
        for folder in reads:
            if Path(folder).expanduser().is_dir() and _within(target, Path(folder)):
                raise ConfigError(f"{flag} {path} is a file of {folder}, which this command reads; pass a path "
                                  f"outside it")
        if target.stat().st_size and not written_by(target):
            raise ConfigError(f"{flag} {path} exists and is not {kind}, so it is not replaced; pass a new file path, "
                              f"or move that file away first")
    return target


def check_folder_output(path: str | Path, *, flag: str, overwrite: bool, kind: str,
                        reads: Iterable[str | Path] = (), overwrite_flag: str = "--overwrite") -> Path:
    """`path` as a folder this call may create, or replace (`overwrite`, and only one of ours of the same
    `kind`: an export never replaces a training run). Refuses a file, the current or home folder, and a
    folder holding or inside one the command reads."""
    target = Path(path).expanduser()
    special = special_folder(target)
    if special:
        raise ConfigError(f"{flag} {path} is {special}; pass a new folder name, e.g. {Path(path) / 'out'}")
    for folder in reads:
        if _within(target, Path(folder)) or _within(Path(folder), target):
            raise ConfigError(f"{flag} {path} holds or is inside {folder}, which this command reads; pick a new folder")
    check_can_be_created(target, flag)
    if target.exists() or target.is_symlink():
        if not target.is_dir():
            raise ConfigError(f"{flag} {path} exists and is a file; pass a folder path that does not exist yet")
        if has_entries(target):
            if not overwrite:
                raise ConfigError(f"{flag} {path} exists and is not empty; pass a new folder, or {overwrite_flag} "
                                  f"to replace it (only a folder this tool wrote is replaced)")
            if not is_ours(target):
                raise ConfigError(f"{flag} {path} holds files this tool did not write (no {' / '.join(OURS_MARKERS[:3])}"
                                  f"), so even {overwrite_flag} does not replace it; pass a new folder")
            if folder_kind(target) != kind:
                raise ConfigError(f"{flag} {path} holds {describe_kind(folder_kind(target))}, not {describe_kind(kind)}, "
                                  f"so {overwrite_flag} does not replace it; pass a new folder")
    return target


def check_can_be_created(folder: Path, flag: str) -> None:
    """A one-line error, before anything loads, for a folder output that cannot be made (a file where a
    parent folder should be, a place not writable). Only trying tells (root passes access() checks, /proc
    refuses anyway), so the missing folders are made and removed again: a command that then fails to load
    leaves nothing behind. An existing path is left to the caller's own checks."""
    if folder.exists() or folder.is_symlink():
        return
    missing = [folder, *(p for p in folder.parents if not p.exists())]
    try:
        folder.mkdir(parents=True)
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise ConfigError(f"{flag} {folder} cannot be created ({reason}); pass a folder you can write to") from None
    for made in missing:  # innermost first
        made.rmdir()


# ---------------------------------------------------------------------------------- write, then rename


def publish(temporary: Path, final: Path) -> None:
    """Move a finished file or folder into place. Within one file system the rename is atomic: `final`
    is either the old version or the whole new one. A file replaces a file; a folder replaces only a
    folder of the same name that this package wrote before (a checkpoint or weight version saved
    again); a file never replaces a folder (refused: the caller's path check should have caught it)."""
    if final.is_dir() and not final.is_symlink():
        if not temporary.is_dir():
            raise ConfigError(f"{final} is a folder; it is not replaced by a file (pass a file path)")
        shutil.rmtree(final)
    temporary.replace(final)


@contextlib.contextmanager
def written_atomically(final: Path, *, folder: bool = False) -> Iterator[Path]:
    """Yield a hidden temporary path next to `final` (an empty folder with `folder=True`) to write
    into; once the block finishes, it becomes `final`. A block that raises leaves `final` untouched."""
    temporary = final.parent / f".{final.name}.partial"
    if temporary.is_dir():
        shutil.rmtree(temporary)
    else:
        temporary.unlink(missing_ok=True)
    if folder:
        temporary.mkdir(parents=True)
    yield temporary
    publish(temporary, final)
