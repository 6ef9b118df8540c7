"""`--persistent` sessions and the `--redis-url` command counts."""

from __future__ import annotations

import redis

from bench import wire
from bench.redisstats import figures, snapshot
from tests.support.bench_cli import bench

INNER = "redis.call('incr', KEYS[1]); redis.call('incr', KEYS[1]); return 1"


def test_persistent_connect_golden_bytes() -> None:
    assert wire.connect("c1", clean=False) == b"\x10\x0e\x00\x04MQTT\x04\x00\x00\x00\x00\x02c1"
    assert wire.connect("c1", version=wire.MQTT_5, clean=False, session_expiry_s=3600) == (
        b"\x10\x14\x00\x04MQTT\x05\x00\x00\x00\x05\x11\x00\x00\x0e\x10\x00\x02c1"
    )


def test_redis_figures_count_script_calls_and_inner_commands(redis_url: str) -> None:
    with redis.Redis.from_url(redis_url) as client:
        script = client.register_script(INNER)
        client.script_load(INNER)  # so no NOSCRIPT round falls inside the measurement
        before = snapshot(redis_url)
        for _ in range(10):
            script(keys=["k"])
        after = figures(before, snapshot(redis_url), messages=5)
    # ten EVALSHA calls, and the twenty INCRs they ran inside Redis
    assert after["redis_calls"]["incr"] == 20
    assert after["redis_script_calls"] == 10
    assert after["redis_script_calls_per_msg"] == 2.0
    assert after["redis_commands"] == sum(after["redis_calls"].values())
    assert "info" not in after["redis_calls"]


def test_persistent_pairs_use_fixed_ids_and_clean_up(
    mosquitto: tuple[int, int], redis_url: str
) -> None:
    port = str(mosquitto[0])
    args = ("pairs", "--qos", "1", "--port", port, "--messages", "2000", "--persistent")
    [line] = bench(*args, "--redis-url", redis_url)
    assert line["persistent"] is True
    assert line["received"] == line["expected"] == 2000 and line["loss"] == 0
    assert line["acked_lost"] == 0
    assert line["sessions_discarded"] == 200
    assert line["redis_script_calls"] == 0  # Mosquitto does not use this Redis
    [again] = bench(*args, "--mqtt", "5", "--no-cleanup")
    assert again["loss"] == 0 and again["acked_lost"] == 0 and "sessions_discarded" not in again
