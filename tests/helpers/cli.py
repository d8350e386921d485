"""A refused command as a user meets it: exit status 2, exactly one `error:` line naming the problem,
and no file under the given folder created, changed or removed."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from aitrain_grpo.commands.cli import app


def snapshot(root: Path) -> dict[str, tuple[int, int]]:
    """Every file under `root` with its size and modification time."""
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns)
            for p in sorted(root.rglob("*")) if p.is_file()}


def refused(args: list[str], root: Path, *expected: str) -> str:
    """Run `aitrain <args>` in-process; check the refusal (each `expected` text in its error line) and that
    nothing under `root` changed. Returns the error line."""
    before = snapshot(root)
    result = CliRunner().invoke(app, args)
    output = result.output.strip()
    assert result.exit_code == 2, f"aitrain {' '.join(args)} exited {result.exit_code}:\n{output}"
    errors = [line for line in output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, output
    for text in expected:
        assert text in errors[0], errors[0]
    assert snapshot(root) == before, f"aitrain {' '.join(args)} changed files"
    return errors[0]
