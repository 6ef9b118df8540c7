"""Which core is imported: the mypyc build, or the sources (services/mqtt/__init__.py).

Each test copies the package's sources to a temporary directory, puts a
compiled module beside codec.py there, and imports services.mqtt.codec in a
child process from that directory. The "compiled module" is garbage bytes
under an extension module's name, so importing it fails loudly: a test that
expects the sources fails if the guard lets the .so through, and the one
that expects the .so proves the import system would have taken it. No C
compiler needed; the real build is checked by test_the_built_core_is_imported.
scripts/build_core.py runs on such a copy too, for the cases it builds nothing.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from importlib.machinery import EXTENSION_SUFFIXES
from pathlib import Path

import pytest

import services
from services.mqtt import sources_hash

SERVICES = Path(services.__file__).parent
CORE = SERVICES / "mqtt"
BUILD_CORE = SERVICES.parent / "scripts" / "build_core.py"
SO = EXTENSION_SUFFIXES[0]


def fake_build(tmp: Path, stamp: str | None) -> Path:
    """A copy of services/mqtt with a broken codec .so; `stamp`: 'match', 'stale' or None."""
    pkg = tmp / "services" / "mqtt"
    pkg.mkdir(parents=True)
    shutil.copy(SERVICES / "__init__.py", pkg.parent)
    for src in CORE.glob("*.py"):
        shutil.copy(src, pkg)
    (pkg / f"codec{SO}").write_bytes(b"not an extension module")
    if stamp is not None:
        source = pkg / "codec.py"
        (pkg / "_native.hash").write_text(sources_hash([source]) + " tools\n")
        if stamp == "stale":
            source.write_text(source.read_text() + "# edited after the build\n")
    return tmp


def import_codec(root: Path, pure: bool = False) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "WEIR_PURE"}
    if pure:
        env["WEIR_PURE"] = "1"
    return subprocess.run(
        [sys.executable, "-c", "import services.mqtt.codec as c; print(c.__file__)"],
        cwd=root, env=env, capture_output=True, text=True, check=False, timeout=60,
    )


def test_a_current_build_is_imported(tmp_path: Path) -> None:
    done = import_codec(fake_build(tmp_path, "match"))
    assert done.returncode != 0  # the import system took the (broken) .so
    assert "ImportError" in done.stderr


def test_weir_pure_imports_the_sources(tmp_path: Path) -> None:
    done = import_codec(fake_build(tmp_path, "match"), pure=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().endswith("codec.py")
    assert done.stderr == ""


@pytest.mark.parametrize("stamp", ["stale", None])
def test_sources_changed_since_the_build_are_imported_with_one_line(
    tmp_path: Path, stamp: str | None
) -> None:
    done = import_codec(fake_build(tmp_path, stamp))
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().endswith("codec.py")
    assert done.stderr.count("\n") == 1
    assert "changed since it was compiled" in done.stderr


@pytest.mark.skipif(not (CORE / "_native.hash").exists(), reason="no mypyc build here")
def test_the_built_core_is_imported() -> None:
    done = import_codec(SERVICES.parent)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().endswith(SO)
    assert done.stderr == ""


def run_build_core(root: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """scripts/build_core.py on the copy under `root` (it builds where it lies)."""
    (root / "scripts").mkdir()
    shutil.copy(BUILD_CORE, root / "scripts")
    base = {k: v for k, v in os.environ.items() if k not in ("WEIR_PURE", "CC")}
    return subprocess.run(
        [sys.executable, str(root / "scripts" / "build_core.py")],
        env={**base, **env}, capture_output=True, text=True, check=False, timeout=60,
    )


def test_build_without_a_compiler_is_pure_python_with_one_line(tmp_path: Path) -> None:
    root = fake_build(tmp_path, "stale")  # a build of older sources must not stay behind
    done = run_build_core(root, CC="/nonexistent/cc")
    assert done.returncode == 0
    why = "no C compiler (/nonexistent/cc)"
    assert done.stderr == f"setup: services/mqtt runs as pure Python: {why}\n"
    assert not list((root / "services" / "mqtt").glob(f"*{SO}"))
    assert import_codec(root).stdout.strip().endswith("codec.py")


def test_build_with_weir_pure_removes_the_build(tmp_path: Path) -> None:
    root = fake_build(tmp_path, "match")
    done = run_build_core(root, WEIR_PURE="1")
    assert done.returncode == 0
    assert done.stderr.count("\n") == 1
    mqtt = root / "services" / "mqtt"
    assert not list(mqtt.glob(f"*{SO}"))
    assert not (mqtt / "_native.hash").exists()
