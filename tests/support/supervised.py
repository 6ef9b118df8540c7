"""`weir up --nodes N` / `--workers N` as a subprocess, and the processes it leaves.

`Supervised` runs the supervisor with its output in a file and waits (with
deadlines) for the lines it prints: a node's ready line, a death, a
restart. `descendants` and `alive` read /proc, so a test can name every
process the supervisor started and check that each is gone.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

from services.machine.pidfiles import NodeFiles, nodes_dir
from tests.support.childenv import weir_env
from tests.support.wait import wait_until

REPO = Path(__file__).resolve().parents[2]
START_S = 60.0  # backends plus N node starts on a shared two-core machine
STOP_S = 90.0


def descendants(pid: int) -> set[int]:
    """Every process below `pid` (children, their children...)."""
    parents: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            parents.setdefault(ppid, []).append(int(entry))
    found, todo = set(), [pid]
    while todo:
        for child in parents.get(todo.pop(), []):
            found.add(child)
            todo.append(child)
    return found


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


class Supervised:
    """One `python -m services up <args>` with its stdout and stderr in `out`."""

    def __init__(self, tmp: Path, *args: str, node_id: str = "w") -> None:
        self.data = tmp / "data"
        self.out = tmp / "up.log"
        self.node_id = node_id
        env = weir_env()
        argv = [
            sys.executable, "-m", "services", "up", *args, "--node-id", node_id,
            "--host", "127.0.0.1", "--data-dir", str(self.data),
        ]  # fmt: skip
        with self.out.open("wb") as out:
            self.proc = subprocess.Popen(
                argv, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, env=env,
                start_new_session=True,
            )  # fmt: skip

    def text(self) -> str:
        return self.out.read_text(errors="replace")

    def wait_for(self, needle: str, count: int = 1, timeout: float = START_S) -> None:
        """Until the supervisor's output holds `needle` `count` times."""

        def seen() -> bool:
            assert self.proc.poll() is None or needle in self.text(), self.text()
            return self.text().count(needle) >= count

        wait_until(seen, f"{count} x {needle!r} from weir up", timeout=timeout, interval=0.05)

    def wait_ready(self, index: int, count: int = 1) -> None:
        self.wait_for(f"weir: node {self.node_id}-{index} ready, mqtt on ", count)

    def files(self, index: int) -> NodeFiles:
        return NodeFiles(f"{self.node_id}-{index}", nodes_dir(self.data))

    def pid(self, index: int) -> int:
        return int(self.files(index).pid.read_text())

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=STOP_S)

    def kill(self) -> None:
        """The supervisor and everything in its session, whatever is left."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()


def wait_gone(pids: set[int], timeout: float = STOP_S) -> None:
    wait_until(
        lambda: not any(alive(p) for p in pids),
        f"processes {sorted(p for p in pids if alive(p))} to exit",
        timeout=timeout,
        interval=0.1,
    )


def free_ports_in_a_row(count: int, attempts: int = 50) -> int:
    """The first of `count` consecutive loopback ports nothing listens on now."""
    import socket

    from services.ports import free_port

    for _ in range(attempts):
        base = free_port()
        if base + count - 1 > 65535:
            continue
        with contextlib.ExitStack() as probes:
            try:
                for port in range(base, base + count):
                    s = probes.enter_context(socket.socket())
                    s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return base
    raise AssertionError(f"no {count} consecutive free ports in {attempts} attempts")


def wait_port_closed(port: int, timeout: float = 10.0) -> None:
    from bench.proc import find_listener_pids

    wait_until(lambda: find_listener_pids(port) == [], f"nothing listening on {port}", timeout)
