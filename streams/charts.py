"""`weir report`'s PNG charts: matplotlib figures of the analytics tables.

Theory of operation. Each chart is a `Figure` (matplotlib's Agg canvas,
never pyplot's global state) over per-minute tables, built here and saved
by `streams.report`. What keeps one readable whatever the amount of data:

- Each minute's value holds for that minute: a line steps at the start of
  a minute and runs to its end (the last minute too, so a single minute is
  a segment, not a point that draws nothing), and a bar spans its minute.
- The x axis is fitted to the data's minutes, first to last + 1 minute, with
  a small margin (left alone, matplotlib widens a one-minute span to years),
  and labelled with `ConciseDateFormatter` (times, the date once).
- The y axis starts at 0 (or the lowest value, for a running net that went
  below 0) and ends a little above the highest; all-zero data still gets
  a visible 0..1 axis.
- With few minutes (`MARKERS_UP_TO`), points get markers: a line of one
  or two minutes is seen, and it is clear what was measured.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.figure import Figure

SERIES: Final = 5  # lines per chart: more are unreadable
LABEL_WIDTH: Final = 40  # characters; longer client ids and filters are cut
SIZE: Final = (10.0, 4.5)  # inches, at DPI
DPI: Final = 100
MINUTE_DAYS: Final = 1 / 1440  # a minute in matplotlib date units (days): bar widths
MARKERS_UP_TO: Final = 30  # minutes on a chart up to which points get markers
X_MARGIN: Final = 0.03  # of the span, each side
Y_HEADROOM: Final = 0.1  # of the range, above the highest value


def label(value: Any) -> str:
    text = str(value)
    return text if len(text) <= LABEL_WIDTH else text[: LABEL_WIDTH - 1] + "…"


def figure(draw: Callable[[Any], None], title: str) -> Figure:
    from matplotlib.figure import Figure

    made = Figure(figsize=SIZE, dpi=DPI, layout="constrained")
    draw(made)
    made.suptitle(title)
    return made


def fit_minutes(axes: Any, minutes: Sequence[Any] | pd.Series | pd.Index) -> None:
    """The x axis over these minutes' span (to the end of the last), dates concise."""
    import matplotlib.dates
    import pandas as pd

    mdates: Any = matplotlib.dates  # its functions carry no annotations
    first, last = pd.Timestamp(min(minutes)), pd.Timestamp(max(minutes)) + pd.Timedelta(minutes=1)
    margin = (last - first) * X_MARGIN
    axes.set_xlim(mdates.date2num(first - margin), mdates.date2num(last + margin))
    locator = mdates.AutoDateLocator(minticks=3, maxticks=10)
    axes.xaxis.set_major_locator(locator)
    axes.xaxis.set_major_formatter(mdates.ConciseDateFormatter(locator))


def fit_values(axes: Any, values: Sequence[float]) -> None:
    """The y axis from 0 (or below, for a negative value) to a little over the highest."""
    low, high = min(0.0, *values), max(0.0, *values)
    if high == low:
        high = low + 1
    axes.set_ylim(low, high + (high - low) * Y_HEADROOM)


def _wide(frame: pd.DataFrame, by: str, value: str, keys: Sequence[Any], running: bool) -> Any:
    """minute x key: every minute of the table's span; a count is 0 in a minute
    without a row, a running value carries over from the minute before."""
    import pandas as pd

    chosen = frame[frame[by].isin(list(keys))]
    wide = chosen.pivot_table(index="minute", columns=by, values=value, aggfunc="sum")
    wide = wide.reindex(pd.date_range(frame["minute"].min(), frame["minute"].max(), freq="min"))
    return (wide.ffill() if running else wide).fillna(0)


