"""docs/options.md, written from `RunConfig` itself: every option of `aitrain grpo` with its flag, default
and help, in the sections its fields declare (`_section("episodes")`, ... in config.py), then the other
trainers' names for them (peer_options.py).

    python -m aitrain_grpo.commands.options_doc > docs/options.md

tests/test_options.py fails when the file and the code disagree, so the reference never goes stale.
Left out: the options of one command only (`--episodes` of eval, ...): `aitrain <command> --help`.
"""

from __future__ import annotations

from dataclasses import fields

from aitrain_grpo.commands.options import flag_name
from aitrain_grpo.config import RunConfig
from aitrain_grpo.peer_options import PEER_NAMES

HEADER = """# Options of `aitrain grpo`

Written by `python -m aitrain_grpo.commands.options_doc > docs/options.md` from `RunConfig` (the test
suite checks it is current). Every option is a flag and a key of a `--config run.yaml` (or `.json`) file;
flags given on the command line override the file. Every switch also has a `--no-` form that turns it
off (`--no-shuffle-dataset`, `--no-peft`), whether it is on by default or in the file.
"""


def _default(value) -> str:
    if value is None or value == "":
        return "-"
    if isinstance(value, bool):
        return "on" if value else "off"
    return f"`{value}`"


PEERS_HEADER = """
## Other trainers' names

Coming from TRL, axolotl or verifiers: each name on the left is refused with the option on the right
(aitrain_grpo/peer_options.py), which does the same job here; the note says where the units differ.

| their name | whose | aitrain's | what differs |
| --- | --- | --- | --- |"""


def peers_markdown() -> str:
    rows = [PEERS_HEADER]
    for name, (ours, whose, differs) in sorted(PEER_NAMES.items(), key=lambda item: (item[1][0], item[0])):
        rows.append(f"| `{name}` | {whose.removesuffix(' name')} | `{flag_name(ours)}` | {differs or '-'} |")
    return "\n".join(rows) + "\n"


def options_markdown() -> str:
    out, last = [HEADER], None
    for f in fields(RunConfig):
        section = f.metadata.get("section", "options")
        if section != last:
            out += [f"\n## {section[0].upper()}{section[1:]}\n", "| flag | default | meaning |", "| --- | --- | --- |"]
            last = section
        text = " ".join(str(f.metadata.get("help", "")).split()).replace("|", "\\|")
        out.append(f"| `{flag_name(f.name)}` | {_default(f.default)} | {text} |")
    return "\n".join(out) + "\n" + peers_markdown()


if __name__ == "__main__":
    print(options_markdown(), end="")
