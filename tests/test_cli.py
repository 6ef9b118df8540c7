from __future__ import annotations

import subprocess
import sys

import pytest


def run_weir(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "services", *args],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_help_lists_commands() -> None:
    result = run_weir("--help")
    assert result.returncode == 0
    assert "up" in result.stdout and "bench" in result.stdout


def test_unknown_command_is_one_clear_line_and_exit_2() -> None:
    result = run_weir("frobnicate")
    assert result.returncode == 2
    assert "unknown command 'frobnicate'" in result.stderr
    assert "Traceback" not in result.stderr


def test_up_takes_the_often_tuned_limits() -> None:
    from services.config import load
    from services.node.app import parse_args

    args = parse_args(
        [
            "--max-connections", "123",
            "--max-packet-size", "4096",
            "--queue-limit", "77",
            "--max-keep-alive", "90",
            "--receive-maximum", "16",
        ]
    )  # fmt: skip
    limits = load(args, env={}).limits
    assert (
        limits.max_connections,
        limits.max_packet_size,
        limits.queue_limit,
        limits.max_keep_alive_s,
        limits.receive_maximum,
    ) == (123, 4096, 77, 90, 16)


def test_up_with_a_bad_limit_is_one_clear_line_and_exit_2() -> None:
    result = run_weir("up", "--max-connections", "0")
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "max_connections" in result.stderr
    assert "Traceback" not in result.stderr


def test_report_and_streams_are_commands_with_one_line_errors() -> None:
    assert "report" in run_weir("--help").stdout
    missing = run_weir("report", "--data-dir", "/nonexistent/weir-data")
    assert missing.returncode == 2 and "Traceback" not in missing.stderr
    assert len(missing.stderr.strip().splitlines()) == 1, missing.stderr
    job = run_weir("streams", "run", "nosuchjob", "--kafka", "127.0.0.1:1")
    assert job.returncode == 2 and "unknown job 'nosuchjob'" in job.stderr
    no_store = run_weir("streams", "run", "state", "--kafka", "127.0.0.1:1")
    assert no_store.returncode == 2 and "--redis" in no_store.stderr



def test_progress_is_plain_lines_when_not_a_terminal(capsys: pytest.CaptureFixture[str]) -> None:
    from services.cli import PLAIN_EVERY_S, Progress

    now = [0.0]
    with Progress("weir x", terminal=False).step("things", 10) as step:
        step._clock, step._said_at = (lambda: now[0]), 0.0
        step.say("reading a ...")
        step.advance(3)  # too soon after the last line: nothing
        now[0] = PLAIN_EVERY_S
        step.advance(4)
    assert capsys.readouterr().err.splitlines() == ["weir x: reading a ...",
                                                    "weir x: things: 7 of 10"]  # fmt: skip


def test_progress_is_a_bar_in_a_terminal(capsys: pytest.CaptureFixture[str]) -> None:
    from services.cli import Progress

    with Progress("weir x", terminal=True).step("things", None) as step:
        step.say("reading a ...")
        step.set_total(5)
        step.advance(5)
        assert step._bar is not None and step._bar.tasks[0].finished
    err = capsys.readouterr().err
    assert "weir x:" not in err and "5/5" in err
