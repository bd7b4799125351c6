"""The package's floors: every import, at module level or inside a function, points down or
sideways, and no set of modules imports each other in a loop.

Floors, from the ground: core (config, store, migrations, serving) → collector and demo →
analytics → dashboard → app (the command line and the processes it runs). A deferred import
is still an import here, so a circle cannot hide behind one.
"""

from __future__ import annotations

import ast
from pathlib import Path

import servelens

PACKAGE = Path(servelens.__file__).parent
FLOORS = {"core": 1, "collector": 2, "demo": 2, "analytics": 3, "dashboard": 4, "app": 5, "__main__": 5}


def _module(path: Path) -> str:
    parts = ["servelens", *path.relative_to(PACKAGE).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, module: str) -> set[str]:
    """The servelens modules `path` imports (`from a import b` counts a.b when b is a module)."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            found.add(base)
            found.update(f"{base}.{a.name}" for a in node.names)
    return {name for name in found if name.startswith("servelens")}


def _graph() -> dict[str, set[str]]:
    files = {_module(p): p for p in PACKAGE.rglob("*.py")}
    return {m: {i for i in _imports(p, m) if i in files and i != m} for m, p in files.items()}


def _floor(module: str) -> int:
    parts = module.split(".")
    return FLOORS.get(parts[1], 0) if len(parts) > 1 else 0


def test_the_package_is_one_namespace_with_its_data() -> None:
    assert (PACKAGE / "core" / "migrations" / "0001_otel_traces.sql").is_file()
    assert (PACKAGE / "collector" / "mapping" / "schemas" / "otlp_traces.proto").is_file()
    top = {_module(p).split(".")[1] for p in PACKAGE.rglob("*.py") if p.parent != PACKAGE}
    assert top <= set(FLOORS), f"a folder with no floor: {top - set(FLOORS)}"


def test_no_import_runs_back_up_a_floor() -> None:
    upward = sorted(f"{m} (floor {_floor(m)}) imports {i} (floor {_floor(i)})"
                    for m, deps in _graph().items() for i in deps if _floor(i) > _floor(m))
    assert upward == []


def test_no_modules_import_each_other_in_a_loop() -> None:
    graph = _graph()
    # Tarjan's strongly connected components: any component of two or more is a circle.
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    assert circles == []


def test_the_walk_sees_a_planted_circle(tmp_path: Path) -> None:
    """The walk itself: two modules that import each other (one inside a function) are found."""
    (tmp_path / "a.py").write_text("from servelens.x import b\n")
    (tmp_path / "b.py").write_text("def f():\n    from servelens.x import a\n")
    assert _imports(tmp_path / "a.py", "servelens.x.a") == {"servelens.x", "servelens.x.b"}
    assert _imports(tmp_path / "b.py", "servelens.x.b") == {"servelens.x", "servelens.x.a"}
