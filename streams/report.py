"""`weir report`: the analytics job's tables as terminal tables and PNG charts.

Theory of operation. The analytics job (`streams.analytics`) leaves one
directory per table under ``<data_dir>/analytics/``, one ``batch_id=<N>``
directory per micro-batch inside. This reads them with pyarrow (Hive
partitioning; no SparkSession, so a report takes a second or two, not the
ten a JVM takes to start) into pandas, and first undoes the batching: the
per-minute tables hold partial counts per batch, summed here by key
(`analytics.TABLE_KEYS`, as `analytics.combine` does in Spark). What needs
the whole table is derived here the same way the Spark functions derive
it, and a test holds the two to the same answers: `flapping` (a sliding
window over every connect in ``history``) and `online` (the running sum
of opened - closed per node).

Output: tables on stdout (top churners, flapping candidates, busiest
filters, sessions per node, and with --client that client's connection
history), PNG charts into --out (`streams.charts`: axes fitted to the data,
whatever its amount), each path printed on stdout, and progress on stderr
(`services.cli.Progress`: a bar in a terminal, lines otherwise). Bad input
(arguments, no data directory, no analytics data yet, an unknown client, an
unreadable table or an unwritable --out) is one line on stderr and exit code
2, never a traceback.
"""

from __future__ import annotations

import contextlib
import hashlib
import re
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any, Final

import click

from services.cli import CONTEXT, Progress, run
from streams import charts
from streams.analytics import (
    CHURN,
    FLAPPING_CONNECTS,
    FLAPPING_WINDOW_MS,
    HISTORY,
    INVALID,
    OPENED,
    SESSIONS_TABLE,
    SUBSCRIPTIONS_TABLE,
    TABLE_KEYS,
    TABLES,
    analytics_dir,
)

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.figure import Figure

PROG: Final = "weir report"
DEFAULT_TOP: Final = 10  # rows per table
CELL_WIDTH: Final = 40  # characters; longer client ids and filters are cut


class ReportError(Exception):
    """Bad input: printed as one line, exit code 2."""


def _progress(message: str) -> None:
    Progress("report").line(message)


# -- reading -------------------------------------------------------------------------


def read_tables(data_dir: Path) -> dict[str, pd.DataFrame]:
    """Every table the job has written (missing ones empty), per-minute ones
    summed by key; of ``history`` only the connects (client_id, type, ts_ms,
    node: what `flapping` reads), `read_client` reads one client's all."""
    import pyarrow.dataset as ds

    if not data_dir.is_dir():
        raise ReportError(f"no data directory {data_dir} (give --data-dir)")
    root = analytics_dir(data_dir)
    tables: dict[str, pd.DataFrame] = {}
    rows = 0
    with Progress("report").step("reading the tables", len(TABLES)) as step:
        for table in TABLES:
            started = time.monotonic()
            step.say(f"reading {table} ...")
            if table == HISTORY:
                rows += _count(root / table)
                connects = ds.field("type") == OPENED
                frame = _read(root / table, ["client_id", "type", "ts_ms", "node"], connects)
            else:
                frame = _read(root / table)
                rows += len(frame)
            if table in TABLE_KEYS and not frame.empty:
                keys, counts = TABLE_KEYS[table]
                frame = frame.groupby(list(keys), as_index=False)[list(counts)].sum()
            tables[table] = frame
            took = time.monotonic() - started
            step.say(f"read {table}: {len(frame):,} rows in {took:.1f} s")
            step.advance()
    if not rows:
        raise ReportError(
            f"no analytics data under {root} yet (run `weir streams run analytics` first)"
        )
    return tables


def read_client(data_dir: Path, client: str) -> pd.DataFrame:
    """Every ``history`` row of one client, oldest first."""
    import pyarrow.dataset as ds

    frame = _read(analytics_dir(data_dir) / HISTORY, where=ds.field("client_id") == client)
    return frame.sort_values(["ts_ms", "version"]) if not frame.empty else frame


