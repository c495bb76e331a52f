"""The package's layers: a module imports only from its own layer or those below it.

Why a test: a downward-only graph is what lets the gateway process run without the worker stack,
the compiler run without a server, and a module be read without the ones above it. The layers,
lowest first; a package may use any package of a lower layer. Read from the source with ``ast``
(imports inside functions count too: a lazy import is still a dependency).
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
