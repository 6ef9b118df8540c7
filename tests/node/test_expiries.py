"""The offline sessions' end timers (services.broker.ports.Expiries): the port
the log projection and the connection manager set timers on and the expiry
part serves."""

from __future__ import annotations

import asyncio

import pytest

from services.broker.ports import Expiries, Session


async def test_a_timer_ends_the_session_at_its_epoch_once() -> None:
    expiries = Expiries(asyncio.get_running_loop())
    ended: list[tuple[str, int]] = []
    done = asyncio.Event()

    def end(session: Session, epoch: int) -> None:
        ended.append((session.client_id, epoch))
        done.set()

    expiries.serve(end)
    kept, gone = Session("kept"), Session("gone")
    expiries.later(kept, 0.0, 7)
    expiries.later(gone, 0.0, 3)
    expiries.cancel(gone)
    assert gone.expiry_handle is None
    await asyncio.wait_for(done.wait(), 5)
    assert ended == [("kept", 7)] and kept.expiry_handle is None


async def test_a_new_timer_replaces_the_old_one() -> None:
    expiries = Expiries(asyncio.get_running_loop())
    ended: list[int] = []
    done = asyncio.Event()
    expiries.serve(lambda session, epoch: (ended.append(epoch), done.set()))
    session = Session("c")
    expiries.later(session, 60.0, 1)
    first = session.expiry_handle
    expiries.later(session, 0.0, 2)
    assert first is not None and first.cancelled()
    await asyncio.wait_for(done.wait(), 5)
    assert ended == [2]
    expiries.later(session, 60.0, 3)
    expiries.stop([session])  # the node stops: no timer fires any more
    assert session.expiry_handle is not None and session.expiry_handle.cancelled()


async def test_the_port_has_one_ender() -> None:
    expiries = Expiries(asyncio.get_running_loop())
    expiries.serve(lambda session, epoch: None)
    with pytest.raises(RuntimeError, match="ender already"):
        expiries.serve(lambda session, epoch: None)
