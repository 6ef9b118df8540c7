"""One flapping rule (services.auth.limits): the node's live count and the
log's analytics agree on who flaps, with the same defaults.

The node bans the CONNECT that is one too many within its window; the
analytics (pandas here; tests/streams/test_report.py holds Spark's to the
pandas answers) flag a client whose connects reach that count within any
window of the same length, and not one that stays a connect short or whose
connects spread over more than the window."""

from __future__ import annotations

import pandas as pd

from services.auth.limits import Flapping, storage
from services.config.settings import FLAPPING_BAN_S, FLAPPING_MAX_CONNECTS, FLAPPING_WINDOW_S
from streams import analytics, report


async def test_the_node_bans_the_connect_the_analytics_flag() -> None:
    flapping = Flapping(FLAPPING_MAX_CONNECTS, 0, FLAPPING_WINDOW_S, FLAPPING_BAN_S,
                        storage("memory"))  # fmt: skip
    bans = [await flapping.ban_for("c", "127.0.0.1") for _ in range(analytics.FLAPPING_CONNECTS)]
    refused = [i + 1 for i, ban in enumerate(bans) if ban is not None]
    assert refused == [analytics.FLAPPING_CONNECTS]  # the connect that reaches the count
    assert flapping.window_s * 1000 == analytics.FLAPPING_WINDOW_MS


def test_the_analytics_flag_what_the_node_bans() -> None:
    n, window = analytics.FLAPPING_CONNECTS, analytics.FLAPPING_WINDOW_MS
    t0 = 1_700_000_000_000
    rows = [("flap", t0 + i * ((window - 1) // (n - 1))) for i in range(n)]  # n within a window
    rows += [("short", t0 + i * 10) for i in range(n - 1)]  # a connect short
    # first and last exactly a window apart: never n within one
    rows += [("spread", t0 + i * window // (n - 1)) for i in range(n)]
    history = pd.DataFrame(
        [(c, analytics.OPENED, ts, "n1") for c, ts in rows],
        columns=["client_id", "type", "ts_ms", "node"],
    )
    assert list(report.flapping(history)["client_id"]) == ["flap"]