@contextlib.contextmanager
def _reading(path: Path) -> Iterator[None]:
    import pyarrow as pa

    try:
        yield
    except (pa.ArrowException, OSError) as exc:
        raise ReportError(f"cannot read {path}: {exc}") from None


def _dataset(path: Path) -> Any:
    """The table at `path` (query_id and batch_id from the directory names), or None."""
    import pyarrow as pa
    import pyarrow.dataset as ds

    if not path.is_dir():
        return None
    fields = [("query_id", pa.string()), ("batch_id", pa.int64())]
    partitioning = ds.partitioning(pa.schema(fields), flavor="hive")
    dataset = ds.dataset(path, format="parquet", partitioning=partitioning)
    return dataset if dataset.files else None


def _read(path: Path, columns: list[str] | None = None, where: Any = None) -> pd.DataFrame:
    import pandas as pd

    with _reading(path):
        dataset = _dataset(path)
        if dataset is None:
            return pd.DataFrame()
        return dataset.to_table(columns=columns, filter=where).to_pandas()


def _count(path: Path) -> int:
    with _reading(path):
        dataset = _dataset(path)
        return 0 if dataset is None else int(dataset.count_rows())


# -- derived tables --------------------------------------------------------------------


def flapping(
    history: pd.DataFrame,
    *,
    connects: int = FLAPPING_CONNECTS,
    window_ms: int = FLAPPING_WINDOW_MS,
) -> pd.DataFrame:
    """`analytics.flapping` in pandas: client_id, connects, peak, peak_ms, nodes."""
    import numpy as np
    import pandas as pd

    columns = ["client_id", "connects", "peak", "peak_ms", "nodes"]
    if history.empty or not (history["type"] == OPENED).any():
        return pd.DataFrame(columns=columns)
    opened = history.loc[history["type"] == OPENED, ["client_id", "ts_ms", "node"]]
    opened = opened.sort_values(["client_id", "ts_ms"], kind="stable").reset_index(drop=True)
    # One sorted key for all clients: each client's times shifted into a range of
    # its own, so one searchsorted finds where every connect's window starts.
    ts = opened["ts_ms"].to_numpy(dtype=np.int64)
    codes, _ = pd.factorize(opened["client_id"])
    base = int(ts.min())
    stride = int(ts.max()) - base + window_ms + 1
    key = codes.astype(np.int64) * stride + (ts - base)
    starts = np.searchsorted(key, key - (window_ms - 1), side="left")
    opened["in_window"] = np.arange(len(key)) - starts + 1
    grouped = opened.groupby("client_id", sort=False)
    per_client = pd.DataFrame(
        {
            "connects": grouped.size(),
            "peak": grouped["in_window"].max(),
            "nodes": grouped["node"].nunique(),
        }
    )
    at_peak = opened[opened["in_window"] == opened["client_id"].map(per_client["peak"])]
    per_client["peak_ms"] = at_peak.groupby("client_id")["ts_ms"].min()
    found = per_client[per_client["peak"] >= connects].reset_index(names="client_id")
    order = found.sort_values(["peak", "connects", "client_id"], ascending=[False, False, True])
    return order[columns].reset_index(drop=True)


def online(sessions: pd.DataFrame) -> pd.DataFrame:
    """`analytics.online` in pandas: per node per minute, opened, closed, net, online."""
    frame = sessions.sort_values(["node", "minute"]).reset_index(drop=True)
    frame["online"] = frame.groupby("node")["net"].cumsum()
    return frame


def top_churners(churn: pd.DataFrame, flaps: pd.DataFrame, top: int) -> pd.DataFrame:
    grouped = churn.groupby("client_id")
    out = grouped[["connects", "disconnects", "lost"]].sum()
    out["peak/min"] = grouped["connects"].max()
    out["flapping"] = out.index.isin(flaps["client_id"])
    out = out.reset_index().sort_values(["connects", "client_id"], ascending=[False, True])
    return out.head(top)


