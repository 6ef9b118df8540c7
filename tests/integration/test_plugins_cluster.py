"""session.takenover fires on a cross-node takeover, on the node the session
was taken from (as EMQX fires it in the old channel): two `weir up`
processes on one Redis and Kafka, each loading a recording plugin."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.integration.conftest import Paho
from tests.integration.test_cluster_nodes import SESSION_TAKEN_OVER, NodeProc
from tests.support.wait import wait_until

pytestmark = [pytest.mark.redis, pytest.mark.kafka]

TAKEOVER_S = 15.0  # the kick travels the cluster link; a busy machine's margin


def recording(tmp: Path, node: str) -> tuple[Path, Path]:
    out = tmp / f"{node}.hooks"
    config = tmp / f"{node}.toml"
    config.write_text(
        '[[plugin]]\nname = "tests.hooks.recorder:Recorder"\n[plugin.config]\n'
        f'path = "{out}"\npoints = ["session.takenover", "session.resumed"]\n'
    )
    return config, out


def fired(path: Path) -> list[tuple[str, list[str]]]:
    if not path.exists():
        return []
    return [(d["point"], d["args"]) for d in map(json.loads, path.read_text().splitlines())]


def test_session_takenover_fires_on_the_node_it_was_taken_from(
    redis_url: str, kafka_bootstrap: str, kafka_topic_prefix: str, tmp_path: Path
) -> None:
    config_a, out_a = recording(tmp_path, "a")
    config_b, out_b = recording(tmp_path, "b")
    args = (redis_url, kafka_bootstrap, kafka_topic_prefix, tmp_path)
    a = NodeProc("node-a", *args, extra=("--config", str(config_a)))
    made: list[Paho] = []
    try:
        b = NodeProc("node-b", *args, extra=("--config", str(config_b)))
        try:
            first = Paho(a.port, "mover", v5=True, clean=False, session_expiry=300)
            made.append(first)
            first.connack()
            # A round trip first: node-a's first store calls for this session (the delivery
            # pump started at CONNACK) are done before b takes it over. One still in flight
            # meets b's newer epoch (Fenced) and node-a closes the socket without 0x8E: a race
            # seen once in a full run, left open in the session's note.
            first.subscribe("mover/barrier", 1)
            second = Paho(b.port, "mover", v5=True, clean=False, session_expiry=300)
            made.append(second)
            flags, _ = second.connack()
            assert flags.session_present
            assert first.disconnects.get(timeout=TAKEOVER_S) == SESSION_TAKEN_OVER
            wait_until(lambda: fired(out_a) != [], "node-a's session.takenover", TAKEOVER_S)
            assert fired(out_a) == [("session.takenover", ["mover"])]
            assert fired(out_b) == [("session.resumed", ["mover"])]  # b took it: no takenover
        finally:
            for c in made:
                c.close()
            b.stop()
    finally:
        a.stop()
