"""Where a running `weir up` can be reached, written into its data dir.

(Beside the launchers: the commands of every layer that talk to the embedded
default, `weir ban` and `weir passwd` among them, read it; it imports nothing
of services.)

Theory of operation. The embedded default starts its redis-server and Kafka
on free ports, so commands that talk to it (`weir streams verify`, `weir
ban`, `weir passwd --redis`, `weir ctl`) cannot know the URLs in advance.
When `weir up` (one node, or the supervisor of `--nodes` / `--workers`) is
ready it writes `<data-dir>/endpoints.json`: its pid, Redis URL, Kafka
bootstrap (both null on `--backend memory`), topic prefix, MQTT port, node
id and, for a node with an HTTP port, the API's address (`weir ctl`; each
node of `--nodes` writes its own file in its own data dir,
`<data-dir>/nodes/<id>/`, which is where `weir ctl` finds one). `find(data_dir)` reads it
back for those commands; a file whose pid no longer runs is a `weir up`
that was killed (SIGKILL leaves the file behind), reported as not running.
A clean stop removes the file (`remove`, only the writer's own).

The file is written to a temporary name and renamed: a reader sees the
whole file or none.
"""

from __future__ import annotations

import contextlib
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Final

FILE_NAME: Final = "endpoints.json"


class EndpointsError(Exception):
    """No running `weir up` found; the message is one line for the user."""


@dataclass(frozen=True, slots=True)
class Endpoints:
    pid: int
    redis_url: str | None  # None (and no Kafka): --backend memory
    kafka_bootstrap: str | None
    topic_prefix: str
    node_id: str
    mqtt: str  # host:port of the (first) node's MQTT listener
    http: str | None = None  # scheme://host:port of the HTTP API, when it has one


def path(data_dir: str | Path) -> Path:
    return Path(data_dir).resolve() / FILE_NAME


def write(data_dir: str | Path, endpoints: Endpoints) -> Path:
    target = path(data_dir)
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = target.with_name(f".{FILE_NAME}.{endpoints.pid}")
    staging.write_text(json.dumps(asdict(endpoints), indent=1) + "\n")
    staging.replace(target)
    return target


def announce(
    data_dir: str | Path, redis_url: str | None, kafka: str | None, topic_prefix: str,
    node_id: str, mqtt: str, http: str | None = None,
) -> None:
    """Write this process's endpoints into `data_dir`; a data dir that
    cannot be written is not an error (the commands need URLs then)."""
    found = Endpoints(os.getpid(), redis_url, kafka, topic_prefix, node_id, mqtt, http)
    with contextlib.suppress(OSError):
        write(data_dir, found)


def remove(data_dir: str | Path, pid: int | None = None) -> None:
    """Remove the file if it is `pid`'s (default: this process's)."""
    target = path(data_dir)
    with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
        if json.loads(target.read_text())["pid"] == (pid or os.getpid()):
            target.unlink()


def _running(pid: int) -> bool:
    """Whether `pid` runs and looks like a weir up (a killed one's pid may
    have been given to another process since)."""
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, PermissionError):  # gone, or someone else's process
        return False
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:  # no /proc here: the pid alone says it
        return True
    return b"weir" in cmdline or b"services" in cmdline


HINT: Final = "start one with `weir up`, or name the backends (--redis / --kafka)"


def find(data_dir: str | Path, hint: str = HINT) -> Endpoints:
    """The endpoints of the `weir up` running on `data_dir`, or EndpointsError
    (its message ending with `hint`: what the command could be given instead)."""
    target = path(data_dir)
    try:
        doc = json.loads(target.read_text())
        found = Endpoints(**doc)
    except FileNotFoundError:
        raise EndpointsError(
            f"no weir up is running on data dir {target.parent} (no {FILE_NAME}); {hint}"
        ) from None
    except (OSError, ValueError, TypeError) as exc:
        raise EndpointsError(f"unreadable {target}: {exc}") from None
    if not _running(found.pid):
        raise EndpointsError(
            f"no weir up is running on data dir {target.parent} (pid {found.pid} of "
            f"{FILE_NAME} is gone: stopped or killed); {hint}"
        )
    return found


def running(data_dir: str | Path, prog: str, code: int = 1) -> Endpoints:
    """For a command (`prog`, a click command): `find`, or one line on stderr
    naming the command and exit `code` (its "cannot reach" code) when no weir
    up runs there."""
    import sys

    import click

    try:
        return find(data_dir)
    except EndpointsError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        raise click.exceptions.Exit(code) from None


def backends(data_dir: str | Path, prog: str, code: int = 1) -> tuple[str, str, str]:
    """`running`'s Redis URL, Kafka bootstrap and topic prefix; one line and
    exit `code` when that weir up has none (`--backend memory`)."""
    found = running(data_dir, prog, code)
    if found.redis_url is None or found.kafka_bootstrap is None:
        import sys

        import click

        print(f"{prog}: the weir up on data dir {Path(data_dir).resolve()} runs --backend "
              "memory: it has no Redis or Kafka", file=sys.stderr)  # fmt: skip
        raise click.exceptions.Exit(code)
    return found.redis_url, found.kafka_bootstrap, found.topic_prefix


__all__ = [
    "Endpoints", "EndpointsError", "announce", "backends", "find", "path", "remove", "running",
    "write",
]  # fmt: skip