def busiest_filters(subscriptions: pd.DataFrame, top: int) -> pd.DataFrame:
    grouped = subscriptions.groupby("filter")
    out = grouped[["subscribes", "unsubscribes", "net"]].sum()
    out["changes"] = out["subscribes"] + out["unsubscribes"]
    out = out.reset_index().sort_values(["changes", "filter"], ascending=[False, True])
    return out.head(top).drop(columns="changes")


def per_node(with_online: pd.DataFrame) -> pd.DataFrame:
    grouped = with_online.groupby("node")
    out = grouped[["opened", "closed"]].sum()
    out["online now"] = grouped["online"].last()
    out["peak online"] = grouped["online"].max()
    out["last minute"] = grouped["minute"].max()
    return out.reset_index()


# -- terminal tables ------------------------------------------------------------------


def _cell(value: Any) -> str:
    import pandas as pd

    if value is None or (not isinstance(value, str) and pd.isna(value)):
        text = "-"
    elif isinstance(value, bool):
        text = "yes" if value else ""
    elif isinstance(value, float) and value.is_integer():
        text = f"{int(value):,}"  # an int column with gaps (NaN) arrives as float
    elif isinstance(value, int | float):
        text = f"{value:,}"
    elif isinstance(value, pd.Timestamp):
        text = value.strftime("%Y-%m-%d %H:%M:%S")
    else:
        text = str(value)
    return text if len(text) <= CELL_WIDTH else text[: CELL_WIDTH - 1] + "…"


def render(title: str, frame: pd.DataFrame) -> str:
    """A titled, aligned text table (numbers right-aligned), or a "none" line."""
    if frame.empty:
        return f"{title}\n  (none)\n"
    header = [str(c) for c in frame.columns]
    body = [
        [_cell(v.item() if hasattr(v, "item") else v) for v in row]
        for row in frame.itertuples(index=False)
    ]
    numeric = [frame[c].dtype.kind in "iuf" for c in frame.columns]
    widths = [max(len(h), *(len(r[i]) for r in body)) for i, h in enumerate(header)]

    def line(cells: list[str]) -> str:
        padded = (
            c.rjust(w) if right else c.ljust(w)
            for c, w, right in zip(cells, widths, numeric, strict=True)
        )
        return "  " + "  ".join(padded).rstrip()

    rule = "  " + "  ".join("-" * w for w in widths)
    return "\n".join([title, line(header), rule, *(line(r) for r in body)]) + "\n"


def _utc(ms: pd.Series) -> pd.Series:
    import pandas as pd

    return pd.to_datetime(ms, unit="ms")


# -- charts (drawn by streams.charts) -------------------------------------------------


def _save(path: Path, figure: Figure) -> Path:
    try:
        figure.savefig(path, format="png")
    except OSError as exc:
        raise ReportError(f"cannot write {path}: {exc.strerror or exc}") from None
    return path


def _client_file(client: str) -> str:
    digest = hashlib.sha256(client.encode()).hexdigest()[:8]
    return f"client-{re.sub(r'[^A-Za-z0-9_.-]', '_', client)[:40]}-{digest}.png"


# -- the command ------------------------------------------------------------------------


def _data_dir(given: str | None) -> Path:
    from services.config import SettingsError, load

    try:
        return Path(load({"data_dir": given}).data_dir)
    except SettingsError as exc:
        raise ReportError(str(exc)) from None


