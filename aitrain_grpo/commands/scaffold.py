"""`aitrain init NAME`: write a small, working environment and its test into a project, ready to edit.

It writes `envs/NAME.py` (a multi-turn environment with feedback between attempts, a graded score and
a `solve` oracle, every method of the contract explained where it is defined) and `tests/test_NAME.py`
(plays the oracle and an empty policy through the engine, no model), then returns the three commands
to run next: `env check`, a 5-step `grpo` on the tiny model, `eval` of the result against the base.

Files go under the current directory (or `directory`), so that `--rl-env-module envs.NAME` imports
them: the loader puts the current directory first on `sys.path`. `envs/__init__.py` is created when it
is missing, because a folder without one is only a namespace package, and a regular `envs` package
anywhere else on `sys.path` (this project installs one) would win over it.

Left out: overwriting (an existing file is refused, exit 2, nothing written), other templates (tools,
single-turn: the README's examples and envs/ show those), and editing a project's config files.
"""

from __future__ import annotations

import keyword
import os
from dataclasses import dataclass
from pathlib import Path

from aitrain_grpo.errors import UserError


@dataclass(frozen=True)
class Scaffold:
    """What `init` wrote and what to run next."""

    env_file: Path
    test_file: Path
    created: list[Path]  # every file written, envs/__init__.py included when it was missing
    next_commands: list[str]


def class_name_for(name: str) -> str:
    """`my_task` -> `MyTaskEnv` (a name already ending in 'env' keeps one `Env`)."""
    camel = "".join(part[:1].upper() + part[1:] for part in name.split("_") if part)
    return camel if camel.endswith("Env") else camel + "Env"


def check_name(name: str) -> None:
    """NAME becomes a module (`envs.NAME`) and a class: it must be a Python identifier, not a keyword."""
    if not name.isidentifier() or keyword.iskeyword(name):
        fixed = "".join(c if c.isalnum() else "_" for c in name).strip("_").lower() or "my_env"
        if fixed[0].isdigit() or keyword.iskeyword(fixed):
            fixed = "env_" + fixed
        if keyword.iskeyword(name):
            raise UserError(f"environment name {name!r} is a Python keyword (it becomes the module envs.{name}); "
                            f"choose another name, e.g. {fixed}")
        raise UserError(f"environment name {name!r} is not a Python identifier (it becomes the module envs.{name}); "
                        f"use letters, digits and underscores, starting with a letter, e.g. {fixed}")
    if (name.startswith("__") and name.endswith("__")) or not name.strip("_"):
        raise UserError(f"environment name {name!r} is reserved by Python; choose another, e.g. my_env")


def next_commands(name: str, class_name: str) -> list[str]:
    """The commands a user types next, in order (run from the project folder)."""
    env = f"--rl-env-module envs.{name} --rl-env-class {class_name}"
    return [
        f"aitrain env check {env}",
        f"aitrain grpo {env} --max-steps 5",
        f"aitrain eval --model outputs/{class_name.lower()} --baseline tiny --episodes 32",
    ]


def write_scaffold(name: str, directory: str | Path = ".") -> Scaffold:
    """Write the environment and its test under `directory`; refuse (UserError) to overwrite either."""
    check_name(name)
    root = Path(directory)
    if root.exists() and not root.is_dir():
        raise UserError(f"{root} is a file, not a folder; pass a project folder with --dir")
    class_name = class_name_for(name)
    env_file, test_file = root / "envs" / f"{name}.py", root / "tests" / f"test_{name}.py"
    for path in (env_file, test_file):
        if path.exists():
            raise UserError(f"{path} already exists; init never overwrites: pick another name, or move the file away")
    check_writable(root)
    package = root / "envs" / "__init__.py"
    created: list[Path] = []
    files = [(env_file, ENV_TEMPLATE), (test_file, TEST_TEMPLATE)]
    if not package.exists():
        files.insert(0, (package, PACKAGE_TEMPLATE))
    new_folders = [p for p in (env_file.parent, test_file.parent, *root.absolute().parents, root.absolute())
                   if not p.exists()]
    try:
        for path, template in files:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(template.replace("__NAME__", name).replace("__CLASS__", class_name), encoding="utf-8")
            created.append(path)
    except OSError as exc:  # a folder /proc-like or full: take back what was written, then say so
        for path in created:
            path.unlink(missing_ok=True)
        for folder in sorted(new_folders, key=lambda p: len(p.absolute().parts), reverse=True):
            if folder.is_dir() and not any(folder.iterdir()):
                folder.rmdir()
        raise UserError(f"cannot write {path} ({exc.strerror or exc}); pass a --dir you can write to") from None
    return Scaffold(env_file, test_file, created, next_commands(name, class_name))


def check_writable(root: Path) -> None:
    """Refuse, before anything is written, a --dir under a file or under a folder this user cannot write."""
    existing = root.absolute()
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        raise UserError(f"{root} is under {existing}, a file, not a folder; pass a project folder with --dir")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise UserError(f"cannot write in {existing} (permission denied); pass a --dir you can write to")


def print_next_steps(scaffold: Scaffold, directory: str, console) -> None:
    """What `aitrain init` prints: the files written, then the commands to run next."""
    for path in scaffold.created:
        console.print(f"wrote {path}", markup=False)
    console.print("next (from the project folder):", markup=False)
    if Path(directory).resolve() != Path.cwd().resolve():
        console.print(f"  cd {directory}", markup=False)
    for command in scaffold.next_commands:
        console.print(f"  {command}", markup=False)


PACKAGE_TEMPLATE = '''"""Environments of this project (`--rl-env-module envs.<name>`)."""
'''

