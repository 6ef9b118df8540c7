"""`weir up --backend memory` as a subprocess: a live node whose memory a test can read.

For the robustness suite (tests/robustness). A node in a thread of the test
process (`NodeRunner`) shares its heap with pytest and Hypothesis, so its
resident set says little about the node; a process of its own does: its RSS
(VmRSS in /proc) is the node's alone. The memory backends keep the process
single (no Redis, no Kafka) so the measure is the MQTT edge, codec and
channel under test.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
from collections import deque
from pathlib import Path

from tests.support.childenv import weir_env

START_S = 20.0
STOP_S = 10.0
LOG_LINES = 200  # the last lines of the node's output kept for failure messages
REPO = Path(__file__).resolve().parents[2]
_READY = re.compile(r"ready, mqtt on [^ ]+:(\d+)")


class LiveNode:
    """One `python -m services up` process on a free port (port 0, read from its ready line)."""

    def __init__(self, *args: str) -> None:
        env = weir_env()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "services", "up", "--backend", "memory",
             "--host", "127.0.0.1", "--mqtt-port", "0", "--ws-port", "off", *args],
            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
        )  # fmt: skip
        assert self.process.stdout is not None
        line = self.process.stdout.readline()  # the first line says ready, or why not
        found = _READY.search(line)
        if found is None:
            self.stop()
            raise RuntimeError(f"weir up did not start: {line.strip()!r}")
        self.mqtt_port = int(found.group(1))
        self.log: deque[str] = deque([line], maxlen=LOG_LINES)
        # Drained all along: a node that logs into a full pipe would block.
        self._drain = threading.Thread(target=self._read_log, daemon=True)
        self._drain.start()

    def _read_log(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.log.append(line)

    def rss_kib(self) -> int:
        """The node's resident set size in KiB (Linux /proc)."""
        status = Path(f"/proc/{self.process.pid}/status").read_text()
        found = re.search(r"^VmRSS:\s+(\d+) kB", status, re.MULTILINE)
        assert found is not None, status
        return int(found.group(1))

    def open_files(self) -> int:
        """File descriptors the node holds: its listener, loop, and one per connection."""
        return len(os.listdir(f"/proc/{self.process.pid}/fd"))

    def alive(self) -> bool:
        return self.process.poll() is None

    def stop(self) -> int:
        """SIGTERM, then the exit code (killed past STOP_S)."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=STOP_S)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return self.process.returncode
