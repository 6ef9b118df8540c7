"""The import contracts of services/, streams/ and bench/ (docs/architecture.md 1).

Every import counts: top level, inside functions, and under TYPE_CHECKING.
- the layers of services/, the order of the parts of services/broker and no
  import cycle anywhere: import-linter's contracts in pyproject.toml
  ([tool.importlinter]), run here so the suite fails on a violation;
- services/mqtt and services/state/keys.py import only the standard library;
- streams/ imports only the event schema, the settings (services.config),
  the CLI's parts, the state's key layout and where a running weir up is
  (services.embedded.endpoints) from services.
The last two are allow-lists, which a test says more plainly than
import-linter's forbidden-module lists would.
"""

from __future__ import annotations

import ast
import enum
import importlib
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

STREAMS_MAY_IMPORT = (
    "services.event.schema", "services.config", "services.cli", "services.state.keys",
    "services.embedded.endpoints",  # where a running weir up is (reads a file; imports nothing)
)  # fmt: skip


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


def test_the_import_contracts_hold() -> None:
    """lint-imports (import-linter) checks [tool.importlinter] in pyproject.toml."""
    lint = Path(sys.executable).parent / "lint-imports"
    done = subprocess.run(
        [str(lint), "--no-cache", "--no-logo", str(ROOT / "pyproject.toml")],
        cwd=ROOT, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 broken" in done.stdout


PURE = ("services.mqtt", "services.state.keys")  # the protocol core; the key layout streams read


@pytest.mark.parametrize("pure", PURE)
def test_pure_modules_import_only_the_standard_library(pure: str) -> None:
    stdlib = set(sys.stdlib_module_names) | {"__future__"}
    bad = [
        f"{name} imports {target}"
        for name, path in SERVICES.items()
        if name == pure or name.startswith(pure + ".")
        for target in _imports(name, path)
        if target.split(".")[0] not in stdlib and not target.startswith(pure)
    ]
    assert SERVICES.keys() & {pure}
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


# A class's behaviour lives in one module: a base from another module of
# services/ must be an interface (a Protocol, an ABC), an error tree or an
# Enum, never a concrete class the subclass finishes (issue 17: channel.py was
# cut in two by a base class whose hooks raised NotImplementedError). A part in
# another module is composed: held and called, not inherited.
CONTRACT_BASES = ("typing.Protocol", "abc.ABC")
INHERITS_ACROSS_MODULES = {
    # Reported, not a split for the line cap: the memory session store *is* the
    # table of client records the memory queue store reads (records.py).
    "services.session.memory.MemorySessionStore": "services.store.records.ClientRecords",
}


def _bindings(name: str, path: Path) -> tuple[dict[str, str], dict[str, ast.ClassDef]]:
    """A module's imported names (local -> absolute) and its top-level classes."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:  # import a.b binds a; import a.b as c binds c to a.b
                top = alias.name.split(".")[0]
                names[alias.asname or top] = alias.name if alias.asname else top
        elif isinstance(node, ast.ImportFrom):
            stem = node.module or ""
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                stem = ".".join([*base, *([node.module] if node.module else [])])
            for alias in node.names:
                names[alias.asname or alias.name] = f"{stem}.{alias.name}"
    classes = {c.name: c for c in tree.body if isinstance(c, ast.ClassDef)}
    return names, classes


BINDINGS = {name: _bindings(name, path) for name, path in SERVICES.items()}


def _resolve(module: str, expr: ast.expr) -> str:
    """The absolute name of a base class expression written in `module`."""
    while isinstance(expr, ast.Subscript):  # Generic[V], _Entries[V]
        expr = expr.value
    dotted = ast.unparse(expr)
    head, _, rest = dotted.partition(".")
    names, classes = BINDINGS[module]
    if head in classes:
        full = f"{module}.{dotted}"
    elif head in names:
        full = ".".join(filter(None, [names[head], rest]))
    else:
        full = f"builtins.{dotted}"
    for _ in range(5):  # follow re-exports to the module that defines the class
        owner, _, cls = full.rpartition(".")
        if owner not in BINDINGS or cls in BINDINGS[owner][1] or cls not in BINDINGS[owner][0]:
            break
        full = BINDINGS[owner][0][cls]
    return full


def _is_contract(full: str, seen: frozenset[str] = frozenset()) -> bool:
    """A Protocol, an ABC, an exception or an Enum (directly or through its bases)."""
    owner, _, cls = full.rpartition(".")
    if owner in BINDINGS:
        node = BINDINGS[owner][1].get(cls)
        if node is None or full in seen:
            return False
        meta = [ast.unparse(k.value) for k in node.keywords if k.arg == "metaclass"]
        if any(m.endswith("ABCMeta") for m in meta):
            return True
        return any(_is_contract(_resolve(owner, b), seen | {full}) for b in node.bases)
    if full in CONTRACT_BASES:
        return True
    try:
        found = getattr(importlib.import_module(owner), cls)
    except (ImportError, AttributeError):
        return False
    return isinstance(found, type) and issubclass(found, (BaseException, enum.Enum))


def test_no_class_is_finished_by_a_subclass_in_another_module() -> None:
    across = {
        f"{name}.{cls.name}": base
        for name in BINDINGS
        for cls in BINDINGS[name][1].values()
        for base in (_resolve(name, b) for b in cls.bases)
        if base.rpartition(".")[0] in BINDINGS
        and base.rpartition(".")[0] != name
        and not _is_contract(base)
    }
    assert across == INHERITS_ACROSS_MODULES


def test_the_inheritance_check_sees_a_split_class() -> None:
    """The check above resolves what it must: contracts pass, a concrete base does not."""
    assert _is_contract("services.mqtt.channel_errors.RetainNotSupported")  # MQTTError
    assert _is_contract("services.cluster.frames.LinkHandler")  # a Protocol
    assert _is_contract("services.config.settings.Backend")  # enum.StrEnum
    assert not _is_contract("services.store.records.ClientRecords")
    written = ast.parse("ClientRecords", mode="eval").body
    assert _resolve("services.session.memory", written) == "services.store.records.ClientRecords"
