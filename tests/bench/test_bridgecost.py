"""bench.bridgecost: bridged publishes, every record in Kafka, their cost reported."""

from __future__ import annotations

import pytest
import uvloop

from bench import bridgecost
from services.config.bridges import Mode

pytestmark = pytest.mark.kafka


@pytest.mark.parametrize("mode", [Mode.ASYNC, Mode.SYNC])
def test_rounds_bridge_every_record_and_report_the_loops_cost(
    kafka_bootstrap: str, mode: Mode
) -> None:
    # A refused, failed or dropped record would raise out of the round.
    lines = uvloop.run(bridgecost.run(kafka_bootstrap, mode, 200, 2))
    assert [line["round"] for line in lines] == [1, 2]
    for line in lines:
        assert line["publishes"] == 200 and line["loop_cpu_us_per_publish"] > 0
        assert line["process_cpu_us_per_publish"] >= line["loop_cpu_us_per_publish"] * 0.9
    assert bridgecost.summary(lines)["loop_cpu_us_min"] == min(
        line["loop_cpu_us_per_publish"] for line in lines
    )


def test_bad_counts_are_refused_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        bridgecost.main(["--rounds", "0"])
    assert exit_.value.code == 2
    assert "--publishes and --rounds must be at least 1" in capsys.readouterr().err
