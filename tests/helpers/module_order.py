"""A pytest plugin (registered by conftest.py): under pytest-xdist, run the longest test modules first.

README's test command runs two processes (`-n 2`), each given whole modules (`--dist loadfile
--no-loadscope-reorder` in pyproject.toml) in collection order. Left in pytest's alphabetical order, or
in xdist's own (most tests first), a module of one 8-minute test can start last and leave one process
working alone at the end. So modules are sorted by their seconds in the last recorded run
(`tests/module_seconds.json`); a module not recorded there counts by its marks (slow, integration, or
neither). The tests inside a module keep their order. A run without xdist keeps pytest's order.

    OMP_NUM_THREADS=1 python -m pytest -q -n 2 --record-module-seconds   # rewrite the file from this run

What is left out: splitting a module across processes (its vLLM server and trainer fixtures are shared
by its tests) and anything adaptive within a run.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path

import pytest

SECONDS_FILE = Path(__file__).resolve().parent.parent / "module_seconds.json"
UNRECORDED = {"slow": 300.0, "integration": 30.0}  # seconds assumed for a module missing from the file
_measured: Counter[str] = Counter()


def module_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def recorded_seconds() -> dict[str, float]:
    try:
        return {str(k): float(v) for k, v in json.loads(SECONDS_FILE.read_text()).items()}
    except (OSError, ValueError, AttributeError):
        return {}


def order_longest_first(items) -> None:
    """Sort `items` in place, whole modules longest first (stable within a module)."""
    seconds = recorded_seconds()
    guess: dict[str, float] = {}
    for item in items:
        module = module_of(item.nodeid)
        mark = next((UNRECORDED[m] for m in UNRECORDED if item.get_closest_marker(m)), 0.0)
        guess[module] = max(guess.get(module, 0.0), mark)
    items.sort(key=lambda item: -seconds.get(module_of(item.nodeid), guess[module_of(item.nodeid)]))


def pytest_addoption(parser) -> None:
    parser.addoption("--record-module-seconds", action="store_true",
                     help=f"write each module's seconds in this run into {SECONDS_FILE.name} (the order -n runs modules in)")


@pytest.hookimpl(trylast=True)  # after conftest.py has marked the integration tests
def pytest_collection_modifyitems(config, items) -> None:
    if os.environ.get("PYTEST_XDIST_WORKER"):
        order_longest_first(items)


def pytest_runtest_logreport(report) -> None:
    _measured[module_of(report.nodeid)] += report.duration


def pytest_sessionfinish(session) -> None:
    if session.config.getoption("--record-module-seconds") and not os.environ.get("PYTEST_XDIST_WORKER") and _measured:
        ranked = dict(sorted(((k, round(v)) for k, v in _measured.items()), key=lambda kv: -kv[1]))
        SECONDS_FILE.write_text(json.dumps(ranked, indent=1) + "\n")
