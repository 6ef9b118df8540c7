"""Alarms: raised and cleared, kept, published and counted; the watch's conditions."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

from services.metrics.alarms import HISTORY, Alarms, Thresholds, Watch
from services.metrics.process import ProcessFigures
from services.metrics.registry import BridgeFigures, Metrics

PROCESS = ProcessFigures(
    cpu_seconds=0, rss_bytes=100, vms_bytes=0, open_fds=1, max_fds=1024, start_time=0,
    memory_total_bytes=1000,
)  # fmt: skip


class Published(list[tuple[str, dict[str, Any], bool]]):
    def __call__(self, topic: str, payload: bytes, retain: bool) -> None:
        self.append((topic, json.loads(payload), retain))


def alarms(m: Metrics | None = None) -> tuple[Alarms, Published]:
    sent = Published()
    clock = iter(range(100, 10_000))
    return Alarms(m or Metrics(), "n1", sent, clock=lambda: float(next(clock))), sent


def test_an_alarm_is_raised_once_and_cleared_once() -> None:
    a, sent = alarms()
    assert a.activate("high_connections", "too many", {"connections": 9})
    assert not a.activate("high_connections", "too many again")
    assert list(a.active) == ["high_connections"]
    assert a.metrics.alarms_activated == 1 and a.metrics.alarms_active == 1
    assert a.deactivate("high_connections")
    assert not a.deactivate("high_connections")
    assert a.active == {} and a.metrics.alarms_active == 0
    [past] = a.history
    assert (past.activated_at, past.deactivated_at) == (100.0, 101.0)
    topics = [(topic, retain) for topic, _, retain in sent]
    assert topics == [("$SYS/brokers/n1/alarms/activate", False),
                      ("$SYS/brokers/n1/alarms/deactivate", False)]  # fmt: skip
    activate, deactivate = sent[0][1], sent[1][1]
    assert activate == {"name": "high_connections", "message": "too many", "node": "n1",
                        "details": {"connections": 9}, "activated_at": 100.0,
                        "deactivated_at": None}  # fmt: skip
    assert deactivate["deactivated_at"] == 101.0


def test_the_history_is_bounded() -> None:
    a, _ = alarms()
    for i in range(HISTORY + 5):
        a.activate(f"a{i}", "x")
        a.deactivate(f"a{i}")
    assert len(a.history) == HISTORY and a.history[0].name == "a5"
    assert a.metrics.alarms_activated == HISTORY + 5


def test_an_alarm_stands_when_its_publish_fails() -> None:
    def broken(topic: str, payload: bytes, retain: bool) -> None:
        raise RuntimeError("no route")

    a = Alarms(Metrics(), "n1", broken)
    assert a.activate("x", "y") and "x" in a.active


def watch(m: Metrics, process: ProcessFigures = PROCESS, **limits: Any) -> tuple[Watch, Alarms]:
    a, _ = alarms(m)
    return Watch(m, a, max_connections=10, thresholds=Thresholds(**limits),
                 process=lambda: process), a  # fmt: skip


def test_connections_near_the_limit_raise_and_clear_with_a_gap() -> None:
    m = Metrics()
    w, a = watch(m)
    for expected_after in ((8, False), (9, True), (8, True), (7, False)):
        m.connections, active = expected_after
        w.check()
        assert ("high_connections" in a.active) is active, m.connections
    assert a.metrics.alarms_activated == 1


def test_process_memory_raises_past_its_share() -> None:
    m = Metrics()
    w, a = watch(m, replace(PROCESS, rss_bytes=600))
    w.check()
    assert a.active["high_process_memory_usage"].details == {
        "rss_bytes": 600, "memory_total_bytes": 1000}  # fmt: skip
    w.process = lambda: PROCESS  # 10% now
    w.check()
    assert "high_process_memory_usage" not in a.active


def test_event_loop_lag_raises_and_clears() -> None:
    m = Metrics()
    w, a = watch(m)
    m.eventloop_lag_seconds = 1.5
    w.check()
    assert "eventloop_lag" in a.active
    m.eventloop_lag_seconds = 0.7  # in the gap: stays
    w.check()
    assert "eventloop_lag" in a.active
    m.eventloop_lag_seconds = 0.1
    w.check()
    assert "eventloop_lag" not in a.active


def test_backend_failures_raise_until_a_check_sees_none() -> None:
    m = Metrics()
    m.redis_failures = 4  # before the watch: not new
    w, a = watch(m)
    w.check()
    assert a.active == {}
    m.eventlog_produce_failures += 2
    m.redis_failures += 1
    w.check()
    assert a.active["eventlog_unavailable"].details == {"failures": 2}
    assert a.active["redis_unavailable"].details == {"failures": 1}
    m.redis_failures += 1
    w.check()
    assert set(a.active) == {"redis_unavailable"}
    w.check()
    assert a.active == {}


def test_a_dead_peer_raises_its_own_alarm_until_it_rejoins() -> None:
    m = Metrics()
    w, a = watch(m)
    m.dead_nodes.update({"n2", "n3"})
    w.check()
    assert set(a.active) == {"node_down/n2", "node_down/n3"}
    m.dead_nodes.discard("n2")
    w.check()
    assert set(a.active) == {"node_down/n3"}


def test_full_queues_raise_while_they_keep_refusing() -> None:
    m = Metrics()
    w, a = watch(m)
    m.full_queues.update(f"c{i:02}" for i in range(25))
    w.check()
    details = a.active["session_queue_full"].details
    assert details["count"] == 25 and details["clients"] == [f"c{i:02}" for i in range(20)]
    assert m.full_queues == set()  # seen: the next check looks at what is new
    m.full_queues.add("c00")
    w.check()
    assert "session_queue_full" in a.active
    w.check()
    assert "session_queue_full" not in a.active


def test_a_bridge_raises_while_kafka_is_down_and_when_it_drops() -> None:
    m = Metrics()
    w, a = watch(m)

    def bridges(state: str, dropped: int) -> list[BridgeFigures]:
        return [BridgeFigures("up", "out", state, {"records": 1, "dropped": dropped}),
                BridgeFigures("down", "in", "running", {"records": 1, "dropped": 0})]  # fmt: skip

    m.bridges = bridges("kafka_down", 3)
    w.check()
    assert set(a.active) == {"bridge_down/up", "bridge_dropped/up"}
    assert a.active["bridge_dropped/up"].details == {"bridge": "up", "direction": "out",
                                                     "dropped": 3}  # fmt: skip
    m.bridges = bridges("kafka_down", 5)
    w.check()
    assert set(a.active) == {"bridge_down/up", "bridge_dropped/up"}  # 2 more dropped
    m.bridges = bridges("running", 5)
    w.check()
    assert set(a.active) == set()  # Kafka back, nothing dropped since the last check


def test_the_watch_reads_the_figures_only_their_owner_knows_first() -> None:
    m = Metrics()
    a, _ = alarms(m)
    failures = [0]

    def refresh(metrics: Metrics) -> None:
        metrics.redis_failures = failures[0]

    w = Watch(m, a, max_connections=10, process=lambda: PROCESS, refresh=refresh)
    w.check()
    failures[0] = 3
    w.check()
    assert a.active["redis_unavailable"].details == {"failures": 3}
