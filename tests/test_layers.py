"""The layering docs/architecture.md promises, read from the source: each folder of `aitrain_grpo/` is a
layer, a module imports only from its own layer and those below (the one exception: `engine/` reads
constants from `config.py`), and imports form no cycle. Imports inside functions count for both: a lazy
import is still a dependency, and a lazy import that closes a circle only hides it. Imports under
`if TYPE_CHECKING:` count for the layering but not for cycles: they never run, and a module may name the
type of an object a module above it hands in."""

from __future__ import annotations

import ast
import functools

from helpers import REPO

PACKAGE = REPO / "aitrain_grpo"
# docs/architecture.md's table, bottom to top: a layer may import its own rank and below.
RANK = {"errors": 0, "env_spec": 0, "config": 0, "config_file": 0, "option_rules": 0, "option_effects": 0, "peer_options": 0, "optimizers": 0, "outputs": 0, "env": 1, "models": 1, "engine": 2, "runlog": 2,
        "rewards": 3, "training": 3, "evaluation": 3, "sft": 4, "export": 4, "commands": 5, "": 6, "__main__": 6}
ALLOWED_UPWARD = {("engine", "config")}


@functools.cache  # parsed once for the module's tests, which only read the trees
def modules() -> dict[str, ast.Module]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        name = ".".join(path.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__")
        found[name] = ast.parse(path.read_text())
    return found


def layer(module: str) -> str:
    return module.split(".")[1] if "." in module else ""


def imports(tree: ast.Module, *, run_time_only: bool = False) -> set[str]:
    """The `aitrain_grpo` modules a module imports, lazily or not (`run_time_only`: less those under
    `if TYPE_CHECKING:`)."""
    return {t for t in imported_names(tree, run_time_only=run_time_only) if t == "aitrain_grpo" or t.startswith("aitrain_grpo.")}


def _type_checking_only(node: ast.AST) -> bool:
    test = node.test if isinstance(node, ast.If) else None
    return isinstance(test, ast.Name) and test.id == "TYPE_CHECKING" or \
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"


def imported_names(tree: ast.Module, *, run_time_only: bool = False) -> set[str]:
    """Every absolute import of a module, at any depth (`import a.b`, `from a.b import c` give "a.b")."""
    nodes: list[ast.AST] = []
    pending: list[ast.AST] = [tree]
    while pending:
        node = pending.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            nodes.append(node)
        elif run_time_only and _type_checking_only(node):
            pending += node.orelse  # only the body is skipped
        else:
            pending += ast.iter_child_nodes(node)
    names = set()
    for node in nodes:
        targets = [node.module] if isinstance(node, ast.ImportFrom) and node.level == 0 else \
            [a.name for a in node.names] if isinstance(node, ast.Import) else []
        names |= {t for t in targets if t}
    return names


def test_no_module_imports_a_layer_above_its_own():
    trees = modules()
    assert {layer(m) for m in trees} <= set(RANK), "a new folder: give it a rank here and a row in docs/architecture.md"
    upward = sorted((m, t) for m, tree in trees.items() for t in imports(tree)
                    if RANK[layer(t)] > RANK[layer(m)] and (layer(m), layer(t)) not in ALLOWED_UPWARD)
    assert not upward, f"imports from a higher layer (docs/architecture.md): {upward}"


def test_imports_form_no_cycle():
    trees = modules()

    def resolve(target: str) -> str | None:  # `from aitrain_grpo.env.base import X` -> the module env.base
        while target and target not in trees:
            target = target.rsplit(".", 1)[0] if "." in target else ""
        return target or None

    graph = {m: {resolve(t) for t in imports(tree, run_time_only=True)} - {None, m} for m, tree in trees.items()}
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(module: str, path: list[str]) -> None:
        state[module] = 1
        for target in sorted(graph[module]):
            if state.get(target) == 1:
                raise AssertionError("import cycle: " + " -> ".join(path[path.index(target):] + [module, target]))
            if target not in state:
                visit(target, path + [module])
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [])


def test_no_test_module_imports_from_another():
    """Shared test code lives in tests/helpers/ and conftest.py: a test module importing another runs that
    module's import-time work (and autouse fixtures) where nobody looks for it."""
    tests_dir = REPO / "tests"
    test_modules = {path.stem for path in tests_dir.rglob("test_*.py")}
    offenders = []
    for path in tests_dir.rglob("*.py"):
        found = imported_names(ast.parse(path.read_text()))
        offenders += [f"{path.relative_to(REPO)} imports {name}" for name in sorted(found) if name.split(".")[0] in test_modules]
    assert not offenders, offenders


def test_nothing_outside_env_imports_an_adapter():
    """An environment from another ecosystem is the loader's business (env/loading.py: `load_environment`,
    `as_environment`, `describe_interface`): the layers above see only `Environment`."""
    offenders = sorted(m for m, tree in modules().items() if layer(m) != "env"
                       and any(t.startswith("aitrain_grpo.env.adapters") for t in imports(tree)))
    assert not offenders, f"import env.adapters outside env/ (use env.loading): {offenders}"


def test_no_trl_import_outside_training_and_sft():
    """TRL is the training layer's business (its private names behind training/trl/access.py and
    training/trl/hooks.py): the engine, evaluation and the rest are handed plain objects, so a TRL upgrade
    touches training/ and sft/ only. Lazy imports count."""
    offenders = sorted(f"{m} imports {t}" for m, tree in modules().items() if layer(m) not in ("training", "sft")
                       for t in imported_names(tree) if t == "trl" or t.startswith("trl."))
    assert not offenders, f"TRL imported outside training/ and sft/: {offenders}"
