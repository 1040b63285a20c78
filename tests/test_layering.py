"""The layering of docs/architecture.md holds: no module under p2plearn/ imports a package above its own.

Dependencies point down: (train, distributed, sim) -> sync -> (selection, tolerance, filter, transport,
control) -> native; runtime and launch -> rendezvous. Packages of one group may use each other; the
modules the rule does not place (options, keys, protocols, topology, checkpoint, ...) are not checked.
The imports are read from the source, so one inside a function counts as much as one at the top.
"""

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent / "p2plearn"
# Each chain from its top group down: a package may import its own group or a lower one, not a higher one.
CHAINS = [
    [{"train", "distributed", "sim"}, {"sync"}, {"selection", "tolerance", "filter", "transport", "control"},
     {"_p2pcast"}],
    [{"runtime", "launch"}, {"rendezvous"}],
]
# The launcher is an entry point: nothing a peer runs (init(), finding the job) may need it.
NEVER = {("runtime", "launch"), ("rendezvous", "launch")}


def package_of(module: tuple[str, ...]) -> str:
    """``("p2plearn", "launch", "run")`` -> ``launch``: the top-level package (or module) of p2plearn."""
    return module[1] if len(module) > 1 else ""


def imported_packages(source: str, module: tuple[str, ...], is_package: bool) -> Iterator[tuple[int, str]]:
    """(line, top-level package) of each p2plearn import in ``source``, the text of ``module``."""
    here = module if is_package else module[:-1]  # what a relative import starts from
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [alias.name.split(".") for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = list(here[:len(here) - node.level + 1]) if node.level else []
            base += node.module.split(".") if node.module else []
            # ``from p2plearn import runtime`` / ``from .. import options``: the names are modules themselves.
            names = [base + [alias.name] for alias in node.names] if len(base) == 1 else [base]
        else:
            continue
        for name in names:
            if name[0] == "p2plearn" and len(name) > 1:
                yield node.lineno, name[1]


def why_not(importer: str, imported: str) -> str | None:
    """Why ``importer`` may not import ``imported`` (None when it may)."""
    if (importer, imported) in NEVER:
        return "the launcher is an entry point"
    for chain in CHAINS:
        level = {name: depth for depth, group in enumerate(chain) for name in group}
        if importer in level and imported in level and level[imported] < level[importer]:
            return "it is above"
    return None


def modules() -> Iterator[tuple[Path, tuple[str, ...], bool]]:
    for path in sorted(ROOT.rglob("*.py")):
        parts = ("p2plearn", *path.relative_to(ROOT).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        yield path, parts[:-1] if is_package else parts, is_package


def upward_imports() -> list[str]:
    found = []
    for path, module, is_package in modules():
        importer = package_of(module)
        for line, imported in imported_packages(path.read_text(), module, is_package):
            why = imported != importer and why_not(importer, imported)
            if why:
                found.append(f"{path.relative_to(ROOT.parent)}:{line}: {importer} imports {imported} ({why})")
    return found


def test_the_check_sees_relative_absolute_and_late_imports():
    source = "from .launch.env import KEY_VAR\nfrom p2plearn import launch\ndef f():\n    import p2plearn.launch.run\n"
    assert list(imported_packages(source, ("p2plearn", "runtime"), False)) == [(1, "launch"), (2, "launch"), (4, "launch")]
    assert list(imported_packages("from .. import sync\n", ("p2plearn", "control", "client"), False)) == [(1, "sync")]
    assert list(imported_packages("from .rules import Bsp\n", ("p2plearn", "sync"), True)) == [(1, "sync")]
    assert why_not("runtime", "launch") and why_not("control", "sync") and why_not("rendezvous", "runtime")
    assert not why_not("sync", "control") and not why_not("control", "transport")
    assert not why_not("launch", "rendezvous") and not why_not("runtime", "control")


def test_every_package_the_rule_names_exists():
    named = set().union(*(group for chain in CHAINS for group in chain), *NEVER)
    present = {p.name for p in ROOT.iterdir() if (p / "__init__.py").exists()} | {p.stem for p in ROOT.glob("*.py")}
    present |= {p.name.split(".")[0] for p in ROOT.glob("_p2pcast*.so")}
    assert named <= present, named - present


def test_nothing_imports_a_package_above_it():
    assert upward_imports() == []


def test_rendezvous_imports_nothing_else_of_p2plearn():
    found = [f"{path.name}:{line}: {imported}" for path, module, is_package in modules()
             if package_of(module) == "rendezvous"
             for line, imported in imported_packages(path.read_text(), module, is_package) if imported != "rendezvous"]
    assert found == []
