"""What /proc says about the broker: which process listens on a port, its RSS, its CPU time.

Only Linux, and only processes this user may inspect; every function returns
None rather than guessing when /proc does not tell.
"""

from __future__ import annotations

import os
from pathlib import Path

PROC = Path("/proc")
TCP_LISTEN = "0A"
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def _listening_inodes(port: int) -> set[str]:
    inodes: set[str] = set()
    for table in ("net/tcp", "net/tcp6"):
        try:
            lines = (PROC / table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) <= 9 or fields[3] != TCP_LISTEN:
                continue
            if int(fields[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(fields[9])
    return inodes


def is_local(host: str) -> bool:
    return host == "localhost" or host.startswith("127.") or host == "::1"


def find_listener_pid(port: int) -> int | None:
    """The process holding a socket that listens on TCP `port`, if /proc shows one."""
    wanted = {f"socket:[{inode}]" for inode in _listening_inodes(port)}
    if not wanted:
        return None
    for entry in PROC.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            for fd in (entry / "fd").iterdir():
                if os.readlink(fd) in wanted:
                    return int(entry.name)
        except OSError:
            continue
    return None


def find_listener_pids(port: int) -> list[int]:
    """Every process listening on TCP `port` (several with SO_REUSEPORT workers), sorted."""
    wanted = {f"socket:[{inode}]" for inode in _listening_inodes(port)}
    pids: list[int] = []
    if not wanted:
        return pids
    for entry in PROC.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if any(os.readlink(fd) in wanted for fd in (entry / "fd").iterdir()):
                pids.append(int(entry.name))
        except OSError:
            continue
    return sorted(pids)


def rss_kib(pid: int) -> int | None:
    """VmRSS of `pid` in KiB."""
    try:
        for line in (PROC / str(pid) / "status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU time `pid` has used so far."""
    try:
        stat = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS
