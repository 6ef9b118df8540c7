"""Memory handed back after a wave of departures: when, and only then."""

from __future__ import annotations

import asyncio
import ctypes.util

import pytest

from services.metrics.memory import MemoryReturn, glibc_trim
from services.metrics.registry import Metrics
from tests.support.wait import until


class Counted:
    """A trim that counts its calls (the real one cannot be seen to run)."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self) -> int:
        self.calls += 1
        return 1


def leave(metrics: Metrics, clients: int) -> None:
    for _ in range(clients):
        metrics.connected()
    for _ in range(clients):
        metrics.disconnected()


def test_a_trim_is_due_once_a_wave_of_departures_is_over() -> None:
    metrics = Metrics()
    memory = MemoryReturn(metrics, Counted(), after_closed=1_000)
    leave(metrics, 999)
    assert not memory.due()  # still leaving (999 since the last check)
    assert not memory.due()  # over, but 999 are too few
    leave(metrics, 1)
    assert not memory.due()  # the thousandth just left
    assert memory.due()  # nobody since: the wave is over


def test_clients_that_stay_connected_never_make_a_trim_due() -> None:
    metrics = Metrics()
    memory = MemoryReturn(metrics, Counted(), after_closed=10)
    for _ in range(5_000):
        metrics.connected()
    assert [memory.due() for _ in range(3)] == [False, False, False]


async def test_the_timer_trims_once_per_wave_in_a_thread() -> None:
    metrics = Metrics()
    trim = Counted()
    memory = MemoryReturn(metrics, trim, check_s=0.001, after_closed=100)
    memory.start(asyncio.get_running_loop())
    try:
        leave(metrics, 100)
        await until(lambda: memory.trims == 1, "the first wave's trim")
        leave(metrics, 100)
        await until(lambda: memory.trims == 2, "the second wave's trim")
        # The barrier: three more checks, nobody left meanwhile: no third trim.
        checks = memory.checks
        await until(lambda: memory.checks >= checks + 3, "three more checks")
        assert memory.trims == 2
    finally:
        memory.stop()
    assert trim.calls == 2 and memory.returned_bytes >= 0


async def test_without_malloc_trim_nothing_is_started(caplog: pytest.LogCaptureFixture) -> None:
    memory = MemoryReturn(Metrics(), None)
    with caplog.at_level("INFO", logger="weir.memory"):
        memory.start(asyncio.get_running_loop())
    assert memory._handle is None
    assert "no malloc_trim" in caplog.text


def test_glibc_trim_calls_the_c_library() -> None:
    trim = glibc_trim()
    if trim is None:
        libc = ctypes.util.find_library("c")
        pytest.skip(f"this C library ({libc}) has no malloc_trim")
    assert trim() in (0, 1)  # 1: memory was returned, 0: none could be
