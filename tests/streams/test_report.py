"""`weir report` over Parquet tables written by the analytics batch writer."""

from __future__ import annotations

import struct
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from services.event.schema import Event
from streams import analytics, report
from streams.events import as_raw_rows, raw_schema
from tests.streams.test_analytics import MINUTE, PREFIX, T0, closed, opened, sub, unsub

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
N = analytics.FLAPPING_CONNECTS


def batches() -> list[list[Event | bytes]]:
    """Two batches: "flap" connects N times within 45 s across both; "b" twice
    within 31 s (moving from n2 to n1), "c" once; filters change; one record is
    not an event."""
    flap: list[Event | bytes] = [
        opened("flap", i + 1, T0 + 30_000 + i * 3_000, node="n1") for i in range(N)
    ]
    rest: list[Event | bytes] = [
        opened("b", 1, T0, node="n2"),
        closed("b", 2, T0 + 30_000, "keepalive", node="n2"),
        opened("b", 3, T0 + 30_001, node="n1"),
        opened("c", 1, T0 + 2 * MINUTE, node="n2"),
        sub("b", 4, T0 + 10, "a/#"),
        sub("c", 2, T0 + 20, "a/#"),
        sub("c", 3, T0 + MINUTE, "b"),
        unsub("c", 4, T0 + 2 * MINUTE, "a/#"),
        b"not an event",
    ]
    return [flap[: N // 2] + rest[:4], flap[N // 2 :] + rest[4:]]


def write(spark: SparkSession, out: Path, parts: list[list[Event | bytes]]) -> None:
    writer = analytics.BatchWriter(analytics.analytics_dir(out), PREFIX, "q1")
    offset = 0
    for batch_id, items in enumerate(parts):
        records: list[tuple[str, int, int, Event | bytes]] = []
        for item in items:
            suffix = "sessions" if isinstance(item, bytes) else item.topic_suffix
            records.append((suffix, 0, offset, item))
            offset += 1
        writer(spark.createDataFrame(as_raw_rows(records, PREFIX), raw_schema()), batch_id)


@pytest.fixture(scope="module")
def data_dir(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("weir-data")
    write(spark, out, batches())
    return out


def png_size(path: Path) -> tuple[int, int]:
    """(width, height) of a PNG, after checking it decodes."""
    from matplotlib import image

    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC
    assert data[12:16] == b"IHDR"
    width, height = struct.unpack(">II", data[16:24])
    pixels = image.imread(str(path))
    assert pixels.shape[:2] == (height, width)
    assert pixels.std() > 0  # something was drawn
    return width, height


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, list[str]]:
    code = report.main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err.splitlines()


def section(out: str, title: str) -> list[str]:
    """The data lines of the table titled `title` (after its header and rule)."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(title))
    body = []
    for line in lines[start + 1 :]:
        if not line.strip():
            break
        body.append(line.split())
    if body and body[0] == ["(none)"]:
        return []
    return [" ".join(cells) for cells in body[2:]]


# -- the report ---------------------------------------------------------------------


def test_report_prints_the_tables_and_writes_valid_charts(
    data_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "charts"
    code, stdout, stderr = run(capsys, "--data-dir", str(data_dir), "--out", str(out), "--top", "2")
    assert code == 0
    assert N == 16  # the node's default: more than 15 connects in 60 s
    assert section(stdout, "Top 2 churners") == ["flap 16 0 0 10 yes", "b 2 1 1 2"]
    flapping = section(stdout, "Flapping candidates (>= 16 connects within 60 s)")
    assert flapping == ["flap 16 16 1 2023-11-14 22:15:15"]
    assert section(stdout, "Busiest 2 filters") == ["a/# 2 1 1", "b 1 0 1"]
    assert section(stdout, "Sessions per node") == [
        "n1 17 0 17 17 2023-11-14 22:15:00",  # flap's 16 and b's
        "n2 2 1 1 1 2023-11-14 22:16:00",  # b moved to n1
    ]
    assert f"Invalid records skipped: 1 (first: weir.sessions[0]@{N + 8})" in stdout
    charts = [Path(line) for line in stdout.splitlines() if line.endswith(".png")]
    assert [p.name for p in charts] == ["churn.png", "subscriptions.png", "sessions.png"]
    for chart in charts:
        assert chart.parent == out
        assert png_size(chart) == (1000, 450)
    assert any(line.startswith("report: reading history") for line in stderr)
    assert any(line.startswith("report: drew sessions.png") for line in stderr)


def test_report_of_one_client_shows_its_history_and_chart(
    data_dir: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WEIR_DATA_DIR", str(data_dir))  # the settings' data dir
    code, stdout, _ = run(capsys, "--client", "b", "--flapping", "2")
    assert code == 0
    history = section(stdout, "Connection history of b (last 3 of 3 events)")
    assert [line.split()[2:4] for line in history] == [
        ["session_opened", "n2"],
        ["session_closed", "n2"],
        ["session_opened", "n1"],
    ]
    assert history[1].split()[4] == "keepalive"
    # the flapping threshold is an option: with 2, b's two connects count, c's one not
    flapping = section(stdout, "Flapping candidates (>= 2 connects within 60 s)")
    assert [line.split()[0] for line in flapping] == ["flap", "b"]
    chart = next(Path(line) for line in stdout.splitlines() if "client-b-" in line)
    assert chart.parent == data_dir / "report"  # the default --out
    assert png_size(chart)[0] > 0


def test_pandas_and_spark_derive_the_same_flapping_and_online_counts(
    spark: SparkSession, data_dir: Path
) -> None:
    tables = report.read_tables(data_dir)
    root = analytics.analytics_dir(data_dir)
    history = spark.read.parquet(str(root / "history"))
    for connects in (2, N, N + 1):
        in_spark = analytics.flapping(history, connects=connects).toPandas()
        in_pandas = report.flapping(tables["history"], connects=connects)
        key = ["client_id", "connects", "peak", "peak_ms", "nodes"]
        expect = sorted(tuple(r) for r in in_spark[key].itertuples(index=False))
        assert sorted(tuple(r) for r in in_pandas[key].itertuples(index=False)) == expect
        assert len(expect) == {2: 2, N: 1, N + 1: 0}[connects]
    in_spark = analytics.online(spark.read.parquet(str(root / "sessions"))).toPandas()
    in_pandas = report.online(tables["sessions"])
    columns = ["node", "minute", "opened", "closed", "online"]
    assert sorted(map(tuple, in_spark[columns].itertuples(index=False))) == sorted(
        map(tuple, in_pandas[columns].itertuples(index=False))
    )
    assert list(in_pandas.groupby("node")["online"].last()) == [N + 1, 1]


# -- bad input ----------------------------------------------------------------------


def one_line_error(code: int, stdout: str, stderr: list[str], fragment: str) -> None:
    assert code == 2
    assert stderr, "no message"
    assert stderr[-1].startswith("weir report: ")
    assert fragment in stderr[-1]
    assert all(line.startswith("report: ") for line in stderr[:-1])  # progress lines
    assert "Traceback" not in stdout + "\n".join(stderr)


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (["--top", "0"], "0 is not in the range x>=1"),
        (["--top", "many"], "'many' is not a valid integer"),
        (["--flapping", "-3"], "-3 is not in the range x>=1"),
        (["--colour"], "No such option '--colour'"),
        (["--data-dir"], "Option '--data-dir' requires an argument"),
    ],
)
def test_bad_arguments_are_one_line_and_exit_2(
    capsys: pytest.CaptureFixture[str], argv: list[str], fragment: str
) -> None:
    one_line_error(*run(capsys, *argv), fragment)


def test_help_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    code, stdout, _ = run(capsys, "--help")
    assert code == 0
    assert "--client" in stdout


def test_a_missing_data_directory_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    one_line_error(*run(capsys, "--data-dir", str(tmp_path / "nope")), "no data directory")


def test_no_analytics_data_yet_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    one_line_error(*run(capsys, "--data-dir", str(tmp_path)), "no analytics data under")
    (tmp_path / "analytics" / "history").mkdir(parents=True)  # a table with no batch yet
    one_line_error(*run(capsys, "--data-dir", str(tmp_path)), "run `weir streams run analytics`")


def test_an_unknown_client_is_one_line_and_exit_2(
    data_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, stdout, stderr = run(capsys, "--data-dir", str(data_dir), "--client", "nobody")
    one_line_error(code, stdout, stderr, "no events of client 'nobody'")
    assert stdout == ""


def test_an_unreadable_table_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    broken = tmp_path / "analytics" / "churn" / "query_id=q" / "batch_id=0"
    broken.mkdir(parents=True)
    (broken / "part-0.parquet").write_bytes(b"this is no parquet file")
    one_line_error(*run(capsys, "--data-dir", str(tmp_path)), "cannot read")


def test_an_unwritable_out_is_one_line_and_exit_2(
    data_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("in the way")
    args = ("--data-dir", str(data_dir), "--out", str(blocker / "charts"))
    one_line_error(*run(capsys, *args), "cannot create")


def test_a_bad_setting_is_one_line_and_exit_2(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("WEIR_CONFIG", str(tmp_path / "missing.toml"))
    one_line_error(*run(capsys), "missing.toml")


def test_the_charts_of_one_minute_fit_that_minute_and_show_every_series(
    spark: SparkSession, tmp_path: Path, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """One minute of data once drew an axis from 2025 to 2029 with nothing on it
    (a one-point step line is invisible; a one-minute span was widened to years)."""
    import matplotlib.dates as mdates
    import pandas as pd
    from matplotlib.figure import Figure

    one: list[Event | bytes] = [
        opened("one", 1, T0 + 5_000, node="n1"), closed("one", 2, T0 + 20_000, "keepalive"),
        opened("one", 3, T0 + 30_000, node="n1"), sub("one", 4, T0 + 31_000, "x/#"),
    ]  # fmt: skip
    write(spark, tmp_path, [one])
    drawn: dict[str, Figure] = {}
    save = report._save

    def keep(path: Path, figure: Figure) -> Path:
        drawn[path.name] = figure
        return save(path, figure)

    monkeypatch.setattr(report, "_save", keep)
    code, _, _ = run(capsys, "--data-dir", str(tmp_path), "--client", "one")
    assert code == 0
    assert {"churn.png", "subscriptions.png", "sessions.png"} <= set(drawn) and len(drawn) == 4
    start = mdates.date2num(pd.Timestamp(T0, unit="ms"))
    end = start + 1 / 1440  # the minute's end
    for name, figure in drawn.items():
        for axes in figure.axes:
            left, right = axes.get_xlim()
            assert left <= start and end <= right, name  # the minute is on the axis
            assert right - left < 2 / 1440, name  # and fills it: not years, not hours
            low, high = axes.get_ylim()
            heights = [p.get_height() for p in axes.patches]
            values = [y for line in axes.lines for y in line.get_ydata()] + heights
            assert values and low <= 0 <= min(values) and max(values) < high, name
            assert max(values) > 0, name  # each chart shows something counted
            for line in axes.lines:  # a series is seen: a segment, or markers
                xs = line.get_xdata()
                assert len(set(xs)) >= 2 or line.get_marker() not in (None, "None", ""), name
