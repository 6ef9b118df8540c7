from __future__ import annotations

import subprocess
import sys


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
