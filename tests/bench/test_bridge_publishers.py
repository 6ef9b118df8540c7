"""bench.bridge's publishers against a real broker: QoS 1 counts PUBACKs, QoS 0
counts batches the broker took (each closed by a PINGREQ's answer)."""

from __future__ import annotations

import asyncio

import pytest

from bench import bridge

WINDOW = 8


@pytest.mark.parametrize("qos", [0, 1])
def test_a_publisher_counts_what_the_broker_took(mosquitto: tuple[int, int], qos: int) -> None:
    port, _ = mosquitto
    latencies: list[float] = []
    taken = asyncio.run(bridge.publisher(port, f"p-qos{qos}", 0.3, WINDOW, b"x" * 16, latencies,
                                         qos))  # fmt: skip
    assert taken > 0
    if qos == 0:  # a round trip per batch of WINDOW
        assert taken == WINDOW * len(latencies)
    else:  # a latency per PUBACK
        assert taken == len(latencies)
    assert all(t > 0 for t in latencies)
