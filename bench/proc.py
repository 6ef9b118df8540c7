"""What the operating system says about the broker, through psutil: which
process listens on a port, its RSS, its CPU time.

Only processes this user may inspect; every function returns None rather
than guessing when the system does not tell.
"""

from __future__ import annotations

import psutil


def is_local(host: str) -> bool:
    return host == "localhost" or host.startswith("127.") or host == "::1"


def find_listener_pids(port: int) -> list[int]:
    """Every process listening on TCP `port` (several with SO_REUSEPORT workers), sorted.
    A socket whose process this user may not inspect has no pid and is left out."""
    return sorted(
        {
            conn.pid
            for conn in psutil.net_connections(kind="tcp")
            if conn.status == psutil.CONN_LISTEN and conn.laddr and conn.laddr.port == port
            and conn.pid is not None
        }
    )  # fmt: skip


def find_listener_pid(port: int) -> int | None:
    """The process holding a socket that listens on TCP `port`, if one shows."""
    pids = find_listener_pids(port)
    return pids[0] if pids else None


def rss_kib(pid: int) -> int | None:
    """Resident memory of `pid` in KiB."""
    try:
        return int(psutil.Process(pid).memory_info().rss // 1024)
    except psutil.Error:
        return None


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU time `pid` has used so far (its children's not counted)."""
    try:
        times = psutil.Process(pid).cpu_times()
    except psutil.Error:
        return None
    return float(times.user + times.system)