def lines(
    axes: Any, frame: pd.DataFrame, by: str, value: str, keys: Sequence[Any], running: bool
) -> list[float]:
    """One step line per key, each minute's value held to its end; the values drawn."""
    import pandas as pd
    from matplotlib.ticker import MaxNLocator

    wide = _wide(frame, by, value, keys, running)
    ends = wide.index.append(pd.DatetimeIndex([wide.index[-1] + pd.Timedelta(minutes=1)]))
    marker = "o" if len(wide) <= MARKERS_UP_TO else None
    drawn: list[float] = []
    for key in keys:
        values = [*wide[key], wide[key].iloc[-1]]  # the last minute held to its end
        axes.step(ends, values, where="post", label=label(key))
        if marker is not None:  # at each minute's start: what was counted there
            axes.plot(wide.index, wide[key], linestyle="none", marker=marker, markersize=4,
                      color=axes.lines[-1].get_color())  # fmt: skip
        drawn += [float(v) for v in wide[key]]
    if keys:
        axes.legend(loc="upper left", fontsize="small")
    axes.yaxis.set_major_locator(MaxNLocator(integer=True))
    axes.set_xlabel("minute (UTC)")
    return drawn


def churn(frame: pd.DataFrame, churners: Sequence[str]) -> Figure:
    def draw(made: Any) -> None:
        axes = made.subplots()
        total = frame.groupby("minute", as_index=False)["connects"].sum()
        axes.bar(total["minute"], total["connects"], width=MINUTE_DAYS, align="edge",
                 color="#bbbbbb", label="all")  # fmt: skip
        drawn = lines(axes, frame, "client_id", "connects", churners, running=False)
        fit_minutes(axes, frame["minute"])
        fit_values(axes, [*total["connects"], *drawn])
        axes.set_ylabel("connects per minute")

    return figure(draw, "Connects per minute: all clients and the top churners")


def subscriptions(frame: pd.DataFrame, filters: Sequence[str]) -> Figure:
    ordered = frame.sort_values("minute").copy()
    ordered["running net"] = ordered.groupby("filter")["net"].cumsum()

    def draw(made: Any) -> None:
        axes = made.subplots()
        drawn = lines(axes, ordered, "filter", "running net", filters, running=True)
        fit_minutes(axes, ordered["minute"])
        fit_values(axes, drawn)
        axes.set_ylabel("subscribes - unsubscribes, running")

    return figure(draw, "Subscriptions per filter (busiest filters)")


def sessions(with_online: pd.DataFrame, nodes: Sequence[str]) -> Figure:
    def draw(made: Any) -> None:
        upper, lower = made.subplots(2, 1, sharex=True)
        fit_values(upper, lines(upper, with_online, "node", "online", nodes, running=True))
        upper.set_ylabel("online")
        upper.set_xlabel("")
        fit_values(lower, lines(lower, with_online, "node", "opened", nodes, running=False))
        lower.set_ylabel("opened per minute")
        fit_minutes(lower, with_online["minute"])  # shared with the upper one

    return figure(draw, "Sessions per node")


def client(frame: pd.DataFrame, client_id: str) -> Figure:
    import pandas as pd
    from matplotlib.ticker import MaxNLocator

    mine = frame[frame["client_id"] == client_id].sort_values("minute")

    def draw(made: Any) -> None:
        axes = made.subplots()
        width = MINUTE_DAYS * 0.45
        after = mine["minute"] + pd.Timedelta(seconds=30)  # the minute's second half
        axes.bar(mine["minute"], mine["connects"], width=width, align="edge", label="connects")
        axes.bar(after, mine["disconnects"], width=width, align="edge", label="disconnects")
        axes.legend(loc="upper left", fontsize="small")
        axes.yaxis.set_major_locator(MaxNLocator(integer=True))
        fit_minutes(axes, mine["minute"])
        fit_values(axes, [*mine["connects"], *mine["disconnects"]])
        axes.set_ylabel("per minute")
        axes.set_xlabel("minute (UTC)")

    return figure(draw, f"Client {client_id}: connects and disconnects per minute")
