"""<data-dir>/endpoints.json (services.embedded.endpoints): how the CLIs find a weir up."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from services.embedded import endpoints
from tests.support.wait import wait_until


def weir_up_lookalike() -> subprocess.Popen[bytes]:
    """A live process that looks like a weir up (its cmdline says so), once it
    does: until its exec, its cmdline is the test's own (a race the tests lost)."""
    up = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)", "weir", "up"])
    cmdline = Path(f"/proc/{up.pid}/cmdline")
    wait_until(lambda: b"weir" in cmdline.read_bytes(), "the lookalike's exec", timeout=10.0)
    return up


def test_announced_found_and_removed(tmp_path: Path) -> None:
    endpoints.announce(tmp_path, "redis://127.0.0.1:1/0", "127.0.0.1:2", "weir.", "n1", "h:3")
    written = endpoints.path(tmp_path).read_text()
    assert f'"pid": {os.getpid()}' in written and "redis://127.0.0.1:1/0" in written
    up = weir_up_lookalike()
    try:
        write_for(tmp_path, up.pid)  # a live process that looks like a weir up
        found = endpoints.find(tmp_path)
        assert (found.pid, found.redis_url) == (up.pid, "redis://x:1/0")
        endpoints.remove(tmp_path)  # not this process's: kept
        assert endpoints.path(tmp_path).exists()
        endpoints.remove(tmp_path, pid=up.pid)
    finally:
        up.kill()
        up.wait()
    with pytest.raises(endpoints.EndpointsError, match=r"running .* \(no endpoints.json\)"):
        endpoints.find(tmp_path)


def write_for(tmp_path: Path, pid: int) -> None:
    endpoints.write(tmp_path, endpoints.Endpoints(pid, "redis://x:1/0", "x:2", "weir.", "n", "x:3"))


def test_a_pid_that_is_gone_or_not_a_weir_up_is_none_running(tmp_path: Path) -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    write_for(tmp_path, gone.pid)
    with pytest.raises(endpoints.EndpointsError, match=rf"pid {gone.pid} of endpoints.json"):
        endpoints.find(tmp_path)
    other = subprocess.Popen(["sleep", "30"])  # its pid given to another program
    try:
        write_for(tmp_path, other.pid)
        with pytest.raises(endpoints.EndpointsError, match="is gone"):
            endpoints.find(tmp_path)
    finally:
        other.kill()
        other.wait()


def test_an_unreadable_file_is_one_line(tmp_path: Path) -> None:
    endpoints.path(tmp_path).write_text("{not json")
    with pytest.raises(endpoints.EndpointsError, match="unreadable") as raised:
        endpoints.find(tmp_path)
    assert "\n" not in str(raised.value)


CAUGHT: list[object] = []


def run(config: object) -> int:
    """A job for `weir streams run` in the test below: notes its config."""
    CAUGHT.append(config)
    return 0


def test_streams_run_with_no_url_uses_the_running_weir_up(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from streams import cli

    monkeypatch.setitem(cli.JOBS, "analytics", __name__)  # this module's `run`
    argv = ["analytics", "--available-now", "--data-dir", str(tmp_path)]
    assert cli.main(argv) == 2  # none running (its one line: the test below)
    up = weir_up_lookalike()
    try:
        endpoints.write(
            tmp_path, endpoints.Endpoints(up.pid, "redis://h:1/0", "h:2", "p.", "n", "h:3")
        )
        assert cli.main(argv) == 0
    finally:
        up.kill()
        up.wait()
    (config,) = CAUGHT
    found = (config.bootstrap, config.redis_url, config.topic_prefix)  # type: ignore[attr-defined]
    assert found == ("h:2", "redis://h:1/0", "p.")


def test_streams_run_with_no_weir_up_is_one_line(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "services", "streams", "run", "analytics", "--data-dir",
         str(tmp_path)],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 2
    assert done.stderr.startswith(f"weir streams run: no weir up is running on data dir {tmp_path}")
    assert len(done.stderr.strip().splitlines()) == 1
