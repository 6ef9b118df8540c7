"""`weir up` backend flags: one line and exit 1 when a backend is unreachable."""

from __future__ import annotations

import subprocess
import sys

from services.ports import free_port
from tests.support.childenv import weir_env

START_S = 30.0


def run_up(*args: str) -> subprocess.CompletedProcess[str]:
    env = weir_env()
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "services",
            "up",
            "--host",
            "127.0.0.1",
            "--mqtt-port",
            "0",
            "--ws-port",
            "off",
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=START_S,
        env=env,
        check=False,
    )


def test_unreachable_redis_is_one_line_exit_1(kafka_bootstrap: str) -> None:
    closed = free_port()  # nothing listens there
    result = run_up("--redis", f"redis://127.0.0.1:{closed}/0", "--kafka", kafka_bootstrap)
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "cannot reach Redis" in lines[0], result.stderr
    assert "ready" not in result.stdout


def test_bad_backend_is_a_usage_error() -> None:
    result = run_up("--backend", "postgres")
    assert result.returncode == 2
    assert "backend" in result.stderr
