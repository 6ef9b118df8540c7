"""services.ports: the port a server of ours is started on is one no client
connection can take first (below the kernel's ephemeral range)."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from services import ports
from services.ports import LOWEST, ephemeral_range, free_port


def test_the_port_is_below_the_ephemeral_range_and_free() -> None:
    span = ephemeral_range()
    if span is None:
        pytest.skip("no /proc/sys/net/ipv4/ip_local_port_range: the kernel picks the port")
    if span[0] - LOWEST < 1000:
        pytest.skip(f"the ephemeral range starts at {span[0]}: no room below it")
    ports = {free_port() for _ in range(20)}
    assert all(LOWEST <= port < span[0] for port in ports), (ports, span)
    for port in ports:  # nothing is bound to it: a server can have it
        with socket.socket() as server:
            server.bind(("127.0.0.1", port))


def test_a_port_in_use_is_never_picked(monkeypatch: pytest.MonkeyPatch) -> None:
    """Of a range of 1,000 ports below the ephemeral range, only one can be bound
    (the others in use, as far as the probe can tell): that one, or the kernel's
    pick when 64 tries miss it. (The probe is replaced: binding 999 real ports
    here would take them from the servers of tests running beside this one.)"""
    span = (LOWEST + 1000, 60999)
    free = LOWEST + 500
    tried: list[int] = []

    def bindable(host: str, port: int) -> bool:
        tried.append(port)
        return port == free

    monkeypatch.setattr(ports, "_bindable", bindable)
    picked = [free_port(span=span) for _ in range(400)]
    assert all(p == free or p >= span[0] for p in picked), picked
    # a call's 64 tries miss the one port with odds 936/1000: 400 calls all miss
    # with odds of about 3e-12 (CI caught 40 calls all missing: odds 0.07)
    assert free in picked
    assert all(LOWEST <= p < span[0] for p in tried)


def test_no_room_below_the_range_lets_the_kernel_pick() -> None:
    span = (LOWEST + 10, 60999)
    port = free_port(span=span)
    assert port >= span[0] or port < LOWEST  # from the kernel's own range


def test_the_range_is_read_from_the_kernel_file(tmp_path: Path) -> None:
    good = tmp_path / "range"
    good.write_text("40000\t60999\n")
    assert ephemeral_range(good) == (40000, 60999)
    bad = tmp_path / "bad"
    bad.write_text("not numbers\n")
    assert ephemeral_range(bad) is None
    assert ephemeral_range(tmp_path / "missing") is None
