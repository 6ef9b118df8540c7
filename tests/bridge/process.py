"""`weir up` as a subprocess on the test's Redis and Kafka, to be SIGKILLed."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

from tests.support.childenv import weir_env

REPO = Path(__file__).resolve().parents[2]
_READY = re.compile(r"ready, mqtt on [^ ]+:(\d+)")


class WeirUp:
    """One run of `weir up --config CONFIG` (node id kill-1, MQTT on a free port)."""

    def __init__(self, config: Path, redis_url: str, bootstrap: str, prefix: str) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "services", "up", "--config", str(config),
             "--node-id", "kill-1", "--redis", redis_url, "--kafka", bootstrap,
             "--kafka-topic-prefix", prefix, "--host", "127.0.0.1", "--mqtt-port", "0",
             "--ws-port", "off", "--http-port", "off"],
            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=weir_env(),
        )  # fmt: skip
        assert self.process.stdout is not None
        seen = []
        for line in self.process.stdout:
            seen.append(line)
            found = _READY.search(line)
            if found:
                self.lines = seen
                threading.Thread(target=self._drain, daemon=True).start()
                self.port = int(found.group(1))
                return
        self.process.kill()
        raise AssertionError(f"weir up did not start: {''.join(seen)}")

    def _drain(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.append(line)

    def kill(self) -> None:
        os.kill(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=10)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)
