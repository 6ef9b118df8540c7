"""How a job's driver waits for a streaming query and reads its failure.

A failure raised in a Python worker (the log source) reaches the driver only
as the text of a JVM exception, so its kind is read from that text: the
source's `DataLoss` (its messages start with "data loss:") or the wording
of Spark's Kafka connector ("failOnDataLoss"). The jobs (streams.statestore,
streams.analytics, streams.rules) wait, classify and log their failures through here,
and the last two stop on SIGTERM / SIGINT through `on_stop_signals`.
"""

from __future__ import annotations

import logging
import re
import signal
import threading
from collections.abc import Callable
from types import FrameType
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from pyspark.sql.streaming.query import StreamingQuery

POLL_S: Final = 1  # s (an int, awaitTermination's type) between looks for a stop request
ONE_LINE_CHARS: Final = 300  # a failure's logged line is cut here
log = logging.getLogger("weir.streams")
_TRACEBACK: Final = "Traceback (most recent call last):"
_RAISED: Final = re.compile(r"[A-Za-z_][\w.]*: ")  # "module.Error: message", not indented


def until_stopped(query: StreamingQuery, stop: threading.Event) -> BaseException | None:
    """Wait for the query to end or for `stop`; stop it; its failure, if any
    (None when stopped on request)."""
    from pyspark.errors import StreamingQueryException

    try:
        while query.isActive and not stop.is_set():
            query.awaitTermination(POLL_S)
    except StreamingQueryException:
        pass  # reported below, by query.exception()
    finally:
        query.stop()
    return None if stop.is_set() else query.exception()


def is_data_loss(exc: BaseException) -> bool:
    """Whether a query failed because its checkpoint is ahead of the log: a
    retry reads the same log."""
    from streams.kafka_client import DataLoss

    text = str(exc)
    lowered = text.lower()
    return DataLoss.__name__ in text or "data loss" in lowered or "dataloss" in lowered


def one_line(exc: BaseException) -> str:
    """The line of a failure that says what went wrong: for a Python error raised
    inside Spark (the log source), the exception line of its traceback."""
    lines = [line.rstrip() for line in str(exc).splitlines() if line.strip()]
    tb = next((i for i, line in enumerate(lines) if _TRACEBACK in line), None)
    if tb is not None:
        raised = next((line for line in lines[tb + 1 :] if _RAISED.match(line)), None)
        if raised is not None:
            return raised[:ONE_LINE_CHARS]
    return lines[0].strip()[:ONE_LINE_CHARS] if lines else type(exc).__name__


def on_stop_signals(stop: threading.Event, job: str) -> Callable[[], None]:
    """SIGTERM and SIGINT (Ctrl-C) set `stop` (main thread only); returns the undo."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None

    def handler(signum: int, frame: FrameType | None) -> None:
        log.info("%s: %s, stopping", job, signal.Signals(signum).name)
        if not stop.is_set():  # set() off the handler: its lock may be held (statestore.run)
            threading.Thread(target=stop.set, daemon=True).start()

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGTERM, signal.SIGINT)}

    def restore() -> None:
        for sig, old in previous.items():
            signal.signal(sig, old)

    return restore
