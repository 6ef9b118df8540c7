"""The API key a running `weir up` leaves in its data dir for local tools.

(Beside `endpoints`: that file says where a running `weir up` answers, this
one lets a tool on the same machine in; `weir ctl` reads both.)

Theory of operation. Each node with an HTTP port makes, at start, a key of
its own, `local-<node id>`, with a random secret, stores it hashed like any
other key (`services.api.local`) and writes `key:secret` to
`<data-dir>/api.key`, mode 0600: whoever may read the node's data dir may
run it, as EMQX's `emqx ctl` and Mosquitto's control tools rely on the
files of the install. A new start makes a new secret (the old one stops
working); a clean stop revokes the key and removes the file. Written to a
temporary name (created 0600) and renamed: a reader sees a whole file or none.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Final

FILE_NAME: Final = "api.key"


def key_name(node_id: str) -> str:
    return f"local-{node_id}"


def path(data_dir: str | Path) -> Path:
    return Path(data_dir).resolve() / FILE_NAME


def write(data_dir: str | Path, key: str, secret: str) -> Path:
    """Write `key:secret` (mode 0600); OSError if the data dir cannot be written."""
    target = path(data_dir)
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = target.with_name(f".{FILE_NAME}.{os.getpid()}")
    fd = os.open(staging, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(f"{key}:{secret}\n")
    staging.replace(target)
    return target


def read(data_dir: str | Path) -> tuple[str, str] | None:
    """(key, secret) of the data dir's file, or None when it has none (or an unreadable one)."""
    try:
        text = path(data_dir).read_text().strip()
    except OSError:
        return None
    key, sep, secret = text.partition(":")
    return (key, secret) if sep and key and secret else None


def remove(data_dir: str | Path, key: str) -> None:
    """Remove the file if it holds `key` (another start's file is left alone)."""
    found = read(data_dir)
    if found is not None and found[0] == key:
        with contextlib.suppress(OSError):
            path(data_dir).unlink()
