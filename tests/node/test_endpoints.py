"""<data-dir>/endpoints.json (services.embedded.endpoints): how the CLIs find a weir up."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from services.embedded import endpoints


def test_announced_found_and_removed(tmp_path: Path) -> None:
    endpoints.announce(tmp_path, "redis://127.0.0.1:1/0", "127.0.0.1:2", "weir.", "n1", "h:3")
    written = endpoints.path(tmp_path).read_text()
    assert f'"pid": {os.getpid()}' in written and "redis://127.0.0.1:1/0" in written
    up = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)", "weir", "up"])
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
