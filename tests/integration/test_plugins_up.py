"""`weir up` loads the plugins its config file names: topic_rewrite and the
webhook work end to end; its log lines are JSON with the client's fields;
SIGHUP reads the log level again; a missing plugin stops it in one line."""

from __future__ import annotations

import json
import queue
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from services.ports import free_port
from tests.hooks.webhook_server import Endpoint
from tests.integration.conftest import Paho
from tests.support.childenv import weir_env  # a free HTTP port, not 18083

START_S = 20.0


def config(path: Path, url: str, level: str) -> Path:
    path.write_text(f'''
log_level = "{level}"

[[plugin]]
name = "topic_rewrite"
[plugin.config]
rules = [{{ filter = "old/#", from = '^old/(.+)$', to = "new/$1" }}]

[[plugin]]
name = "webhook"
[plugin.config]
url = "{url}"
events = ["client.connected", "message.publish"]
''')
    return path


class Up:
    def __init__(self, *args: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "services", "up", "--host", "127.0.0.1", "--ws-port", "off",
             "--backend", "memory", *args],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=weir_env(),
        )  # fmt: skip
        self.lines: queue.Queue[str] = queue.Queue()
        self.seen: list[str] = []  # every line taken from `lines`
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line)

    def line(self, containing: str) -> str:
        """The next stdout line that contains `containing` (the ones before: skipped)."""
        while True:
            line = self.lines.get(timeout=START_S)
            self.seen.append(line)
            if containing in line:
                return line

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=START_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture
def endpoint() -> Iterator[Endpoint]:
    e = Endpoint()
    yield e
    e.close()


def test_up_runs_the_configured_plugins_and_logs_json(endpoint: Endpoint, tmp_path: Path) -> None:
    port = free_port()
    path = config(tmp_path / "weir.toml", endpoint.url, "warning")
    up = Up("--config", str(path), "--mqtt-port", str(port), "--node-id", "n1")
    made: list[Paho] = []
    try:
        up.line("ready")
        sub = Paho(port, "p-sub", v5=True)
        made.append(sub)
        assert sub.connack()[1] == 0
        sub.subscribe("new/#", 1)
        pub = Paho(port, "p-pub", v5=True)
        made.append(pub)
        assert pub.connack()[1] == 0
        pub.publish("old/a", b"hello", 1)
        got = sub.message()
        assert (got.topic, got.payload) == ("new/a", b"hello")  # topic_rewrite
        events: list[dict[str, Any]] = [endpoint.next() for _ in range(3)]
        assert sorted((e["event"], e["clientid"]) for e in events) == [
            ("client.connected", "p-pub"), ("client.connected", "p-sub"),
            ("message.publish", "p-pub"),
        ]  # fmt: skip
        published = next(e for e in events if e["event"] == "message.publish")
        assert (published["topic"], published["payload"]) == ("new/a", "hello")  # after rewrite
        # At "warning" the connected lines were not written; SIGHUP reads "info".
        config(path, endpoint.url, "info")
        up.proc.send_signal(signal.SIGHUP)
        up.line("log level info")
        assert not [x for x in up.seen if "weir.clients" in x]  # none at "warning"
        later = Paho(port, "p-later", v5=True)
        made.append(later)
        assert later.connack()[1] == 0
        line = json.loads(up.line('"weir.clients"'))  # the first client line since the start
        assert line["msg"] == "client p-later connected"
        assert line["client_id"] == "p-later" and line["node"] == "n1"
        assert line["peer"].startswith("127.0.0.1:") and line["level"] == "info"
    finally:
        for c in made:
            c.close()
        up.stop()
    assert up.proc.returncode == 0


@pytest.mark.parametrize(("plugin", "says"), [
    ('name = "no_such_plugin"', "plugin no_such_plugin: no entry point"),
    ('name = "topic_rewrite"\nconfig = { rules = [{ filter = "a" }] }',
     "plugin topic_rewrite: ValueError: rule 1: needs exactly filter, from and to"),
])  # fmt: skip
def test_a_plugin_that_cannot_load_stops_up_in_one_line(
    tmp_path: Path, plugin: str, says: str
) -> None:
    path = tmp_path / "weir.toml"
    path.write_text(f"[[plugin]]\n{plugin}\n")
    up = Up("--config", str(path), "--mqtt-port", "0")
    _out, err = up.proc.communicate(timeout=START_S)
    assert up.proc.returncode == 2
    assert "Traceback" not in err
    assert len(err.strip().splitlines()) == 1 and says in err, err