ENV_TEMPLATE = '''"""__CLASS__: sort a few numbers, with feedback after each attempt (written by `aitrain init __NAME__`).

Each task is a short list of numbers. The model answers with them in ascending order; when the answer
is wrong, the environment says which positions are wrong and the model tries again, up to `max_turns`
attempts. The score is graded, so GRPO can tell better episodes from worse ones before any is perfect:

    score = (0.5 * share of the numbers the last answer contains
             + 0.5 * share of the positions it has right) * (1 - 0.25 * (attempts - 1))

so a model first earns something for repeating the numbers, then more for putting them in order, and
most for getting it right at the first attempt.

Make it your own task by editing build_dataset (the tasks), step (the feedback), score_episode (the
grade) and solve (an expert's answer: `aitrain env check` plays it and expects a score of 1.0), then
run tests/test___NAME__.py and:

    aitrain env check --rl-env-module envs.__NAME__ --rl-env-class __CLASS__
"""

from __future__ import annotations

import random
import re

from aitrain_grpo import Environment, Episode


def parse_numbers(text: str) -> list[int]:
    """The integers in a model turn, in order. Model output is parsed, never evaluated."""
    return [int(n) for n in re.findall(r"-?\\d+", text)]


class __CLASS__(Environment):
    """Sort a list of numbers in up to `max_turns` attempts, told after each which positions are wrong."""

    #: Most model turns an episode may take; `--rl-max-turns` can lower it, never raise it.
    max_turns = 3

    def __init__(self, num_tasks: int = 64, length: int = 4, seed: int = 0):
        """The JSON object of `--rl-env-config` arrives here as keyword arguments, e.g. '{"length": 5}'."""
        if not 2 <= length <= 10:
            raise ValueError(f"length must be between 2 and 10, got {length}")
        rng = random.Random(seed)
        self.tasks = [rng.sample(range(1, 100), length) for _ in range(num_tasks)]

    def build_dataset(self, tokenizer) -> list[dict]:
        """One row per task: a `prompt` (chat messages, or a string) and any other columns, which the
        episode sees as `episode.row` (here the numbers, so step and score need not parse the prompt).
        `tokenizer` is the model's, for environments that must measure prompts in tokens."""
        rows = []
        for numbers in self.tasks:
            ask = (f"Sort these numbers from smallest to largest: {', '.join(map(str, numbers))}. "
                   f"Answer with the sorted numbers only, separated by commas.")
            rows.append({"prompt": [{"role": "user", "content": ask}], "numbers": numbers})
        return rows

    def reset(self, episode: Episode) -> None:
        """Optional: per-episode setup before the first model turn; `episode.state` is yours."""
        episode.state["target"] = sorted(episode.row["numbers"])

    def step(self, episode: Episode, completion: str) -> str | None:
        """Called after every model turn with its text. Return the environment's reply (a string is one
        user message; a list of messages may hold `tool` results) or None to end the episode. Without
        `step`, an episode is a single turn. The engine stops at `max_turns` whatever this returns."""
        target = episode.state["target"]
        answer = parse_numbers(completion)
        if answer == target:
            return None
        if len(answer) != len(target):
            return f"Give exactly {len(target)} numbers, separated by commas. Try again."
        wrong = [str(i + 1) for i, (a, b) in enumerate(zip(answer, target)) if a != b]
        return f"Not yet: position(s) {', '.join(wrong)} are wrong. Try again."

    def score_episode(self, episode: Episode) -> float:
        """Score the finished episode from 0.0 to 1.0 (also called after a budget cut it short).
        Numbers put in `episode.metrics` are logged as env/<name>."""
        target = episode.state["target"]
        answers = [str(m.get("content") or "") for m in episode.messages if m["role"] == "assistant"]
        last = parse_numbers(answers[-1]) if answers else []
        found = sum(min(last.count(n), target.count(n)) for n in set(target)) / len(target)
        in_place = sum(a == b for a, b in zip(last, target)) / max(len(last), len(target))
        episode.metrics["attempts"] = len(answers)
        episode.metrics["solved"] = float(last == target)
        return (0.5 * found + 0.5 * in_place) * max(0.0, 1.0 - 0.25 * (len(answers) - 1))

    def solve(self, episode: Episode) -> str:
        """Optional: an expert's next message. `aitrain env check` and the test play it: it must score
        1.0, or solve or score_episode is wrong."""
        return ", ".join(map(str, sorted(episode.row["numbers"])))
'''

TEST_TEMPLATE = '''"""__CLASS__ played without a model (written by `aitrain init __NAME__`): the oracle scores 1, an
empty reply scores 0, feedback gives partial credit. Run: python -m pytest tests/test___NAME__.py"""

import sys
from pathlib import Path

# The project folder first, so this `envs` package wins over any other of that name on sys.path.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from aitrain_grpo.engine.runner import play  # noqa: E402
from envs.__NAME__ import __CLASS__  # noqa: E402


def play_policy(policy, count=8):
    env = __CLASS__(num_tasks=count)
    return play(env, env.build_dataset(None), policy)


def test_oracle_scores_one():
    env = __CLASS__()
    episodes = play_policy(env.solve)
    assert [ep.error for ep in episodes] == [None] * len(episodes)
    assert [ep.score for ep in episodes] == [1.0] * len(episodes)


def test_empty_reply_scores_zero():
    episodes = play_policy(lambda episode: "")
    assert all(ep.error is None for ep in episodes)
    assert max(ep.score for ep in episodes) == 0.0


def test_a_second_attempt_after_feedback_earns_less():
    env = __CLASS__()
    turns = iter(["1, 2", env.solve])  # a wrong first answer, then the right one

    def policy(episode):
        answer = next(turns)
        return answer if isinstance(answer, str) else answer(episode)

    (episode,) = play_policy(policy, count=1)
    assert episode.turns == 2
    assert 0.0 < episode.score < 1.0
'''
