"""`weir bench --profile`: a py-spy flame graph of the broker for the run.

py-spy attaches to the broker's process (ptrace), so it may not be allowed:
a process of another user, `kernel.yama.ptrace_scope` >= 1 for a non-root
user, a container without SYS_PTRACE. A `py-spy dump` first finds that out
in a fraction of a second, before the run, and the option fails with one
line. `py-spy record` then samples until the run ends: it writes the SVG
when it gets SIGINT (its Ctrl-C), so the profile covers the run however long
it takes. `--nonblocking`: py-spy does not stop the broker for each sample,
which would slow the very figures the run measures.
"""

from __future__ import annotations

import contextlib
import shutil
import signal
import subprocess
import sysconfig
import tempfile
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Final

from bench.errors import BenchError

PROFILES: Final = Path(__file__).resolve().parent / "profiles"
CHECK_TIMEOUT_S: Final = 30.0  # a dump of a busy broker takes well under a second
STOP_TIMEOUT_S: Final = 60.0  # writing the SVG of a long run's samples


def svg_path(scenario: str, now: datetime, folder: Path = PROFILES) -> Path:
    """Where the flame graph of a `scenario` run started at `now` (UTC) goes."""
    return folder / f"{scenario}-{now:%Y%m%dT%H%M%SZ}.svg"


def find_py_spy() -> str:
    """The py-spy binary: on PATH, else beside this interpreter's scripts."""
    found = shutil.which("py-spy") or shutil.which("py-spy", path=sysconfig.get_path("scripts"))
    if found is None:
        raise BenchError("--profile needs py-spy (pip install py-spy, or the test extra)")
    return found


def check_command(py_spy: str, pid: int) -> list[str]:
    return [py_spy, "dump", "--pid", str(pid)]


def record_command(py_spy: str, pid: int, svg: Path) -> list[str]:
    return [py_spy, "record", "--pid", str(pid), "--output", str(svg),
            "--format", "flamegraph", "--nonblocking"]  # fmt: skip


def why(pid: int, output: str) -> str:
    """One line for py-spy's failure on `pid`, from what it printed."""
    if "permission denied" in output.lower():
        return (
            f"--profile: py-spy may not attach to pid {pid} (permission denied: run as the "
            "broker's user or root, with ptrace allowed: kernel.yama.ptrace_scope=0 or a "
            "container with SYS_PTRACE)"
        )
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    first = next((line for line in lines if line.startswith("Error")), lines[0] if lines else "")
    return f"--profile: py-spy failed on pid {pid}: {first or 'no output'}"


@contextlib.contextmanager
def profiling(pid: int, svg: Path, py_spy: str | None = None) -> Iterator[Path]:
    """Record `pid` into `svg` while the body runs; BenchError (one line) when
    py-spy cannot attach (before the body) or writes no flame graph (after)."""
    exe = py_spy or find_py_spy()
    try:
        check = subprocess.run(
            check_command(exe, pid),
            capture_output=True, text=True, timeout=CHECK_TIMEOUT_S, check=False,
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise BenchError(f"--profile: cannot run {exe}: {exc}") from None
    if check.returncode != 0:
        raise BenchError(why(pid, check.stderr + check.stdout))
    svg.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryFile("w+") as errors:  # a file: a long run's warnings never block it
        recorder = subprocess.Popen(
            record_command(exe, pid, svg), stdout=subprocess.DEVNULL, stderr=errors, text=True
        )
        try:
            yield svg
        finally:
            if recorder.poll() is None:
                recorder.send_signal(signal.SIGINT)
            try:
                recorder.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                recorder.kill()
                recorder.wait()
        errors.seek(0)
        if recorder.returncode != 0 or not svg.exists():
            raise BenchError(why(pid, errors.read()))
