from __future__ import annotations

import os
import socket
import subprocess
import sys

from bench.idle import shares, source_address
from bench.proc import cpu_seconds, find_listener_pid, find_listener_pids, is_local, rss_kib
from bench.streams import tree_rss_mib


def test_finds_the_process_listening_on_a_port() -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        port = listener.getsockname()[1]
        assert find_listener_pid(port) is None
        listener.listen()
        assert find_listener_pid(port) == os.getpid()
        assert find_listener_pids(port) == [os.getpid()]


def test_rss_and_cpu_of_this_process() -> None:
    rss = rss_kib(os.getpid())
    cpu = cpu_seconds(os.getpid())
    assert rss is not None and rss > 1000
    assert cpu is not None and cpu > 0
    assert rss_kib(2**22 + 7) is None


def test_idle_spreads_over_249_source_addresses_and_workers() -> None:
    assert [source_address(i) for i in (0, 1, 248, 249)] == [
        "127.0.0.2",
        "127.0.0.3",
        "127.0.0.250",
        "127.0.0.2",
    ]
    assert shares(19_001, 2) == [9_501, 9_500]
    assert sum(shares(45_000, 3)) == 45_000
    assert is_local("127.0.0.1") and is_local("localhost") and not is_local("10.0.0.1")


def test_tree_rss_counts_the_processes_of_one_session() -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", "import sys; print('up', flush=True); sys.stdin.read()"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        # measured once its interpreter is up: while it starts, its RSS grows
        # (CI once read 2.2 MiB alone, then 8.2 MiB for the session a moment later)
        assert child.stdout is not None and child.stdout.readline() == b"up\n"
        alone = rss_kib(child.pid) or 0
        # the child alone: neither this process (another session) nor anything else
        assert alone / 2 < tree_rss_mib(child.pid) * 1024 < alone * 2
        assert tree_rss_mib(2**22 + 7) == 0  # no such session
    finally:
        assert child.stdin is not None
        child.stdin.close()
        child.wait()
