"""The tests that need a package README's install lacks are marked extras, and none goes unmarked
(tests/helpers/extras.py): CI runs README's install, then only the marked tests with the extras installed,
so a test skipped for a missing package but not marked would run in neither pass. Checked on a small
suite of its own, run under pytest-xdist as README's test command runs."""

from __future__ import annotations

import re
import subprocess
import sys
import xml.etree.ElementTree as ElementTree

from helpers import REPO
from helpers.extras import NEEDS, TESTS_DIR

SUITE = {
    "conftest.py": f"""
import sys
import pytest
sys.path.insert(0, {str(TESTS_DIR)!r})
pytest_plugins = ["helpers.extras"]

@pytest.fixture
def vllm_server():
    pytest.importorskip("no_such_package_here", reason="vLLM is not installed")
""",
    "pytest.ini": "[pytest]\nmarkers =\n    extras(package): needs a package\n",
    "test_a.py": """
import pytest

def test_plain():
    pass

def test_unmarked_missing():
    pytest.importorskip("no_such_package_here")

@pytest.mark.extras("no_such_package_here")
def test_marked_missing():
    pytest.importorskip("no_such_package_here")

def test_skipped_for_another_reason():
    pytest.skip("needs CUDA")

def test_takes_a_fixture_that_needs_a_package(vllm_server):
    pass
""",
    "test_module_marked.py": """
import pytest
pytestmark = [pytest.mark.slow, pytest.mark.extras("no_such_package_here")]
pytest.importorskip("no_such_package_here")

def test_never_collected():
    pass
""",
    "test_module_missing.py": """
import pytest
pytest.importorskip("no_such_package_here")

def test_never_collected():
    pass
""",
}


def outcomes(tmp_path, *args: str) -> dict[str, str]:
    """{test or module: passed, failed, skipped or error} for the suite run with `args`."""
    suite = tmp_path / "suite"
    for name, text in SUITE.items():
        (suite / name).parent.mkdir(parents=True, exist_ok=True)
        (suite / name).write_text(text)
    report = tmp_path / f"report{len(list(tmp_path.glob('report*.xml')))}.xml"
    result = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-n", "2", "-q",
                             f"--junitxml={report}", *args], cwd=suite, capture_output=True, text=True, timeout=300)
    assert result.returncode in (0, 1, 2, 5), result.stdout[-3000:] + result.stderr[-3000:]
    found = {}
    for case in ElementTree.parse(report).getroot().iter("testcase"):
        kinds = [child.tag for child in case if child.tag in ("failure", "error", "skipped")]
        name = case.get("name") if case.get("classname") in ("", "test_a") else f"{case.get('classname')}.{case.get('name')}"
        found[name] = {"failure": "failed"}.get(kinds[0], kinds[0]) if kinds else "passed"
        if kinds:
            found[name + ":message"] = next(iter(case)).get("message", "")
    return found


def test_a_skip_for_a_missing_package_fails_unless_marked_extras(tmp_path):
    run = outcomes(tmp_path)
    assert run["test_plain"] == "passed"
    assert run["test_unmarked_missing"] == "failed", run
    assert "not marked extras" in run["test_unmarked_missing:message"]
    assert run["test_marked_missing"] == "skipped" and run["test_skipped_for_another_reason"] == "skipped"
    assert run["test_takes_a_fixture_that_needs_a_package"] == "skipped", run  # marked by its fixture
    # A whole module skipped so, not marked: one failed test in its place, and the rest of the run goes on.
    assert run["test_module_missing.skipped_for_a_missing_package"] == "failed", run
    assert "not marked extras" in run["test_module_missing.skipped_for_a_missing_package:message"]
    assert run["test_module_marked"] == "skipped", run  # marked by its pytestmark, read from its source


def test_the_second_pass_runs_the_marked_tests_and_a_skip_there_fails(tmp_path):
    run = outcomes(tmp_path, "-m", "extras", "--extras-installed", "vllm no_such_package_here")
    tests = {name: outcome for name, outcome in run.items() if ":" not in name}
    assert set(tests) == {"test_marked_missing", "test_takes_a_fixture_that_needs_a_package",
                          "test_module_marked.skipped_for_a_missing_package"}, run
    assert tests["test_module_marked.skipped_for_a_missing_package"] == "failed", run
    assert tests["test_marked_missing"] == "failed", run  # installed, says --extras-installed: a broken install
    assert "which --extras-installed says is installed" in run["test_marked_missing:message"]
    assert tests["test_takes_a_fixture_that_needs_a_package"] == "error", run  # its fixture's setup fails


def test_every_listed_test_exists():
    """An entry of NEEDS names a module under tests/ and, where it names a test, a test of that module."""
    for key in NEEDS:
        module, _, test = key.partition("::")
        path = TESTS_DIR / module
        assert path.is_file() and path.name.startswith("test_"), key
        function = re.sub(r"\[.*\]$", "", test)
        assert not test or re.search(rf"^def {re.escape(function)}\(", path.read_text(), flags=re.M), key
    assert TESTS_DIR == REPO / "tests"
