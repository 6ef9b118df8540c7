"""The generator against a broker that hangs up mid-run: the run still ends, and says so."""

from __future__ import annotations

import asyncio
import time

from bench import wire
from bench.plan import RunConfig
from bench.scenarios import plan_for, run_plan


class HangUpBroker(asyncio.Protocol):
    """CONNACKs, SUBACKs, then closes every connection at the first PUBLISH."""

    everyone: list[asyncio.Transport] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.parser = wire.FrameParser()
        self.everyone.append(transport)

    def data_received(self, data: bytes) -> None:
        for first, body in self.parser.feed(data):
            if first == wire.CONNECT:
                self.transport.write(b"\x20\x02\x00\x00")
            elif first == wire.SUBSCRIBE:
                self.transport.write(b"\x90\x03" + body[:2] + b"\x01")
            elif first & 0xF0 == wire.PUBLISH:
                for transport in self.everyone:
                    transport.close()
                return


async def test_a_broker_that_hangs_up_ends_the_run_with_losses_and_drops() -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(HangUpBroker, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        cfg = RunConfig("127.0.0.1", port, 1, 800, duration=3.0, drain=0.2)
        started = time.monotonic()
        result = await run_plan(cfg, plan_for("fan-in", 800))
        assert time.monotonic() - started < 3.0 + 5.0 + 1.0
    finally:
        server.close()
    assert result.received == 0
    assert result.loss == result.expected
    assert result.extra["connections_dropped"] == 9
    assert result.extra["acked"] == 0
