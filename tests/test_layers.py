"""The package's layers: a module imports only from its own layer or those below it.

Why a test: a downward-only graph is what lets the gateway process run without the worker stack,
the compiler run without a server, and a module be read without the ones above it. The layers,
lowest first; a package may use any package of a lower layer. Read from the source with ``ast``
(imports inside functions count too: a lazy import is still a dependency).

Inside the gateway, rooms by role: the request core knows no transport, each transport (HTTP,
the WebSocket, Wyoming) knows the core and no other transport, and only the composition root
(``app``, ``server``) knows them all. And no module imports, even only for type checking, a
module that imports it back: a circle is a seam in the wrong place.
"""

from __future__ import annotations

import ast
from pathlib import Path

import ttsvc

LAYERS = (
    {"errors", "__version__"},
    {"protocol"},
    {"observability", "voice", "windows", "cpus", "memory", "ranges"},
    {"balancer", "audio", "text", "repository"},
    {"config"},
    {"backends"},
    {"synthesis"},
    {"compile", "worker"},
    {"pool"},
    {"lifecycle"},
    {"gateway"},
    {"cli", "__main__"},
)
CARRIERS = {"ttsvc.worker.entry", "ttsvc.worker.plan"}
"""Worker modules the pool and gateway may name: the spawn target (it imports the worker stack
only in the spawned process) and the compute plan the gateway sends to each worker."""


def _rank(package: str) -> int:
    return next(i for i, layer in enumerate(LAYERS) if package in layer)


def _imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("ttsvc"):
            if node.module == "ttsvc":
                found |= {f"ttsvc.{alias.name}" for alias in node.names}
            else:
                found.add(node.module)
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("ttsvc.")}
    return found


def test_every_import_goes_down_the_layers() -> None:
    root = Path(ttsvc.__file__).parent
    upward = []
    for path in sorted(root.rglob("*.py")):
        package = path.relative_to(root).parts[0].removesuffix(".py")
        if package == "__init__":
            continue
        for module in _imports(path):
            target = module.split(".")[1]
            if target == package or module in CARRIERS:
                continue
            if _rank(target) > _rank(package):
                upward.append(f"{path.relative_to(root)} imports {module}")
    assert upward == []


GATEWAY_ROOMS = {"core": set(), "http": {"core"}, "ws": {"core"}, "wyoming": {"core"},
                 "app": {"core", "http", "ws", "wyoming"},
                 "server": {"core", "http", "ws", "wyoming", "app"}}  # fmt: skip
"""Each room of ``ttsvc.gateway`` and the rooms it may import."""


def _module(root: Path, path: Path) -> str:
    parts = path.relative_to(root.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def test_gateway_rooms_import_only_the_rooms_below() -> None:
    root = Path(ttsvc.__file__).parent
    crossing = []
    for path in sorted((root / "gateway").rglob("*.py")):
        parts = path.relative_to(root / "gateway").with_suffix("").parts
        if parts == ("__init__",):
            continue
        room = parts[0]
        assert room in GATEWAY_ROOMS, f"gateway/{room} is a room the layer test does not know"
        for module in _imports(path):
            if not module.startswith("ttsvc.gateway."):
                continue
            target = module.split(".")[2]
            if target != room and target not in GATEWAY_ROOMS[room]:
                crossing.append(f"{path.relative_to(root)} imports {module}")
    assert crossing == []


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return circles


def test_no_import_circles_even_for_type_checking() -> None:
    root = Path(ttsvc.__file__).parent
    modules = {_module(root, path): path for path in root.rglob("*.py")}
    graph = {name: {m for m in _imports(path) if m in modules} - {name}
             for name, path in modules.items()}  # fmt: skip
    assert _circles(graph) == []


def test_the_circle_check_finds_a_type_only_circle(tmp_path: Path) -> None:
    """The check above must be able to fail: two modules that import each other, one only for
    type checking, are a circle in the same reading of imports."""
    (tmp_path / "a.py").write_text("from ttsvc.b import thing\n")
    (tmp_path / "b.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ttsvc.a import x\n"
    )
    (tmp_path / "c.py").write_text("import ttsvc.a\n")
    graph = {f"ttsvc.{n}": _imports(tmp_path / f"{n}.py") for n in "abc"}
    assert _circles(graph) == [["ttsvc.a", "ttsvc.b"]]
