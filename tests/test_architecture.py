"""The import contract of services/ (docs/architecture.md 1): arrows point down.

Every import counts: top level, inside functions, and under TYPE_CHECKING.
- services/mqtt imports only the standard library (and itself);
- no import cycle among the modules of services/;
- a package imports only packages of a lower layer: siblings (session,
  queue, retain, cluster, ...) never import each other;
- streams/ imports only the event schema, the settings and the CLI's parts from services.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

LAYERS = {
    "tasks": -1,  # asyncio helpers for every layer; imports nothing of Weir
    "config": 0,  # the settings tree, each option declared once, and its loader
    "cli": 1,  # the one click command line's shared parts (errors, lazy groups)
    "mqtt": 0,
    "store": 1,  # what session and queue stores share: Redis plumbing, the message format
    "embedded": 1,  # launchers of the embedded redis-server and Kafka
    "event": 1,
    "session": 2,
    "queue": 2,
    "retain": 2,
    "cluster": 2,
    "auth": 2,
    "hooks": 2,
    "metrics": 2,
    "state": 2,  # the log's state: the reference fold, the state store's records, drift
    "machine": 2,  # process lifecycle: backends, supervisor, pid files, drain, Spark child
    "broker": 3,  # the pub/sub parts of one node
    "listener": 4,  # sockets and connections over the broker's ports
    "node": 5,  # one process: composition root, start/stop order, bootstrap
    "admin": 6,  # REST API, CLI, dashboard: over the node
    "__main__": 7,
}
STREAMS_MAY_IMPORT = ("services.event.schema", "services.config", "services.cli")


def _modules(top: str) -> dict[str, Path]:
    out: dict[str, Path] = {}
    for path in sorted((ROOT / top).rglob("*.py")):
        name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        out[name.removesuffix(".__init__")] = path
    return out


def _imports(name: str, path: Path) -> Iterator[str]:
    """Every module name `name` imports, absolute."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                stem = ".".join([*base, *([node.module] if node.module else [])])
            else:
                stem = node.module or ""
            yield stem
            yield from (f"{stem}.{alias.name}" for alias in node.names)


SERVICES = _modules("services")


def _edges() -> dict[str, set[str]]:
    return {
        name: {t for t in _imports(name, path) if t in SERVICES and t != name}
        for name, path in SERVICES.items()
    }


def _package(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def test_every_package_has_a_layer() -> None:
    packages = {_package(m) for m in SERVICES if m != "services"}
    assert packages <= LAYERS.keys(), f"packages without a layer: {packages - LAYERS.keys()}"


def test_mqtt_imports_only_the_standard_library() -> None:
    stdlib = set(sys.stdlib_module_names) | {"__future__"}
    bad = [
        f"{name} imports {target}"
        for name, path in SERVICES.items()
        if name.startswith("services.mqtt")
        for target in _imports(name, path)
        if target.split(".")[0] not in stdlib and not target.startswith("services.mqtt")
    ]
    assert bad == []


def test_no_import_cycle() -> None:
    edges = _edges()
    state: dict[str, int] = {}  # 1 on the stack, 2 done
    cycles: list[list[str]] = []

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(edges[node]):
            if state.get(nxt) == 1:
                cycles.append([*stack[stack.index(nxt) :], nxt])
            elif nxt not in state:
                visit(nxt, stack)
        stack.pop()
        state[node] = 2

    for node in sorted(edges):
        if node not in state:
            visit(node, [])
    assert cycles == [], "import cycles: " + "; ".join(" -> ".join(c) for c in cycles)


def test_packages_import_only_lower_layers() -> None:
    bad = sorted(
        f"{source} imports {target}"
        for source, targets in _edges().items()
        for target in targets
        if source != "services"
        and _package(source) != _package(target)
        and LAYERS[_package(target)] >= LAYERS[_package(source)]
    )
    assert bad == []


@pytest.mark.parametrize("name", sorted(_modules("streams")))
def test_streams_import_only_the_event_schema_and_settings(name: str) -> None:
    path = _modules("streams")[name]
    bad = [
        t
        for t in _imports(name, path)
        if t.startswith("services") and not t.startswith(STREAMS_MAY_IMPORT)
    ]
    assert bad == []


MAX_MODULE_LINES = 500  # a module reads in one sitting (STYLE 4)


def test_no_module_is_past_the_line_budget() -> None:
    long = {
        name: n
        for name, path in SERVICES.items()
        if (n := len(path.read_text(encoding="utf-8").splitlines())) > MAX_MODULE_LINES
    }
    assert long == {}
