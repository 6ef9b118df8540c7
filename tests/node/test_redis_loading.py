"""The embedded redis-server is waited for while it loads its data (services.embedded.redis_server).

A redis-server loading a large AOF answers PING with -LOADING for as long
as it loads (a second per 100,000 sessions, more on a busy machine); `weir
up` must wait for it rather than give up after START_TIMEOUT_S.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import redis

from services.embedded import redis_server
from services.embedded.redis_server import RedisServer
from tests.support.wait import wait_until

KEYS = 1_000_000  # an RDB that takes about a second to load


@pytest.mark.redis
@pytest.mark.slow  # a million keys written, loaded twice: 5-15 s
def test_a_redis_server_loading_its_data_is_waited_for(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    server = RedisServer(tmp_path / "redis").start()
    try:
        with redis.Redis.from_url(server.url) as client:
            pipe = client.pipeline(transaction=False)
            for start in range(0, KEYS, 5000):
                pipe.mset({f"k{i}": i for i in range(start, start + 5000)})
            pipe.execute()
            client.bgrewriteaof()  # the data as an RDB base: one load at start
            wait_until(
                lambda: not client.info("persistence")["aof_rewrite_in_progress"],
                "the AOF rewrite",
            )
        loads: list[tuple[float, bytes]] = []
        ping = server._ping

        def seen() -> bytes:
            answer = ping()
            loads.append((time.monotonic(), answer))
            return answer

        monkeypatch.setattr(server, "_ping", seen)
        server.stop()
        server.start()  # same port and data dir: how long does it load?
        loading = [t for t, a in loads if a.startswith(b"-LOADING")]
        assert loading, "the load was too quick to be seen: the test proves nothing"
        # A bound well under that load (but past the process's own start, before
        # it listens): the next start outlasts its bound, and waits it out.
        load_s, before_s = loads[-1][0] - loading[0], loading[0] - loads[0][0]
        bound = max(load_s / 4, 2 * before_s)
        assert bound < load_s / 2, f"a load of {load_s:.2f} s is too quick to prove anything"
        monkeypatch.setattr(redis_server, "START_TIMEOUT_S", bound)
        loads.clear()
        server.stop()
        server.start()
        assert loads[-1][0] - loads[0][0] > bound
        with redis.Redis.from_url(server.url) as client:
            assert client.dbsize() == KEYS
    finally:
        server.stop()
