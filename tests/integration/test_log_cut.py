"""The embedded default's log cut (services.node.logcut) keeps the state and drops the history.

A node on its own embedded Kafka and redis-server: a persistent subscriber
stays connected, a retained message is set, and many clean clients come
and go. The cut restarts the Kafka empty and seeds it with the store's live
state only. After it: a replay of the new log alone gives the node's view
(sessions, subscriptions, retained), far fewer events than the history
held; the connected subscriber still gets messages, a new subscription
gets the retained message, new appends land in the new log; and a restart
on the same data dir finds everything.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import redis

from services.event.kafka import KafkaEventLog, KafkaSettings
from services.node.logcut import LogCutter
from services.ports import free_port
from services.state.view import ClusterView
from services.state.writer import WriteThroughLog
from tests.integration.conftest import Paho, node_settings
from tests.support.backend_node import BackendNode
from tests.support.childenv import weir_env
from tests.support.supervised import REPO, alive, descendants
from tests.support.wait import wait_until

CLEAN_LIVES = 40


def embedded_settings(data: Path) -> Any:
    return replace(
        node_settings(), node_id="n1", backend="embedded", redis_url=None, kafka_bootstrap=None,
        data_dir=str(data),
    )  # fmt: skip


def replayed(bootstrap: str) -> tuple[Any, int]:
    """The view a replay of the log alone gives, and how many events it read."""

    async def run() -> tuple[Any, int]:
        log = KafkaEventLog(KafkaSettings(bootstrap=bootstrap, topic_prefix="weir."))
        view = ClusterView()
        try:
            count = await log.replay(view.apply)
        finally:
            await log.close()
        return view.snapshot(), count

    return asyncio.run(run())


def on_loop(runner: BackendNode, coro: Any, timeout: float = 60.0) -> Any:
    assert runner.loop is not None
    return asyncio.run_coroutine_threadsafe(coro, runner.loop).result(timeout)


def test_a_cut_log_holds_the_live_state_only_and_the_node_goes_on(tmp_path: Path) -> None:
    settings = embedded_settings(tmp_path / "data")
    runner = BackendNode(settings)
    runner.start()
    try:
        port = runner.mqtt_port
        keeper = Paho(port, "keeper", clean=False)
        assert keeper.connack()[1] == 0
        keeper.subscribe("k/#", qos=1)
        pub = Paho(port, "pub")
        assert pub.connack()[1] == 0
        pub.publish("r/1", b"kept", qos=1, retain=True)
        for i in range(CLEAN_LIVES):
            c = Paho(port, f"clean-{i}")
            assert c.connack()[1] == 0
            c.subscribe(f"c/{i}", qos=1)
            c.close()
        logstate = runner.node.broker.logstate
        events = logstate.events
        assert isinstance(events, WriteThroughLog) and events.renew is not None
        history = runner.call(lambda: events.appended)
        assert history >= 3 * CLEAN_LIVES
        state = runner.node.services.state
        assert state is not None

        # The view's rule 4 reaches the store (bootstrap hooks on_forget): with
        # a bound of 5, the store keeps 5 of the 40 ended clients. First the
        # tail reads the node's own events back (a bound this small is below
        # the tail's lag; the node's is 100,000).
        wait_until(
            lambda: sum(runner.call(events.positions).values()) >= history,
            "the tail read the log to its end",
        )

        def forget() -> int:
            logstate.view.keep_ended = 5
            return logstate.view.forget_ended()

        assert runner.call(forget) == CLEAN_LIVES - 5
        store = redis.Redis.from_url(runner.node.services.endpoints[0])
        ended = ("{weir.state}:sessions", "{weir.state}:floors")
        wait_until(
            lambda: [store.hlen(k) for k in ended] == [5 + 2, 5 + 2],  # + keeper and pub
            "the store forgot what the view forgot",
        )
        rewrites = int(store.info("persistence")["aof_rewrites"])
        cutter = LogCutter(logstate, state, "n1", cut_events=1)
        assert runner.call(cutter.due)
        seeded = on_loop(runner, cutter.cut())
        # and our redis-server's AOF is rewritten (an RDB image: a quick load at start)
        wait_until(
            lambda: int(store.info("persistence")["aof_rewrites"]) > rewrites,
            "the AOF rewrite after the cut",
        )
        store.close()

        bootstrap = runner.node.services.endpoints[1]
        view, count = replayed(bootstrap)
        assert count == seeded
        assert seeded < history // 4  # the clean lives are gone from the log
        assert view == runner.call(logstate.view.snapshot)  # and the state is all there

        pub.publish("k/1", b"after-cut", qos=1)  # routing and delivery go on
        m = keeper.message(timeout=10.0)
        assert (m.topic, m.payload) == ("k/1", b"after-cut")
        late = Paho(port, "late", clean=False)
        assert late.connack()[1] == 0
        late.subscribe("r/#", qos=1)  # appended to the new log
        m = late.message(timeout=10.0)
        assert (m.topic, m.payload, m.retain) == ("r/1", b"kept", True)
        late.close()
        keeper.close()
        pub.close()
        assert runner.call(lambda: events.appended) > 0
        view, _ = replayed(bootstrap)
        assert view == runner.call(logstate.view.snapshot)

        # The offsets the store reflects: where the node has read, once every
        # event below them is in the store (what weir streams verify compares at).
        assert on_loop(runner, events.record_offsets())
        offsets = on_loop(runner, state.offsets())
        assert offsets == runner.call(events.positions)
        assert sum(offsets.values()) >= seeded + 1
    finally:
        runner.stop()

    again = BackendNode(settings)  # same data dir: its redis-server keeps the store
    again.start()
    try:
        # The start re-seeded the log from the store, not through the store
        # again (what the node appended since, closing the last run, went through).
        events = again.node.broker.logstate.events
        assert isinstance(events, WriteThroughLog)
        written, appended = again.call(lambda: (events.writer.written, events.appended))
        assert appended >= 5 and written < appended  # keeper, late, 3 subs, r/1 ...
        subs = again.call(again.node.broker.logstate.view.all_subscriptions)
        assert set(subs) >= {"keeper", "late"}
        assert "k/#" in subs["keeper"] and "r/#" in subs["late"]
        assert again.call(lambda: again.node.broker.logstate.view.retained("r/1")) is not None

        # The view knows the ended clients the store kept (the re-seed left
        # them out of the log): past its bound it forgets them, the store too,
        # so restarts do not pile them up in the store.
        view = again.node.broker.logstate.view

        def forget_all() -> int:
            view.keep_ended = 0
            return view.forget_ended()

        assert again.call(forget_all) == 5 + 1  # and pub, whose clean session ended at the stop
        store = redis.Redis.from_url(again.node.services.endpoints[0])
        wait_until(
            lambda: store.hlen("{weir.state}:sessions") == 2,  # keeper and late, persistent
            "the store forgot the ended clients of the last run",
        )
        store.close()
    finally:
        again.stop()


CUT_EVERY_APPEND = """\
import sys
from services.node import logcut
logcut.LogCutter.__init__.__defaults__ = (1, 0.2)  # cut after 1 append, look every 0.2 s
from services.node.app import main
sys.exit(main(sys.argv[1:]))
"""


def test_a_kafka_restarted_by_a_cut_dies_with_a_killed_weir_up(tmp_path: Path) -> None:
    """The cut starts the Kafka again on weir up's main thread, so PR_SET_PDEATHSIG
    still ties it: a SIGKILL of weir up after a cut leaves no process behind, and
    the next weir up has the subscription made before the cut."""
    runner = tmp_path / "up_cutting.py"
    runner.write_text(CUT_EVERY_APPEND)
    data = tmp_path / "data"
    port = free_port()
    out = tmp_path / "up.log"
    env = weir_env()
    args = [sys.executable, str(runner), "--data-dir", str(data), "--mqtt-port", str(port),
            "--ws-port", "off"]  # fmt: skip
    with out.open("wb") as log:
        proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=REPO)
    try:
        wait_until(lambda: b" ready, mqtt on " in out.read_bytes(), "weir up ready", 60.0)
        kafka_before = {p for p in descendants(proc.pid) if "tansu" in cmdline(p)}
        assert len(kafka_before) == 1
        c = Paho(port, "keeper", clean=False)
        assert c.connack()[1] == 0
        c.subscribe("k/#", qos=1)
        c.close()

        def restarted() -> set[int]:
            return {p for p in descendants(proc.pid) if "tansu" in cmdline(p)} - kafka_before

        wait_until(lambda: bool(restarted()), "a cut restarted the Kafka", 30.0)
        everything = descendants(proc.pid)
    finally:
        proc.kill()
        proc.wait(30)
    for pid in everything:
        wait_until(lambda pid=pid: not alive(pid), f"child {pid} gone", 10.0)
    again = BackendNode(embedded_settings(data))
    again.start()
    try:
        subs = again.call(again.node.broker.logstate.view.all_subscriptions)
        assert "k/#" in subs.get("keeper", {})
    finally:
        again.stop()


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""
