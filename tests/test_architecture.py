"""The import contracts of services/, streams/ and bench/ (docs/architecture.md 1).

Every import counts: top level, inside functions, and under TYPE_CHECKING.
- the layers of services/, the order of the parts of services/broker and no
  import cycle anywhere: import-linter's contracts in pyproject.toml
  ([tool.importlinter]), run here so the suite fails on a violation;
- services/mqtt and services/state/keys.py import only the standard library;
- streams/ imports only the event schema, the settings (services.config),
  the CLI's parts and the state's key layout from services.
The last two are allow-lists, which a test says more plainly than
import-linter's forbidden-module lists would.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

STREAMS_MAY_IMPORT = (
    "services.event.schema", "services.config", "services.cli", "services.state.keys",
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
