from __future__ import annotations

import subprocess
import sys

import pytest

from bench.cli import main


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        ([], "SCENARIO"),
        (["warp"], "'warp' is not one of"),
        (["fan-in", "--qos", "2"], "--qos"),
        (["pairs", "--messages", "0"], "must be positive"),
        (["pairs", "--duration", "-1"], "positive number"),
        (["pairs", "--port", "70000"], "not a TCP port"),
        (["latency", "--vs", "nohostport"], "HOST:PORT"),
        (["fan-in", "--vs", "h:1", "--spawn-mosquitto"], "give one"),
        (["idle", "--connections", "40000", "--workers", "1"], "--workers >= 3"),
        (["fan-in", "--bogus"], "No such option '--bogus'"),
        (["fan-out", "--messages", "200000"], "deliveries"),
        (["fan-in", "--size", "-1"], "--size must be 0..1048576"),
        (["pairs", "--messages", "1000000", "--size", "10000"], "MiB"),
        (["idle", "--sub-port", "1884"], "not idle"),
        (["latency", "--sub-port", "0"], "not a TCP port"),
        (["latency", "--ports", "3"], "--ports applies to idle"),
        (["idle", "--port", "65535", "--ports", "2"], "passes port 65535"),
        (["pairs", "--sub-port", "1884", "--vs", "h:1"], "--vs compares one broker"),
        (["idle", "--ports", "2", "--spawn-mosquitto"], "--vs compares one broker"),
        (["pairs", "--scrape", "http://127.0.0.1:1/metrics"], "--scrape applies to idle"),
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
    from services.ports import free_port

    assert main(["fan-in", "--port", str(free_port()), "--duration", "2"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "cannot connect" in err


def test_help_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--help"]) == 0
    assert "--vs" in capsys.readouterr().out


class _Captured(Exception):
    pass


def test_cluster_options_reach_the_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """--sub-port puts the subscribers on the other node; --ports spreads idle connections."""
    import bench.cli
    from bench.idle import IdleConfig
    from bench.plan import RunConfig

    seen: list[object] = []

    def capture(cfg: object, *_: object) -> object:
        seen.append(cfg)
        raise _Captured

    async def capture_plan(cfg: object, plan: object) -> object:
        return capture(cfg)

    monkeypatch.setattr(bench.cli, "run_plan", capture_plan)
    monkeypatch.setattr(bench.cli, "run_idle", capture)
    for argv in (["latency", "--port", "1883", "--sub-port", "1884"],
                 ["idle", "--port", "1883", "--ports", "3", "--connections", "7"]):  # fmt: skip
        with pytest.raises(_Captured):
            bench.cli.run(bench.cli.parse_args(argv))
    run, idle = seen
    assert isinstance(run, RunConfig) and isinstance(idle, IdleConfig)
    assert (run.port_for("p0"), run.port_for("s0"), run.port_for("probe")) == (1883, 1884, 1883)
    assert [idle.port_of(i) for i in range(7)] == [1883, 1884, 1885, 1883, 1884, 1885, 1883]
    assert idle.broker == "127.0.0.1:1883-1885"
