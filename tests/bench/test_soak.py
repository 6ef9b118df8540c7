"""`weir bench soak|restart|footprint`, the embedded default's own scenarios, at a
tiny scale: they run the real weir up, weigh every embedded process and restart
on the same data dir (bench.soak)."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from bench import cli


def lines(out: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def weighed(record: dict[str, Any]) -> None:
    for name in ("redis-server", "tansu", "weir up"):
        assert record["rss_mib"][name] > 1.0, record
    assert record["rss_sum_mib"] >= sum(record["rss_mib"].values()) - 0.2


@pytest.mark.slow
def test_soak_weighs_every_embedded_process_and_restarts(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["soak", "--cycles", "300", "--sample", "150", "--sessions", "10"]
    assert cli.main(argv) == 0
    records = lines(capsys.readouterr().out)
    *curve, result = records
    assert [c["lives"] for c in curve] == [0, 0, 150, 300]  # idle, sessions made, two samples
    for record in [*curve, result["after_restart"]]:
        weighed(record)
    assert curve[-1]["store_sessions"] >= 300  # the ended clients, below the store's bound
    assert result["scenario"] == "soak" and result["cycles"] == 300
    assert result["sessions_lost_while_running"] == 0 and result["failed_lives"] == 0
    assert result["sessions_kept_of_sample"] == [10, 10]
    assert 0 < result["restart_to_ready_s"] < 60
    assert result["curve"] == curve


@pytest.mark.slow
def test_restart_times_the_start_with_its_sessions_and_footprint_weighs_idle(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert cli.main(["restart", "--sessions", "30"]) == 0
    (result,) = lines(capsys.readouterr().out)
    assert result["sessions"] == 30 and 0 < result["start_to_ready_s"] < 60
    assert result["after_start"]["store_sessions"] == 30
    weighed(result["after_start"])
    assert cli.main(["footprint", "--duration", "0.5"]) == 0
    (result,) = lines(capsys.readouterr().out)
    weighed(result)
    assert result["store_sessions"] == 0


@pytest.mark.parametrize(
    "argv",
    [["soak", "--cycles", "0"], ["restart", "--vs", "127.0.0.1:1883"], ["footprint", "--profile"]],
)
def test_the_embedded_scenarios_refuse_bad_arguments(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert "must be positive" in err or "starts its own weir up" in err


def test_no_soak_life_begins_past_the_deadline() -> None:
    """--max-seconds holds inside a sample too: no life is begun after it (port 1:
    nothing listens there, so a life begun would fail the call)."""
    from bench import soak

    assert soak._cycles(1, 0, 1000, 10, 20, deadline=time.monotonic() - 1) == soak.Lives()


def test_a_failed_soak_life_is_counted_and_the_soak_goes_on() -> None:
    """Port 1: nothing listens, every life fails; each is counted, none raises."""
    from bench import soak

    lives = soak._cycles(1, 0, 30, 10, 5, deadline=time.monotonic() + 60)
    assert (lives.ran, lives.failed, lives.lost) == (30, 30, 0)
    assert "cannot connect to port 1" in lives.first_failure
