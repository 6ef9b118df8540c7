"""The embedded redis-server is waited for while it loads its data (services.embedded.redis_server).

A redis-server loading a large AOF answers PING with -LOADING for as long
as it loads (a second per 100,000 sessions, more on a busy machine); `weir
up` must wait for it rather than give up after START_TIMEOUT_S. A real
redis-server's load time follows the machine's load, so here a socket
answers as Redis does while loading, for longer than the bound, then PONG:
the old wait failed on it every time.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from services.embedded import redis_server
from services.embedded.redis_server import RedisServer, RedisServerError

BOUND_S = 0.2
LOADING_S = 2.0  # ten bounds


def loading_redis(sock: socket.socket, until: float) -> None:
    """Answer each connection's PING with -LOADING until `until`, then +PONG."""
    while True:
        try:
            conn, _ = sock.accept()
        except OSError:  # closed: the test is over
            return
        with conn:
            conn.recv(64)
            loading = time.monotonic() < until
            conn.sendall(
                b"-LOADING Redis is loading the dataset in memory\r\n" if loading else b"+PONG\r\n"
            )


@pytest.mark.parametrize("answers", ["loading", "nothing"])
def test_a_loading_redis_is_waited_for_and_a_silent_one_is_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, answers: str
) -> None:
    monkeypatch.setattr(redis_server, "START_TIMEOUT_S", BOUND_S)
    listening = socket.create_server(("127.0.0.1", 0))
    until = time.monotonic() + LOADING_S
    if answers == "loading":
        threading.Thread(target=loading_redis, args=(listening, until), daemon=True).start()
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    server = RedisServer(tmp_path, port=listening.getsockname()[1], process=process)
    try:
        if answers == "loading":
            server.wait_ready()
            assert time.monotonic() >= until  # it waited out the load, past its bound
        else:  # accepted, never answered: the bound holds
            started = time.monotonic()
            with pytest.raises(RedisServerError, match="not ready"):
                server.wait_ready()
            assert time.monotonic() - started < LOADING_S
    finally:
        listening.close()
        process.kill()
        process.wait()
