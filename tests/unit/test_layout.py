"""The layering rules of docs/architecture.md, checked on the source: who may import what, no
import cycles, at most six modules directly in workers/, no file over 500 lines."""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("shared", "producer", "workers")
MAX_LINES = 500
MAX_TOP_LEVEL_WORKER_MODULES = 6

# (folder, imports it must not make): a name matches itself and everything below it.
FORBIDDEN: tuple[tuple[str, tuple[str, ...]], ...] = (
    (
        "workers/engine",
        ("rq", "redis", "boto3", "shared.settings", "shared.storage", "workers.service",
         "workers.voices", "workers.tools"),
    ),
    (
        "workers/model",
        ("rq", "redis", "boto3", "shared.settings", "shared.storage", "workers.service",
         "workers.voices", "workers.tools", "workers.engine"),
    ),
    ("workers/coreml", ("rq", "redis", "workers.service")),
    ("shared", ("workers", "producer", "torch")),
    ("producer", ("workers", "torch", "onnxruntime", "coremltools")),
)  # fmt: skip


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _sources() -> dict[str, Path]:
    return {
        _module_name(path): path
        for package in PACKAGES
        for path in sorted((ROOT / package).rglob("*.py"))
    }


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(module: str, path: Path, *, type_checking: bool = False) -> set[str]:
    """Every imported module name, at module level or inside functions; those under
    `if TYPE_CHECKING:` only when `type_checking` (a cycle is a cycle even for the type checker:
    it means two modules each need the other)."""
    found: set[str] = set()
    is_package = path.name == "__init__.py"

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node) and not type_checking:
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = module.split(".")
                anchor = anchor if is_package else anchor[:-1]
                anchor = anchor[: len(anchor) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            # `from package import submodule` imports the submodule; any other name comes from
            # the module itself (a package's __init__ included).
            for alias in node.names:
                submodule = f"{base}.{alias.name}"
                found.add(submodule if submodule in SOURCE_NAMES else base)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(_parsed(path))
    return found


@functools.cache
def _parsed(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), filename=str(path))


def _within(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


SOURCES = _sources()
SOURCE_NAMES = frozenset(SOURCES)


@functools.cache
def project_imports(*, type_checking: bool) -> dict[str, set[str]]:
    """{module: what it imports} over the project, parsed when a test first asks (~2 s): not at
    collection, which every test process pays, only in the process that runs these tests."""
    return {
        module: _imports(module, path, type_checking=type_checking)
        for module, path in SOURCES.items()
    }


@pytest.mark.parametrize(("folder", "forbidden"), FORBIDDEN, ids=[f for f, _ in FORBIDDEN])
def test_layers_import_only_what_they_may(folder: str, forbidden: tuple[str, ...]) -> None:
    prefix = folder.replace("/", ".")
    broken = sorted(
        f"{module} imports {name}"
        for module, names in project_imports(type_checking=False).items()
        if _within(module, prefix)
        for name in names
        if any(_within(name, banned) for banned in forbidden)
    )
    assert broken == []


def test_no_import_cycles_among_project_modules() -> None:
    graph = {
        module: {name for name in names if name in SOURCES and name != module}
        for module, names in project_imports(type_checking=True).items()
    }
    # `from package import name` also counts as importing the package's __init__, which is fine
    # as long as __init__ itself imports nothing that leads back; Tarjan finds every cycle.
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def strongconnect(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in graph[node]:
            if other not in index:
                strongconnect(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for module in sorted(graph):
        if module not in index:
            strongconnect(module)
    assert cycles == []


def test_cycle_finder_sees_a_cycle(tmp_path: Path) -> None:
    """The import reader resolves relative and in-function imports (else the test above is
    blind): a module importing its sibling inside a function is an edge."""
    path = tmp_path / "a.py"
    path.write_text("def f():\n    from . import control\n    import workers.tasks\n")
    found = _imports("workers.service.a", path)
    assert {"workers.service.control", "workers.tasks"} <= found
    assert "workers.service" not in found  # the submodule, not the package's __init__
    guarded = tmp_path / "c.py"
    guarded.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import rq\n")
    assert "rq" not in _imports("workers.engine.c", guarded)
    assert "rq" in _imports("workers.engine.c", guarded, type_checking=True)


def test_workers_top_level_stays_small() -> None:
    top = sorted(p.name for p in (ROOT / "workers").glob("*.py"))
    assert len(top) <= MAX_TOP_LEVEL_WORKER_MODULES, top


def test_no_file_over_the_line_limit() -> None:
    paths = [p for package in (*PACKAGES, "tests") for p in (ROOT / package).rglob("*.py")]
    long = sorted(
        f"{p.relative_to(ROOT)}: {n}"
        for p in paths
        if (n := len(p.read_text().splitlines())) > MAX_LINES
    )
    assert long == []


NETWORKS = ("llm", "flow", "hift")  # each network in one folder of workers/model


def test_each_network_lives_in_its_own_model_folder() -> None:
    model = ROOT / "workers" / "model"
    for network in NETWORKS:
        assert (model / network / "__init__.py").is_file(), f"workers/model/{network}/ missing"
    loose = sorted(
        p.name
        for p in model.glob("*.py")
        if p.stem.startswith(tuple(f"{n}_" for n in NETWORKS)) or p.stem in (*NETWORKS, "qwen2")
    )
    assert loose == [], f"network modules outside their folder: {loose}"
