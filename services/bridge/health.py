"""Whether a bridge's Kafka client reaches Kafka: its state in the API.

Theory of operation. librdkafka says little directly: an error callback
(all brokers down, a transport error, a timed-out request) and, every
`statistics.interval.ms`, a JSON document with each broker connection's
state. A bridge's client feeds both here (on its own thread: the fields
are plain values a reader on the event loop takes as they are) and reports
its successes (a delivery report, a fetched record, a commit). The bridge
is "kafka_down" while its last statistics show no broker connection up,
or while an error is newer than its last success and under DOWN_HOLD_S
old: a stalled broker keeps its TCP connections "UP" until requests time
out, so the errors say it first; an idle bridge whose Kafka came back
shows "running" again once the error is DOWN_HOLD_S old and a broker is up.
"""

from __future__ import annotations

import json
import time
from typing import Any, Final

from confluent_kafka import KafkaError

RUNNING: Final = "running"
KAFKA_DOWN: Final = "kafka_down"
STOPPED: Final = "stopped"
STATES: Final = (RUNNING, KAFKA_DOWN, STOPPED)

DOWN_HOLD_S: Final = 10.0  # an error without a success since shows the bridge down this long

# Errors that say Kafka cannot be reached (others are about one record or request).
UNREACHABLE: Final = frozenset({
    KafkaError._ALL_BROKERS_DOWN, KafkaError._TRANSPORT, KafkaError._TIMED_OUT,
    KafkaError._MSG_TIMED_OUT, KafkaError.REQUEST_TIMED_OUT, KafkaError._RESOLVE,
})  # fmt: skip


class KafkaHealth:
    def __init__(self) -> None:
        self.brokers_up = True  # per the last statistics (none yet: assume up)
        self.error_at = 0.0  # monotonic seconds of the last error that says Kafka is away
        self.ok_at = 0.0  # ... and of the last success
        self.last_error = ""

    def error(self, err: KafkaError) -> None:
        if err.code() in UNREACHABLE or err.fatal():
            self.error_at = time.monotonic()
            self.last_error = err.str()

    def ok(self) -> None:
        """A delivery report, a fetched record or a commit: a broker answered,
        whatever the last statistics document (up to an interval old) said."""
        self.ok_at = time.monotonic()
        self.brokers_up = True

    def stats(self, raw: str) -> dict[str, Any]:
        """A librdkafka statistics document: is any broker (not a bootstrap
        placeholder) connected? Returned parsed, for the caller's figures."""
        parsed = _parse(raw)
        brokers = parsed.get("brokers") or {}
        known = [b for b in brokers.values() if isinstance(b, dict) and b.get("nodeid", -1) >= 0]
        if known:
            self.brokers_up = any(b.get("state") == "UP" for b in known)
        return parsed

    def state(self, running: bool) -> str:
        if not running:
            return STOPPED
        recent = self.error_at > self.ok_at and time.monotonic() - self.error_at < DOWN_HOLD_S
        return KAFKA_DOWN if recent or not self.brokers_up else RUNNING


def _parse(raw: str) -> dict[str, Any]:
    try:
        parsed = json.loads(raw)
    except ValueError:
        return {}
    return parsed if isinstance(parsed, dict) else {}
