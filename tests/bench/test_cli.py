from __future__ import annotations

import subprocess
import sys

import pytest

from bench.cli import main


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        ([], "scenario"),
        (["warp"], "invalid choice: 'warp'"),
        (["fan-in", "--qos", "2"], "--qos"),
        (["pairs", "--messages", "0"], "must be positive"),
        (["pairs", "--duration", "-1"], "positive number"),
        (["pairs", "--port", "70000"], "not a TCP port"),
        (["latency", "--vs", "nohostport"], "HOST:PORT"),
        (["fan-in", "--vs", "h:1", "--spawn-mosquitto"], "give one"),
        (["idle", "--connections", "40000", "--workers", "1"], "--workers >= 3"),
        (["fan-in", "--bogus"], "unrecognized arguments: --bogus"),
        (["fan-out", "--messages", "200000"], "deliveries"),
        (["fan-in", "--size", "-1"], "--size must be 0..1048576"),
        (["pairs", "--messages", "1000000", "--size", "10000"], "MiB"),
    ],
)
def test_bad_arguments_exit_2_with_one_line(
    argv: list[str], needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.count("\n") == 1
    assert captured.err.startswith("weir bench: ")
    assert needle in captured.err


def test_the_weir_command_exits_2_on_bad_arguments() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "services", "bench", "fan-in", "--qos", "9"],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr.strip().count("\n") == 0
    assert "Traceback" not in result.stderr


def test_unreachable_broker_exits_1_with_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    from bench.mosquitto import free_port

    assert main(["fan-in", "--port", str(free_port()), "--duration", "2"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "cannot connect" in err


def test_help_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--help"]) == 0
    assert "--vs" in capsys.readouterr().out
