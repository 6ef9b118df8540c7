from __future__ import annotations

import subprocess
import sys


def test_cli_bad_port_is_one_line_exit_2() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "services", "up", "--mqtt-port", "nope"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert "mqtt_port" in result.stderr


def test_cli_unknown_flag_exit_2() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "services", "up", "--frobnicate"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
