"""The $SYS tree: what is published, when, and the load averages."""

from __future__ import annotations

import asyncio
import math

import pytest

from services.metrics.registry import Metrics
from services.metrics.systopics import Loads, SysTopics

P = "$SYS/brokers/n1/"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


Sent = list[tuple[str, bytes, bool]]


def sys_topics(m: Metrics, clock: Clock, interval: float = 10.0) -> tuple[SysTopics, Sent]:
    sent: Sent = []
    return SysTopics(m, "n1", "1.2.3", lambda *a: sent.append(a), interval, clock=clock), sent


def test_the_first_tick_publishes_the_whole_tree_retained() -> None:
    m = Metrics()
    m.connected()
    m.messages_received[0] += 2
    m.messages_received[2] += 1
    m.bytes_received = 99
    topics, sent = sys_topics(m, Clock())
    topics.tick()
    got = {topic: payload for topic, payload, _ in sent}
    assert all(retain for _, _, retain in sent)
    assert got[P + "version"] == b"1.2.3"
    assert got[P + "uptime"] == b"0"
    assert got[P + "clients/connected"] == b"1"
    assert got[P + "clients/maximum"] == b"1"
    assert got[P + "messages/received"] == b"3"
    assert got[P + "bytes/received"] == b"99"
    for figure in ("connections", "messages/received", "messages/sent", "bytes/received",
                   "bytes/sent", "messages/dropped"):  # fmt: skip
        for level in ("1min", "5min", "15min"):
            assert P + f"load/{figure}/{level}" in got
    for topic in ("messages/sent", "bytes/sent", "subscriptions/count", "retained/count",
                  "sessions/count", "messages/dropped"):  # fmt: skip
        assert got[P + topic] == b"0"


def test_later_ticks_publish_only_what_changed() -> None:
    m, clock = Metrics(), Clock()
    topics, sent = sys_topics(m, clock)
    topics.tick()
    sent.clear()
    clock.now += 10
    assert topics.tick() == 1
    assert sent == [(P + "uptime", b"10", True)]
    sent.clear()
    m.messages_sent[1] += 6
    clock.now += 10
    topics.tick()
    got = {topic: payload for topic, payload, _ in sent}
    assert got[P + "messages/sent"] == b"6"
    # 6 in 10 s is 36 a minute; the 1-minute average moves 1 - e^(-1/6) of the way there.
    assert got[P + "load/messages/sent/1min"] == f"{36 * (1 - math.exp(-10 / 60)):.2f}".encode()
    assert P + "messages/received" not in got


def test_loads_follow_a_steady_rate() -> None:
    loads = Loads()
    sent = 0
    for _ in range(6 * 60):  # an hour of 10 s ticks at 120 a minute
        sent += 20
        loads.update({"messages/sent": sent}, 10.0)
    assert loads.values["load/messages/sent/1min"] == pytest.approx(120)
    assert loads.values["load/messages/sent/15min"] == pytest.approx(120, rel=0.05)
    for _ in range(6):  # a silent minute: the short average falls fastest
        loads.update({"messages/sent": sent}, 10.0)
    one, fifteen = (loads.values[f"load/messages/sent/{p}"] for p in ("1min", "15min"))
    assert one == pytest.approx(120 * math.exp(-1)) and fifteen > one


def test_the_refresh_fills_the_gauges_first() -> None:
    m = Metrics()

    def refresh(metrics: Metrics) -> None:
        metrics.subscriptions, metrics.retained = 4, 2

    sent: list[tuple[str, bytes, bool]] = []
    SysTopics(m, "n1", "v", lambda *a: sent.append(a), refresh=refresh, clock=Clock()).tick()
    got = {topic: payload for topic, payload, _ in sent}
    assert (got[P + "subscriptions/count"], got[P + "retained/count"]) == (b"4", b"2")


async def test_it_publishes_every_interval_and_never_at_zero() -> None:
    ticks: list[str] = []
    two = asyncio.Event()

    def publish(topic: str, payload: bytes, retain: bool) -> None:
        if topic.endswith("/uptime"):
            ticks.append(topic)
            if len(ticks) == 2:
                two.set()

    loop = asyncio.get_running_loop()
    clock = Clock()

    def advancing() -> float:  # uptime changes at every tick, so each tick publishes it
        clock.now += 1
        return clock.now

    topics = SysTopics(Metrics(), "n1", "v", publish, 0.01, clock=advancing)
    topics.start(loop)
    await asyncio.wait_for(two.wait(), 5)
    topics.stop()

    never = SysTopics(Metrics(), "n1", "v", lambda *a: ticks.append("x"), 0)
    never.start(loop)
    assert "x" not in ticks
    never.stop()


async def test_a_failing_publish_does_not_end_the_timer() -> None:
    calls = 0
    second = asyncio.Event()

    def publish(topic: str, payload: bytes, retain: bool) -> None:
        nonlocal calls
        if topic.endswith("/version"):
            return
        calls += 1
        if calls > 1:
            second.set()
        raise RuntimeError("no route")

    clock = Clock()

    def advancing() -> float:
        clock.now += 1
        return clock.now

    topics = SysTopics(Metrics(), "n1", "v", publish, 0.01, clock=advancing)
    topics.start(asyncio.get_running_loop())  # its first tick fails: logged, not raised
    await asyncio.wait_for(second.wait(), 5)
    topics.stop()
