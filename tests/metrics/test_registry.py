"""The figures a node keeps, and their Prometheus exposition."""

from __future__ import annotations

import dataclasses

import pytest
from prometheus_client.parser import text_string_to_metric_families

from services.metrics.collector import Exposition, NodeCollector
from services.metrics.process import ProcessFigures
from services.metrics.registry import (
    DROP_REASONS,
    FAMILIES,
    QOS,
    SENT,
    SENT_BYTES,
    Metrics,
    Refresh,
    total,
)

PROCESS = ProcessFigures(
    cpu_seconds=1.5, rss_bytes=1000, vms_bytes=2000, open_fds=7, max_fds=1024,
    start_time=1.7e9, memory_total_bytes=10_000,
)  # fmt: skip


Samples = dict[str, dict[tuple[tuple[str, str], ...], float]]


def scrape(metrics: Metrics, refresh: Refresh | None = None) -> Samples:
    """Each sample of a rendered exposition: name -> {labels: value}."""
    collector = NodeCollector(metrics, "n1", "9.9.9", refresh, lambda: PROCESS)
    text = Exposition(collector).render().decode()
    out: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
    return out


def test_every_field_but_the_alarm_conditions_the_tally_and_the_bridges_is_a_family() -> None:
    fields = {f.name for f in dataclasses.fields(Metrics)}
    kept = {"dead_nodes", "full_queues", "tally", "received", "bridges"}
    assert {f.field for f in FAMILIES} == fields - kept
    assert all(f.help and f.kind in ("counter", "gauge") for f in FAMILIES)


def test_labelled_families_start_with_every_value_at_zero() -> None:
    m = Metrics()
    assert m.messages_dropped == dict.fromkeys(DROP_REASONS, 0)
    assert m.messages_received == {0: 0, 1: 0, 2: 0}
    with pytest.raises(KeyError):
        m.messages_dropped["misspelt"] += 1


def test_two_nodes_keep_apart() -> None:
    a, b = Metrics(), Metrics()
    a.messages_received[1] += 1
    a.full_queues.add("c")
    assert b.messages_received[1] == 0 and not b.full_queues


def test_the_tally_folds_into_its_families_once() -> None:
    m = Metrics()
    m.messages_sent[1] += 1
    for _ in range(4):
        m.received.add(2, 10)  # as the channels count what they route
    m.received.add(0, 3)
    m.tally[SENT + 1] += 2
    m.tally[SENT_BYTES + 0] += 7
    m.fold()
    m.fold()  # a second read adds nothing more
    assert m.messages_received == {0: 1, 1: 0, 2: 4}
    assert m.messages_received_bytes == {0: 3, 1: 0, 2: 40}
    assert m.messages_sent == {0: 0, 1: 3, 2: 0}
    assert m.messages_sent_bytes == {0: 7, 1: 0, 2: 0}
    assert not any(m.tally)


def test_connections_keep_their_high_water_mark() -> None:
    m = Metrics()
    for _ in range(3):
        m.connected()
    m.disconnected()
    m.disconnected()
    m.connected()
    assert (m.connections, m.connections_max) == (2, 3)
    assert (m.connections_accepted, m.connections_closed) == (4, 2)


def test_the_exposition_shows_what_was_counted() -> None:
    m = Metrics()
    m.connected()
    m.messages_received[1] += 3
    m.messages_received_bytes[1] += 300
    m.messages_dropped["no_subscribers"] += 2
    m.bytes_sent += 42
    m.eventloop_lag_seconds = 0.25
    s = scrape(m)
    assert s["weir_messages_received_total"][(("qos", "1"),)] == 3
    assert s["weir_messages_received_total"][(("qos", "2"),)] == 0
    assert s["weir_messages_received_bytes_total"][(("qos", "1"),)] == 300
    assert s["weir_messages_dropped_total"][(("reason", "no_subscribers"),)] == 2
    assert s["weir_messages_dropped_total"][(("reason", "acl"),)] == 0
    assert s["weir_bytes_sent_total"][()] == 42
    assert s["weir_connections"][()] == 1
    assert s["weir_connections_accepted_total"][()] == 1
    assert s["weir_eventloop_lag_seconds"][()] == 0.25
    assert s["weir_node_info"][(("node", "n1"), ("version", "9.9.9"))] == 1


def test_every_family_and_the_process_figures_are_exposed() -> None:
    s = scrape(Metrics())
    for family in FAMILIES:
        name = family.name + ("_total" if family.kind == "counter" else "")
        assert name in s, name
        if family.label is not None:
            assert len(s[name]) == len(family.values)
    assert s["process_resident_memory_bytes"][()] == 1000
    assert s["process_cpu_seconds_total"][()] == 1.5
    assert s["process_open_fds"][()] == 7


def test_a_scrape_first_refreshes_the_gauges_only_their_owner_knows() -> None:
    def refresh(m: Metrics) -> None:
        m.sessions, m.subscriptions, m.retained = 5, 6, 7

    s = scrape(Metrics(), refresh)
    gauges = (s["weir_sessions"][()], s["weir_subscriptions"][()], s["weir_retained"][()])
    assert gauges == (5, 6, 7)


def test_the_real_process_figures_are_read() -> None:
    from services.metrics.process import read_process

    p = read_process()
    assert p.rss_bytes > 0 and p.open_fds > 0 and p.max_fds >= p.open_fds
    assert 0 < p.rss_bytes < p.memory_total_bytes


def test_total_sums_over_labels() -> None:
    m = Metrics()
    for qos in QOS:
        m.messages_sent[qos] += qos + 1
    assert total(m.messages_sent) == 6 and total(5) == 5