def _report(args: SimpleNamespace) -> None:
    data_dir = _data_dir(args.data_dir)
    tables = read_tables(data_dir)
    history, churn = tables[HISTORY], tables[CHURN]
    subs, sessions, bad = tables[SUBSCRIPTIONS_TABLE], tables[SESSIONS_TABLE], tables[INVALID]
    mine = read_client(data_dir, args.client) if args.client is not None else None
    if mine is not None and mine.empty:
        raise ReportError(f"no events of client {args.client!r} under {analytics_dir(data_dir)}")
    out = Path(args.out) if args.out else data_dir / "report"
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ReportError(f"cannot create {out}: {exc.strerror or exc}") from None

    started = time.monotonic()
    _progress("finding flapping clients ...")
    flaps = flapping(history, connects=args.flapping)
    _progress(f"found {len(flaps)} flapping clients in {time.monotonic() - started:.1f} s")
    window_s = FLAPPING_WINDOW_MS // 1000
    print(f"Weir analytics under {analytics_dir(data_dir)} (times in UTC)\n")
    if not bad.empty:
        first = bad.sort_values(["topic", "partition", "offset"]).head(3)
        where = ", ".join(f"{r.topic}[{r.partition}]@{r.offset}" for r in first.itertuples())
        print(f"Invalid records skipped: {len(bad):,} (first: {where})\n")
    churners = top_churners(churn, flaps, args.top) if not churn.empty else churn
    print(render(f"Top {args.top} churners", churners))
    shown = (
        flaps.head(args.top).assign(peak_at=lambda f: _utc(f["peak_ms"])).drop(columns="peak_ms")
    )
    print(render(f"Flapping candidates (>= {args.flapping} connects within {window_s} s)", shown))
    filters = busiest_filters(subs, args.top) if not subs.empty else subs
    print(render(f"Busiest {args.top} filters", filters))
    with_online = online(sessions) if not sessions.empty else sessions
    nodes = per_node(with_online) if not with_online.empty else with_online
    print(render("Sessions per node", nodes))
    if mine is not None:
        last = mine.tail(args.top).assign(time=lambda f: _utc(f["ts_ms"]))
        columns = ["time", "type", "node", "reason", "protocol", "peer", "version"]
        title = f"Connection history of {args.client} (last {len(last)} of {len(mine)} events)"
        print(render(title, last[columns]))

    made: list[tuple[str, Callable[[], Figure]]] = []  # (file name, the chart)
    if not churn.empty:
        top_ids = list(churners["client_id"].head(charts.SERIES))
        made.append(("churn.png", lambda: charts.churn(churn, top_ids)))
    if not subs.empty:
        top_filters = list(filters["filter"].head(charts.SERIES))
        made.append(("subscriptions.png", lambda: charts.subscriptions(subs, top_filters)))
    if not with_online.empty:
        node_names = sorted(with_online["node"].unique())
        made.append(("sessions.png", lambda: charts.sessions(with_online, node_names)))
    if args.client is not None and not churn.empty:
        made.append((_client_file(args.client), lambda: charts.client(churn, args.client)))
    with Progress("report").step("drawing the charts", len(made)) as step:
        for name, draw in made:
            started = time.monotonic()
            step.say(f"drawing {name} ...")
            path = _save(out / name, draw())
            step.say(f"drew {path.name} in {time.monotonic() - started:.1f} s")
            step.advance()
            print(path)


@click.command("report", context_settings=CONTEXT,
               help="Report on the analytics job's tables: tables and PNG charts.")
@click.option("--data-dir", help="Weir's data directory (default: from settings)")
@click.option("--out", help="where the PNG charts go (default: <data-dir>/report)")
@click.option("--client", help="also show this client's connection history")
@click.option("--top", type=click.IntRange(min=1), default=DEFAULT_TOP, show_default=True,
              help="rows per table")  # fmt: skip
@click.option("--flapping", type=click.IntRange(min=1), default=FLAPPING_CONNECTS,
              metavar="N", show_default=True,
              help=f"flapping: N connects within {FLAPPING_WINDOW_MS // 1000} s")  # fmt: skip
def command(**options: Any) -> int:
    try:
        _report(SimpleNamespace(**options))
    except ReportError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 2
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """`weir report`: 0 on success, 2 on bad input (one line on stderr)."""
    return run(command, sys.argv[1:] if argv is None else argv, PROG)


if __name__ == "__main__":
    sys.exit(main())
