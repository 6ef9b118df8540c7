"""Clients that leave together have their sessions ended a bounded number at
once (`ConnectionManager.ends`), and every one of them is ended.

Before: each lost connection's session end ran as a task of its own, all at
once. 19,000 idle clients leaving together made every turn of the node's
loop seconds long (each end took a step in each turn), the answer to the
node's heartbeat waited behind them, and the node fenced itself: its
other clients were disconnected 0x9C (`weir bench idle`, every wave).
"""

from __future__ import annotations

import asyncio
from typing import Any

from services.tasks import Bounded
from tests.integration.conftest import NodeRunner, node_settings
from tests.integration.rawclient import Raw
from tests.support.wait import wait_until

WIDTH = 4  # ends under way at once in this test
CLIENTS = 12  # leaving together: three times the width


def test_sessions_of_clients_that_leave_together_end_a_bounded_number_at_once() -> None:
    runner = NodeRunner(node_settings()).start()
    try:
        loop, cm = runner.loop, runner.node.broker.cm
        assert loop is not None
        cm.ends = Bounded(WIDTH)
        store = cm.store
        version = store.next_version
        seen = {"under_way": 0, "most": 0, "ended": 0}
        gate = asyncio.Event()  # opened once every client is gone: ends wait for it

        async def held(client_id: str, epoch: int) -> Any:
            seen["under_way"] += 1
            seen["most"] = max(seen["most"], seen["under_way"])
            try:
                await gate.wait()
                return await version(client_id, epoch)
            finally:
                seen["under_way"] -= 1
                seen["ended"] += 1

        raws = []
        for i in range(CLIENTS):
            raw = Raw(runner.mqtt_port)
            assert raw.connect(f"leaving-{i}").reason_code == 0
            raws.append(raw)
        store.next_version = held  # the session ends' first store call
        for raw in raws:
            raw.close()
        wait_until(lambda: not cm.connections, "every connection gone")
        # Each lost connection's end was started as it went (the loop ran
        # their first steps before this call, queued after them, sets the gate).
        wait_until(lambda: seen["under_way"] >= WIDTH, "the first ends under way")
        loop.call_soon_threadsafe(gate.set)
        wait_until(lambda: seen["ended"] == CLIENTS, "every session ended")
        wait_until(lambda: not runner.node.broker.routes.sessions, "no session left")
        assert seen["most"] == WIDTH, seen
    finally:
        runner.stop()


def test_every_waiter_for_no_connections_sees_the_last_one_go() -> None:
    """Two waits at once (a node's stop and an operator's drain, say) both
    end when the last connection goes. Before, the second wait's Event
    replaced the first's, which then ran into its timeout and said False."""
    runner = NodeRunner(node_settings()).start()
    try:
        loop, cm = runner.loop, runner.node.broker.cm
        assert loop is not None
        raw = Raw(runner.mqtt_port)
        assert raw.connect("last-one").reason_code == 0
        waits = [asyncio.run_coroutine_threadsafe(cm.wait_no_connections(30.0), loop)
                 for _ in range(2)]  # fmt: skip
        asyncio.run_coroutine_threadsafe(asyncio.sleep(0), loop).result(10)  # both waiting
        assert not any(w.done() for w in waits)
        raw.close()
        assert [w.result(20) for w in waits] == [True, True]
    finally:
        runner.stop()
