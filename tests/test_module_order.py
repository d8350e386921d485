"""The order README's two test processes take modules in (tests/helpers/module_order.py): longest first
by the recorded seconds, unrecorded modules by their marks, a module's own tests in their order."""

from __future__ import annotations

from dataclasses import dataclass, field

from helpers import module_order


@dataclass
class Item:
    nodeid: str
    marks: set[str] = field(default_factory=set)

    def get_closest_marker(self, name):
        return name if name in self.marks else None


def test_modules_run_longest_first_and_keep_their_own_order(monkeypatch):
    monkeypatch.setattr(module_order, "recorded_seconds", lambda: {"tests/test_a.py": 10, "tests/test_b.py": 500})
    items = [Item("tests/test_a.py::one"), Item("tests/test_a.py::two"), Item("tests/test_b.py::one"),
             Item("tests/test_c.py::one"), Item("tests/test_d.py::one", {"slow"}), Item("tests/test_d.py::two")]
    module_order.order_longest_first(items)
    assert [i.nodeid for i in items] == [
        "tests/test_b.py::one",  # recorded 500 s
        "tests/test_d.py::one", "tests/test_d.py::two",  # not recorded, has a slow test: counted as 300 s
        "tests/test_a.py::one", "tests/test_a.py::two",  # recorded 10 s
        "tests/test_c.py::one",  # not recorded, no marks
    ]


def test_the_recorded_file_names_modules_that_exist():
    recorded = module_order.recorded_seconds()
    assert recorded, "tests/module_seconds.json is missing or empty"
    root = module_order.SECONDS_FILE.parent.parent
    missing = [name for name in recorded if not (root / name).is_file()]
    assert len(missing) <= len(recorded) // 10, f"stale entries in module_seconds.json: {missing}"
