"""Where the supervisor of `weir up --nodes N` / `--workers N` keeps each
node's pid and log, and how a reader tells a live pid file from a stale one.

Layout, under the data dir: `nodes/<id>.pid` (the pid, one line, written
at each start of the node, removed when it is stopped, drained or given
up on), `nodes/<id>.log` (its stdout and stderr, appended across restarts)
and `nodes/<id>/` (its own data dir). A pid file whose process is gone, or
whose pid now belongs to another process (pids are reused), is stale: the
process must be a `weir up` whose command line names this node id.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path

import psutil

NODES_DIR = "nodes"
PID_SUFFIX = ".pid"


def nodes_dir(data_dir: str | Path) -> Path:
    return Path(data_dir).resolve() / NODES_DIR


@dataclass(frozen=True, slots=True)
class NodeFiles:
    node_id: str
    root: Path  # <data-dir>/nodes

    @property
    def pid(self) -> Path:
        return self.root / f"{self.node_id}{PID_SUFFIX}"

    @property
    def log(self) -> Path:
        return self.root / f"{self.node_id}.log"

    @property
    def data(self) -> Path:
        return self.root / self.node_id

    def write_pid(self, pid: int) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        staged = self.pid.with_suffix(".pid.tmp")
        staged.write_text(f"{pid}\n")
        staged.replace(self.pid)  # a reader never sees half a pid

    def remove_pid(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.pid.unlink()


def node_ids(data_dir: str | Path) -> list[str]:
    """The ids of the nodes with a pid file under `data_dir`, sorted."""
    root = nodes_dir(data_dir)
    if not root.is_dir():
        return []
    return sorted(p.name.removesuffix(PID_SUFFIX) for p in root.glob(f"*{PID_SUFFIX}"))


class StalePidFile(Exception):
    """The pid file is missing, unreadable, or names no running node; the message is one line."""


def live_pid(files: NodeFiles) -> int:
    """The pid of the running node `files` describes, or StalePidFile."""
    try:
        text = files.pid.read_text()
    except FileNotFoundError:
        raise StalePidFile(f"no pid file {files.pid}") from None
    except OSError as exc:
        raise StalePidFile(f"cannot read {files.pid}: {exc.strerror or exc}") from None
    try:
        pid = int(text.strip())
    except ValueError:
        raise StalePidFile(f"{files.pid} holds no pid ({text.strip()[:20]!r})") from None
    if pid <= 0 or not _runs_node(pid, files.node_id):
        raise StalePidFile(f"stale pid file {files.pid}: pid {pid} is not node {files.node_id}")
    return pid


def _runs_node(pid: int, node_id: str) -> bool:
    try:
        args = psutil.Process(pid).cmdline()  # a zombie's is empty
    except psutil.NoSuchProcess:  # gone (a zombie's cmdline raises ZombieProcess, one of these)
        return False
    except psutil.AccessDenied:  # not ours to read: whether the pid is alive is all we can tell
        return True
    named = [args[i + 1] for i, a in enumerate(args[:-1]) if a == "--node-id"]
    return bool(named) and named[-1] == node_id and "up" in args
