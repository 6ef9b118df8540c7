"""bench.appends: a burst of event-log appends, every one acknowledged, its cost reported."""

from __future__ import annotations

import pytest
import uvloop

from bench import appends

pytestmark = pytest.mark.kafka


def test_a_round_appends_them_all_and_reports_the_loops_cost(kafka_bootstrap: str) -> None:
    # An append that failed or was never acknowledged would raise out of the gather.
    (line,) = uvloop.run(appends.run(kafka_bootstrap, 50, 1))
    assert line["round"] == 1 and line["appends"] == 50
    assert line["wall_ms"] > 0 and line["loop_cpu_us_per_append"] > 0
    assert line["process_cpu_us_per_append"] >= line["loop_cpu_us_per_append"] * 0.9
    assert line["max_lag_ms"] >= 0


def test_bad_counts_are_refused_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        appends.main(["--appends", "0"])
    assert exit_.value.code == 2
    assert "--appends and --rounds must be at least 1" in capsys.readouterr().err
