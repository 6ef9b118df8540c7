"""`/metrics`: the node's figures folded into Prometheus's text format at
scrape time.

`NodeCollector.collect` is the only place prometheus-client meets the
figures: it calls the `refresh` it was given (the broker fills the gauges
only it knows), then reads every field of `Metrics` into a metric family
(`weir_<field>`, counters with `_total`) and the process's figures into the
names every Prometheus client library uses (`process_cpu_seconds_total`,
`process_resident_memory_bytes`, `process_open_fds`, ...), so the
dashboards written for them work unchanged. The data bridges' figures come
as `weir_bridge_<figure>{bridge, direction}` and `weir_bridge_up` (1 while
a bridge runs and reaches Kafka).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CONTENT_TYPE_PLAIN_0_0_4, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from services.metrics.process import ProcessFigures, read_process
from services.metrics.registry import (
    BRIDGE_FIGURES,
    BridgeFigures,
    Family,
    Metrics,
    Refresh,
    samples,
)


class NodeCollector:
    """A prometheus-client collector over one node's `Metrics`."""

    def __init__(
        self,
        metrics: Metrics,
        node: str,
        version: str,
        refresh: Refresh | None = None,
        process: Callable[[], ProcessFigures] = read_process,
    ) -> None:
        self.metrics = metrics
        self.node = node
        self.version = version
        self.refresh = refresh
        self.process = process

    def collect(self) -> Iterator[Metric]:
        if self.refresh is not None:
            self.refresh(self.metrics)
        info = GaugeMetricFamily(
            "weir_node_info", "this node's id and Weir's version", labels=["node", "version"]
        )
        info.add_metric([self.node, self.version], 1)
        yield info
        for family, value in samples(self.metrics):
            yield _family(family, value)
        if self.metrics.bridges:
            yield from _bridges(self.metrics.bridges)
        yield from _process(self.process())


def _bridges(bridges: list[BridgeFigures]) -> Iterator[Metric]:
    labels = ["bridge", "direction"]
    up = GaugeMetricFamily("weir_bridge_up", "1: the data bridge runs and reaches Kafka; "
                           "0: Kafka is down or the bridge stopped", labels=labels)  # fmt: skip
    for bridge in bridges:
        up.add_metric([bridge.name, bridge.direction], int(bridge.state == "running"))
    yield up
    for figure, (kind, help) in BRIDGE_FIGURES.items():
        make = CounterMetricFamily if kind == "counter" else GaugeMetricFamily
        metric = make(f"weir_bridge_{figure}", help, labels=labels)
        for bridge in bridges:
            if figure in bridge.figures:
                metric.add_metric([bridge.name, bridge.direction], bridge.figures[figure])
        yield metric


def _family(family: Family, value: int | float | dict[object, int | float]) -> Metric:
    make = CounterMetricFamily if family.kind == "counter" else GaugeMetricFamily
    if family.label is None:
        assert not isinstance(value, dict)
        return make(family.name, family.help, value=value)
    assert isinstance(value, dict)
    metric = make(family.name, family.help, labels=[family.label])
    for key, number in value.items():
        metric.add_metric([str(key)], number)
    return metric


def _process(p: ProcessFigures) -> Iterator[Metric]:
    yield CounterMetricFamily(
        "process_cpu_seconds", "user and system CPU time spent, seconds", value=p.cpu_seconds
    )
    yield GaugeMetricFamily(
        "process_resident_memory_bytes", "resident memory size, bytes", value=p.rss_bytes
    )
    yield GaugeMetricFamily(
        "process_virtual_memory_bytes", "virtual memory size, bytes", value=p.vms_bytes
    )
    yield GaugeMetricFamily("process_open_fds", "open file descriptors", value=p.open_fds)
    yield GaugeMetricFamily("process_max_fds", "the open file descriptor limit", value=p.max_fds)
    yield GaugeMetricFamily(
        "process_start_time_seconds",
        "when the process started, seconds since the epoch",
        value=p.start_time,
    )


class Exposition:
    """The text a scrape of /metrics gets, and its content type."""

    # Text format 0.0.4, which every Prometheus reads (the 1.0.0 that
    # prometheus-client calls latest only adds UTF-8 names; ours need none).
    content_type = CONTENT_TYPE_PLAIN_0_0_4

    def __init__(self, collector: NodeCollector) -> None:
        # A registry of our own: the process-wide default one holds
        # prometheus-client's own collectors, and several nodes may share a
        # process (the tests run many).
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(collector)

    def render(self) -> bytes:
        return generate_latest(self.registry)
