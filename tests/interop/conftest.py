"""The broker the interop matrix runs against: one Weir node for the module.

A real node (tests/support/backend_node.py) on the session's redis-server and
embedded Kafka, as `weir up` runs by default, with MQTT over TCP, TLS (a test
CA made with trustme) and WebSocket. `WEIR_INTEROP_BROKER=mosquitto` runs
the same matrix against /usr/sbin/mosquitto instead, to compare (not in CI).
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

pytest.register_assert_rewrite("tests.interop.scenarios")

from services.ports import free_port  # noqa: E402
from tests.interop.api import Broker  # noqa: E402
from tests.listeners.conftest import make_pki  # noqa: E402
from tests.support.backend_node import backend_settings, start_node  # noqa: E402

MOSQUITTO = "/usr/sbin/mosquitto"
START_S = 10.0


def _weir(request: pytest.FixtureRequest, root: Path) -> Iterator[Broker]:
    pki = make_pki(root)
    redis_url = request.getfixturevalue("_redis_service_url").rsplit("/", 1)[0] + "/7"
    bootstrap = request.getfixturevalue("kafka_bootstrap")
    base = backend_settings(redis_url, bootstrap, f"i{uuid.uuid4().hex[:10]}.", "interop")
    listeners = replace(base.listeners, tls_port=0, certfile=pki.certfile, keyfile=pki.keyfile)
    node = start_node(replace(base, listeners=listeners))
    try:
        ports = {x.name: x.port for x in node.node.listeners}
        yield Broker("weir", "127.0.0.1", ports["mqtt"], ports["tls"], ports["ws"], pki.cafile)
    finally:
        node.stop()


def _mosquitto(root: Path) -> Iterator[Broker]:
    if not os.access(MOSQUITTO, os.X_OK):
        pytest.skip(f"{MOSQUITTO} is not installed")
    pki = make_pki(root)
    port, tls_port, ws_port = free_port(), free_port(), free_port()
    conf = root / "mosquitto.conf"
    conf.write_text(
        "allow_anonymous true\nuser root\n"  # run as root, it would drop to `mosquitto`
        f"listener {port} 127.0.0.1\n"
        f"listener {tls_port} 127.0.0.1\ncertfile {pki.certfile}\nkeyfile {pki.keyfile}\n"
        f"listener {ws_port} 127.0.0.1\nprotocol websockets\n"
    )
    log = (root / "mosquitto.log").open("wb")
    proc = subprocess.Popen([MOSQUITTO, "-c", str(conf)], stdout=log, stderr=log)
    try:
        deadline = time.monotonic() + START_S
        while True:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 1):
                break
            assert proc.poll() is None, (root / "mosquitto.log").read_text()
            assert time.monotonic() < deadline, "mosquitto did not start"
            time.sleep(0.05)
        yield Broker("mosquitto", "127.0.0.1", port, tls_port, ws_port, pki.cafile)
    finally:
        proc.terminate()
        proc.wait(10)
        log.close()


@pytest.fixture(scope="module")
def broker(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Broker]:
    root = tmp_path_factory.mktemp("interop")
    if os.environ.get("WEIR_INTEROP_BROKER") == "mosquitto":
        yield from _mosquitto(root)
    else:
        yield from _weir(request, root)



def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """The client x scenario table of the matrix, when it ran (notes below it)."""
    cells: dict[tuple[str, str], str] = {}
    notes: list[str] = []
    for outcome in ("passed", "failed", "skipped"):
        for report in terminalreporter.stats.get(outcome, []):
            nodeid = getattr(report, "nodeid", "")
            if "test_matrix.py::test_interop[" not in nodeid or report.when == "teardown":
                continue
            if outcome == "passed" and report.when != "call":
                continue
            client, _, scenario = nodeid.split("[", 1)[1].rstrip("]").partition("-")
            cell = {"passed": "ok", "failed": "FAIL", "skipped": "skip"}[outcome]
            note = dict(report.user_properties).get("note")
            if outcome == "skipped" and isinstance(report.longrepr, tuple):
                note = str(report.longrepr[2]).removeprefix("Skipped: ")
                note = note.removeprefix(f"{client} cannot run {scenario}: ")
            if note:
                notes.append(f"[{len(notes) + 1}] {client} {scenario}: {note}")
                cell += f" [{len(notes)}]"
            cells[client, scenario] = cell
    if not cells:
        return
    clients = list(dict.fromkeys(c for c, _ in cells))
    scenarios = list(dict.fromkeys(s for _, s in cells))
    terminalreporter.section("interop matrix")
    terminalreporter.write_line(f"{'':<20} " + " ".join(f"{c:<9}" for c in clients))
    for scenario in scenarios:
        row = " ".join(f"{cells.get((c, scenario), '-'):<9}" for c in clients)
        terminalreporter.write_line(f"{scenario:<20} {row}")
    for line in notes:
        terminalreporter.write_line(line)
