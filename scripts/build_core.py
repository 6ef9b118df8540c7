"""Compile the pure protocol core (services/mqtt) with mypyc, in place.

Run by scripts/setup.sh with the virtualenv's Python. The built extension
modules land next to their sources (services/mqtt/*.so, git-ignored), where
the import system prefers them to the .py files; services/mqtt/__init__.py
imports the sources instead when they changed since the build, or when
WEIR_PURE=1.

- Builds only when the compiled sources (which, or what they say), mypy or
  Python changed since the last build (a hash in services/mqtt/_native.hash),
  so a re-run of setup.sh costs one hash of ~150 KB of source.
- Where it cannot build (no C compiler, a build error) it removes any built
  modules, prints ONE line, and exits 0: Weir runs as pure Python. The
  compiler's output is kept in build/mypyc/build.log.
- WEIR_PURE=1 skips the build and removes the built modules.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

from services.mqtt import sources_hash  # the recipe services/mqtt checks at import

ROOT = Path(__file__).resolve().parent.parent
CORE = ROOT / "services" / "mqtt"
BUILD = ROOT / "build" / "mypyc"
HASH_FILE = CORE / "_native.hash"
# The shared library mypyc puts every compiled module's code in; named inside
# the package so it is importable wherever `services` is (the editable
# install maps only the top-level packages, not the repository root).
GROUP = "services.mqtt._native"

# The modules compiled, everything in services/mqtt but these:
# - values.py: `@value` (typing.dataclass_transform around
#   dataclasses.dataclass) fails at import when compiled;
# - packets.py, actions.py: their `@value` records. mypyc does not know
#   `@value` as a dataclass decorator, so it would build them as non-native
#   classes, which fails at import (KeyError: 'object', mypyc's annotation
#   of a builtin type); as native classes they would need mypyc's
#   interpreted dataclass __init__, the cost `@value` exists to avoid.
#   Interpreted, they stay plain slotted classes that compiled code reads
#   through ordinary attribute access.
# - errors.py, channel_errors.py: compiled, an exception's class-level
#   `reason_code` reads as a missing instance attribute (AttributeError);
#   they are raised only on bad input, off the per-message path.
INTERPRETED = (
    "__init__.py", "values.py", "packets.py", "actions.py", "errors.py", "channel_errors.py",
)


def compiled_sources() -> list[Path]:
    return sorted(p for p in CORE.glob("*.py") if p.name not in INTERPRETED)


def build_key(paths: list[Path]) -> str:
    """What decides whether a build is current: the sources and the tools."""
    try:
        from mypy.version import __version__ as mypy_version
    except ImportError:
        mypy_version = "none"
    extra = f"{mypy_version} {sys.version}"
    return sources_hash(paths) + " " + hashlib.sha256(extra.encode()).hexdigest()[:16]


def remove_built() -> int:
    built = list(CORE.glob("*.so")) + list(CORE.glob("*.pyd"))
    for p in built:
        p.unlink()
    HASH_FILE.unlink(missing_ok=True)
    return len(built)


def have_compiler() -> str | None:
    """The reason none can be used, or None when a C compiler and headers exist."""
    cc = (os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc").split()[0]
    if shutil.which(cc) is None:
        return f"no C compiler ({cc})"
    if not Path(sysconfig.get_paths()["include"], "Python.h").exists():
        return "no Python headers (Python.h)"
    return None


def build(paths: list[Path]) -> str | None:
    """Build in place; the reason it failed, or None."""
    BUILD.mkdir(parents=True, exist_ok=True)
    setup = BUILD / "setup.py"
    names = [str(p.relative_to(ROOT)) for p in paths]
    setup.write_text(
        "from setuptools import setup\n"
        "from mypyc.build import mypycify\n"
        f"setup(name='weir-core', packages=[], ext_modules=mypycify({names!r}, "
        f"group_name={GROUP!r}, target_dir={str(BUILD / 'c')!r}))\n"
    )
    log = BUILD / "build.log"
    jobs = str(os.cpu_count() or 1)
    with log.open("w") as out:
        done = subprocess.run(
            [sys.executable, str(setup), "build_ext", "--inplace", "-j", jobs,
             "--build-lib", str(BUILD / "lib"), "--build-temp", str(BUILD / "tmp")],
            cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, check=False,
        )
    if done.returncode != 0:
        return f"the build failed (exit {done.returncode}; see {log.relative_to(ROOT)})"
    return None


def main() -> int:
    if os.environ.get("WEIR_PURE") == "1":
        if remove_built():
            print("setup: WEIR_PURE=1: removed the compiled services/mqtt modules", file=sys.stderr)
        return 0
    paths = compiled_sources()
    key = build_key(paths)
    if HASH_FILE.exists() and HASH_FILE.read_text().strip() == key:
        return 0
    remove_built()  # never leave modules compiled from other sources behind
    why = have_compiler()
    started = time.monotonic()
    if why is None:
        try:
            why = build(paths)
        except ImportError as e:  # mypyc or setuptools missing from the venv
            why = f"cannot build ({e})"
    if why is not None:
        remove_built()
        print(f"setup: services/mqtt runs as pure Python: {why}", file=sys.stderr)
        return 0
    HASH_FILE.write_text(key + "\n")
    took = time.monotonic() - started
    print(f"setup: compiled {len(paths)} services/mqtt modules with mypyc ({took:.0f} s)",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
