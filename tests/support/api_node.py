"""`weir up` as a subprocess with its management API, and a small HTTP client for it.

`ApiNode` starts `python -m services up` on free loopback ports (MQTT 0,
HTTP 0) with `--api-key-file`, waits (with a deadline) for its ready line,
reads the ports from it and keeps draining its output (a node that logs
into a full pipe would block). `call` is one HTTP request with an API key
(or none, or a wrong one) answering (status, JSON or text).
"""

from __future__ import annotations

import base64
import json
import queue
import re
import signal
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from collections import deque
from pathlib import Path
from typing import Any

from tests.support.childenv import weir_env

REPO = Path(__file__).resolve().parents[2]
START_S = 60.0  # embedded Redis and Kafka on a shared two-core machine
STOP_S = 20.0
LOG_LINES = 400
_READY = re.compile(r"ready, mqtt on [^ ,]+:(\d+).*http on [^ ,]+:(\d+)")
KEY, SECRET = "ops", "s3cret-ops"


class ApiNode:
    def __init__(self, tmp: Path, *args: str, key_file: bool = True) -> None:
        self.tmp = tmp
        tmp.mkdir(parents=True, exist_ok=True)
        extra = list(args)
        if key_file:
            path = tmp / "keys.txt"
            path.write_text(f"# the first keys\n{KEY}:{SECRET}\n")
            extra += ["--api-key-file", str(path)]
        self.process = subprocess.Popen(
            [sys.executable, "-m", "services", "up", "--host", "127.0.0.1", "--mqtt-port", "0",
             "--ws-port", "off", "--http-port", "0", "--data-dir", str(tmp / "data"), *extra],
            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=weir_env(),
        )  # fmt: skip
        self.log: deque[str] = deque(maxlen=LOG_LINES)
        self._lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        found = None
        while found is None:
            try:
                line = self._lines.get(timeout=START_S)
            except queue.Empty:
                line = None
            if line is None:
                self.stop()
                raise RuntimeError("weir up did not start:\n" + "".join(self.log))
            found = _READY.search(line)
        self.mqtt_port, self.http_port = int(found.group(1)), int(found.group(2))

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.log.append(line)
            self._lines.put(line)
        self._lines.put(None)

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.http_port}{path}"

    def call(
        self, method: str, path: str, body: Any = None, *, auth: str | None = f"{KEY}:{SECRET}",
        basic64: bool = False,
    ) -> tuple[int, Any]:  # fmt: skip
        """(status, JSON body or text); `auth` None sends no Authorization header."""
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(self.url(path), data=data, method=method)
        if data is not None:
            request.add_header("Content-Type", "application/json")
        if auth is not None:
            token = base64.b64encode(auth.encode()).decode() if basic64 else auth
            request.add_header("Authorization", f"Basic {token}")
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                status, raw, kind = response.status, response.read(), response.headers
        except urllib.error.HTTPError as err:
            status, raw, kind = err.code, err.read(), err.headers
        if kind.get("Content-Type", "").startswith("application/json"):
            return status, json.loads(raw)
        return status, raw.decode()

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=STOP_S)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return self.process.returncode
