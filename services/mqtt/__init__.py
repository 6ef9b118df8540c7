"""The MQTT protocol core: codec and channel, pure (standard library only).

scripts/setup.sh compiles most of these modules with mypyc where a C
compiler exists (scripts/build_core.py); the extension modules sit next to
the sources, and the import system prefers them. Two cases must import the
sources instead, decided here, before any submodule is imported:

- WEIR_PURE=1: the pure-Python core on purpose (CI runs tests/mqtt so too);
- the sources changed since the build (an edit, a checkout): the compiled
  modules would silently run the old code. One line on stderr says so;
  scripts/setup.sh rebuilds.

Both work by giving this package's directory a path finder that knows only
source and bytecode files, so the .so files beside them are not seen.
"""

from __future__ import annotations

from pathlib import Path


def sources_hash(paths: list[Path]) -> str:
    """What a build of these sources is stamped with (services/mqtt/_native.hash)."""
    import hashlib

    h = hashlib.sha256()
    for p in sorted(paths):
        h.update(p.name.encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()


def _prefer_sources() -> bool:
    """Whether the sources must be imported although compiled modules exist."""
    import os
    import sys

    here = Path(__file__).parent
    built = [here / (p.name.split(".", 1)[0] + ".py") for p in here.glob("*.so")]
    if not built:
        return False
    if os.environ.get("WEIR_PURE") == "1":
        return True
    # The sources of the modules with a compiled one beside them, hashed as
    # scripts/build_core.py did after its build; ~1 ms, once per process.
    stamp = here / "_native.hash"
    stamped = stamp.read_text().split(" ", 1)[0] if stamp.exists() else ""
    if sources_hash([p for p in built if p.exists()]) == stamped:
        return False
    print(
        "weir: services/mqtt changed since it was compiled; importing the sources "
        "(scripts/setup.sh rebuilds)",
        file=sys.stderr,
    )
    return True


def _import_sources() -> None:
    import sys
    from importlib.machinery import (
        BYTECODE_SUFFIXES,
        SOURCE_SUFFIXES,
        FileFinder,
        SourceFileLoader,
        SourcelessFileLoader,
    )

    for entry in __path__:
        sys.path_importer_cache[entry] = FileFinder(
            entry, (SourceFileLoader, SOURCE_SUFFIXES), (SourcelessFileLoader, BYTECODE_SUFFIXES)
        )


if _prefer_sources():
    _import_sources()
