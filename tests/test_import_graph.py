"""The import graph of ``memories_core`` has no circles.

The graph is read from the source with ``ast``: an edge is a module-level import of another
``memories_core`` module. Imports under ``if TYPE_CHECKING:`` never run, so they never count.
Two granularities are checked: single modules, and the top-level parts of the package
(``memories_core.retrieval``, ``memories_core.llms``, ...) with every module folded into its
part. A second graph adds the imports inside functions: they run on first call, and a circle
through one is a circle of design that a lazy import only hides. The one exception is a
deprecated location, whose ``__getattr__`` forwards old names to their new home.
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Iterable, Mapping
from pathlib import Path

import pytest

import memories_core

ROOT = Path(memories_core.__file__).parent
PACKAGE = "memories_core"


def _modules() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for path in ROOT.rglob("*.py"):
        parts = [PACKAGE, *path.relative_to(ROOT).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _is_type_checking(test: ast.expr) -> bool:
    return any(
        isinstance(node, ast.Name | ast.Attribute)
        and (getattr(node, "id", None) or getattr(node, "attr", None)) == "TYPE_CHECKING"
        for node in ast.walk(test)
    )


def _module_level_imports(body: Iterable[ast.stmt]) -> Iterable[ast.Import | ast.ImportFrom]:
    """Import statements that run when the module is imported (not functions, not typing)."""
    for node in body:
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        elif isinstance(node, ast.If):
            if not _is_type_checking(node.test):
                yield from _module_level_imports(node.body)
            yield from _module_level_imports(node.orelse)
        elif isinstance(node, ast.Try):
            yield from _module_level_imports(node.body)
            for handler in node.handlers:
                yield from _module_level_imports(handler.body)
            yield from _module_level_imports(node.orelse)
            yield from _module_level_imports(node.finalbody)
        elif isinstance(node, ast.With):
            yield from _module_level_imports(node.body)


def _targets(node: ast.Import | ast.ImportFrom, name: str, is_package: bool, known: set[str]):
    if isinstance(node, ast.Import):
        for alias in node.names:
            parts = alias.name.split(".")
            while parts and ".".join(parts) not in known:
                parts.pop()
            if parts:
                yield ".".join(parts)
        return
    if node.level:
        base = name.split(".") if is_package else name.split(".")[:-1]
        base = base[: len(base) - (node.level - 1)]
        module = ".".join([*base, *([node.module] if node.module else [])])
    else:
        module = node.module or ""
    for alias in node.names:
        submodule = f"{module}.{alias.name}"
        if submodule in known:
            yield submodule
        elif module in known:
            yield module


def _all_imports(body: Iterable[ast.AST]) -> Iterable[ast.Import | ast.ImportFrom]:
    """Every import statement that can run: module level and inside functions (not typing)."""
    for node in body:
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        elif isinstance(node, ast.If) and _is_type_checking(node.test):
            yield from _all_imports(node.orelse)
        else:
            yield from _all_imports(ast.iter_child_nodes(node))


#: Deprecated locations: their ``__getattr__`` imports the new home of each moved name.
DEPRECATED_LOCATIONS = frozenset({"memories_core.llms.rule_following"})


@functools.cache
def import_graph(*, lazy: bool = False) -> dict[str, frozenset[str]]:
    """``module -> modules it imports at module level``, for every module of the package.

    With ``lazy``, imports inside functions count too (except in a deprecated location).
    Read once per test session (callers must not change it).
    """
    modules = _modules()
    known = set(modules)
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        is_package = path.name == "__init__.py"
        found = (
            _all_imports(tree.body)
            if lazy and name not in DEPRECATED_LOCATIONS
            else _module_level_imports(tree.body)
        )
        for node in found:
            graph[name].update(_targets(node, name, is_package, known))
        graph[name].discard(name)
    return {name: frozenset(targets) for name, targets in graph.items()}


def folded(graph: Mapping[str, Iterable[str]]) -> dict[str, set[str]]:
    """The graph with every module folded into its top-level part of the package."""

    def part(name: str) -> str:
        return ".".join(name.split(".")[:2])

    parts: dict[str, set[str]] = {part(name): set() for name in graph}
    for name, targets in graph.items():
        parts[part(name)].update(part(t) for t in targets if part(t) != part(name))
    return parts


def cycles(graph: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """Strongly connected components with more than one member (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_no_module_imports_itself_back() -> None:
    graph = import_graph()
    assert len(graph) > 100  # the whole package was read
    assert cycles(graph) == []


def test_no_part_of_the_package_imports_itself_back() -> None:
    parts = folded(import_graph())
    assert {"memories_core.llms", "memories_core.prompts", "memories_core.retrieval"} <= set(parts)
    assert cycles(parts) == []


def test_no_circle_hides_behind_a_lazy_import() -> None:
    """Imports inside functions count too: a lazy import may defer a cost, not a circle."""
    graph = import_graph(lazy=True)
    assert sum(map(len, graph.values())) > sum(map(len, import_graph().values()))
    assert cycles(graph) == []
    assert cycles(folded(graph)) == []
    for name in DEPRECATED_LOCATIONS:  # the exception is only a forwarding module
        source = _modules()[name].read_text(encoding="utf-8")
        assert "DeprecationWarning" in source and "def __getattr__" in source


def test_a_function_import_is_found_by_the_lazy_reading() -> None:
    source = (
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    import memories_core.engine\n"
        "def f():\n    import memories_core.types\n"
        "class C:\n    def g(self):\n        if True:\n            import memories_core.clock\n"
    )
    known = set(_modules())
    found = {
        target
        for node in _all_imports(ast.parse(source).body)
        for target in _targets(node, "memories_core.x", False, known)
    }
    assert found == {"memories_core.types", "memories_core.clock"}


def test_the_named_circles_are_gone() -> None:
    """Prompts build on the LLM layer, retrieval parts on ``retrieval.base``, not back."""
    graph = import_graph()
    parts = folded(graph)
    assert "memories_core.prompts" not in parts["memories_core.llms"]
    assert "memories_core.retrieval" not in parts["memories_core.embedders"]
    for name in ("context", "entity", "temporal", "store_backend", "keys", "rerankers"):
        assert "memories_core.retrieval.pipeline" not in graph[f"memories_core.retrieval.{name}"]
    lazy = import_graph(lazy=True)
    assert "memories_core.retrieval.hybrid" not in lazy["memories_core.retrieval.pipeline"]
    assert "memories_core.filters.expr" not in lazy["memories_core.filters.sql"]
    assert "memories_core.engine" not in lazy["memories_core.retrieval.late_vectors"]


def test_the_checker_finds_a_circle() -> None:
    """The cycle finder is not vacuous: a planted circle (and only it) is reported."""
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert cycles(graph) == [["a", "b", "c"]]
    assert cycles(
        folded(
            {
                "memories_core.x.a": {"memories_core.y.b"},
                "memories_core.y.b": {"memories_core.x.c"},
                "memories_core.x.c": set(),
            }
        )
    ) == [["memories_core.x", "memories_core.y"]]


def test_type_checking_and_function_imports_do_not_count(tmp_path: Path) -> None:
    source = (
        "from typing import TYPE_CHECKING\n"
        "import memories_core.errors\n"
        "if TYPE_CHECKING:\n    import memories_core.engine\n"
        "def f():\n    import memories_core.types\n"
    )
    tree = ast.parse(source)
    names = {
        target
        for node in _module_level_imports(tree.body)
        for target in _targets(node, "memories_core.x", False, set(_modules()))
    }
    assert names == {"memories_core.errors"}


def test_no_module_is_over_800_lines() -> None:
    """A concern that outgrows one module becomes a package (re-exporting its old names)."""
    sizes = {
        name: len(path.read_text(encoding="utf-8").splitlines())
        for name, path in _modules().items()
    }
    assert {name: n for name, n in sizes.items() if n > 800} == {}


def test_the_deprecated_location_still_forwards_with_a_warning() -> None:
    from memories_core.llms import rule_following as old
    from memories_core.prompts import rule_following as new

    with pytest.warns(DeprecationWarning, match="prompts.rule_following"):
        moved = old.rule_following_reply
    assert moved is new.rule_following_reply
    with pytest.raises(AttributeError):
        _ = old.nothing_here
