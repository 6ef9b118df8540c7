"""bench.soak, the embedded default's long-run bench, at a tiny scale: it runs,
weighs every embedded process and restarts on the same data dir."""

from __future__ import annotations

import re

import pytest

from bench import soak


@pytest.mark.slow
def test_soak_weighs_every_embedded_process_and_restarts(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert soak.main(["--cycles", "300", "--sample", "150", "--persistent", "10"]) == 0
    out = capsys.readouterr().out
    weighed = [line for line in out.splitlines() if "RSS MiB" in line]
    assert len(weighed) == 4  # idle, 150 and 300 lives, idle after the restart
    for line in weighed:
        for name in ("redis-server", "tansu", "weir up"):
            found = re.search(rf"{name} (\d+\.\d)", line)
            assert found and float(found[1]) > 1.0, line
    assert re.search(r"300 lives: .*store sessions (\d+)", out)
    assert "restart: start-to-ready" in out


def test_soak_refuses_bad_arguments(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        soak.main(["--cycles", "0"])
    assert exit_.value.code == 2
    assert "must be positive" in capsys.readouterr().err
