"""`weir bench --profile`: py-spy's commands, its one-line failure, a real flame graph."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from bench import profile
from bench.cli import main
from bench.errors import BenchError

PERMISSION_DENIED = (
    "Error: Permission Denied: Try running again with elevated permissions by going "
    "'sudo env \"PATH=$PATH\" !!'"
)
BUSY = (
    "def busy_broker():\n    print('running', flush=True)\n    while True:\n"
    "        sum(range(1000))\nbusy_broker()\n"
)


def test_commands_and_file_name() -> None:
    svg = Path("/p/pairs-20261126T120005Z.svg")
    now = datetime(2026, 11, 26, 12, 0, 5, tzinfo=UTC)
    assert profile.svg_path("pairs", now, Path("/p")) == svg
    assert profile.check_command("/bin/py-spy", 42) == ["/bin/py-spy", "dump", "--pid", "42"]
    assert profile.record_command("/bin/py-spy", 42, svg) == [
        "/bin/py-spy", "record", "--pid", "42", "--output", str(svg),
        "--format", "flamegraph", "--nonblocking",
    ]  # fmt: skip
    assert Path(profile.__file__).resolve().parent / "profiles" == profile.PROFILES


def fake_py_spy(tmp_path: Path, output: str, status: int) -> str:
    script = tmp_path / "py-spy"
    script.write_text(f"#!/bin/sh\necho '{output}' >&2\nexit {status}\n")
    script.chmod(0o755)
    return str(script)


def test_a_permission_error_is_one_line_before_the_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    fake = fake_py_spy(tmp_path, PERMISSION_DENIED.replace("'", ""), 1)
    monkeypatch.setattr(profile, "find_py_spy", lambda: fake)
    ran: list[object] = []
    monkeypatch.setattr("bench.cli._run_all", lambda *a: ran.append(a) or [])
    assert main(["pairs", "--profile", "--broker-pid", "4242"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith("weir bench: --profile: py-spy may not attach to pid 4242 (permission")
    assert ran == []  # failed before the run


def test_another_failure_names_py_spy_error_line(tmp_path: Path) -> None:
    fake = fake_py_spy(tmp_path, "Error: Failed to find python version from target process", 1)
    with (
        pytest.raises(BenchError, match=r"py-spy failed on pid 7: Error: Failed to find python"),
        profile.profiling(7, tmp_path / "x.svg", fake),
    ):
        pass


def test_profile_needs_a_local_broker(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["pairs", "--profile", "--host", "10.0.0.1"]) == 2
    assert "--profile attaches to a broker on this machine" in capsys.readouterr().err


def test_report_dir_needs_a_peer(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["pairs", "--report-dir", str(tmp_path)]) == 2
    assert "--report-dir writes a comparison" in capsys.readouterr().err


@pytest.fixture
def busy() -> Iterator[subprocess.Popen[bytes]]:
    child = subprocess.Popen([sys.executable, "-c", BUSY], stdout=subprocess.PIPE)
    try:
        assert child.stdout is not None
        assert child.stdout.readline() == b"running\n"  # its interpreter is up: py-spy finds it
        yield child
    finally:
        child.kill()
        child.wait()


def test_a_real_flame_graph_of_a_busy_process(
    tmp_path: Path, busy: subprocess.Popen[bytes]
) -> None:
    py_spy = profile.find_py_spy()
    check = subprocess.run(profile.check_command(py_spy, busy.pid), capture_output=True,
                           text=True, check=False, timeout=30)  # fmt: skip
    if "permission denied" in (check.stderr + check.stdout).lower():
        pytest.skip("py-spy may not attach here (ptrace not allowed)")
    svg = tmp_path / "profiles" / "busy.svg"
    with profile.profiling(busy.pid, svg, py_spy):
        time.sleep(1.0)  # the profiled "run": about 100 samples at py-spy's 100 Hz
    text = svg.read_text()
    assert text.lstrip().startswith("<?xml") and "<svg" in text
    assert "busy_broker" in text
