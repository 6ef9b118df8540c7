"""Redis work per message: `INFO commandstats` and `INFO stats`, before and after a run.

What Redis can tell: `total_commands_processed` counts every command,
including the ones a Lua script runs inside Redis (measured on Redis 7.0:
one EVAL of a script doing SET and INCR adds 3), and `commandstats` counts
calls per command the same way. A round trip is one command the client sent
(EVALSHA, EVAL, FCALL or a plain command); a pipeline of several commands is
one round trip but counts as several here, so the figures below are an upper
bound on round trips:

- `redis_script_calls_per_msg`: EVAL/EVALSHA/FCALL calls per delivered message
  (the node's Lua calls; each is one client command);
- `redis_commands_per_msg`: every command, inner ones included;
- `redis_calls`: the per-command deltas, for the details.
The INFO calls this module makes itself are subtracted.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import redis

from bench.errors import BrokerUnavailable

SCRIPT_COMMANDS = frozenset({"eval", "evalsha", "eval_ro", "evalsha_ro", "fcall", "fcall_ro"})
OWN_INFO_CALLS = 2  # the "after" snapshot's two INFO commands count themselves
TIMEOUT_S = 5.0


@dataclass(frozen=True, slots=True)
class RedisSnapshot:
    total_commands: int
    calls: dict[str, int]


def snapshot(url: str) -> RedisSnapshot:
    """Command counters of the Redis at `url`; BrokerUnavailable if it does not answer."""
    try:
        with redis.Redis.from_url(url, socket_timeout=TIMEOUT_S) as client:
            stats: dict[str, Any] = client.info("stats")
            commands: dict[str, Any] = client.info("commandstats")
    except redis.RedisError as exc:
        raise BrokerUnavailable(f"--redis-url {url}: {exc}") from exc
    calls = {}
    for key, value in commands.items():
        name = key.removeprefix("cmdstat_")
        calls[name] = int(value["calls"]) if isinstance(value, dict) else 0
    return RedisSnapshot(int(stats["total_commands_processed"]), calls)


def figures(before: RedisSnapshot, after: RedisSnapshot, messages: int) -> dict[str, Any]:
    """The result-line fields for `messages` delivered between the two snapshots."""
    calls = {
        name: count - before.calls.get(name, 0)
        for name, count in after.calls.items()
        if count - before.calls.get(name, 0) > 0
    }
    own = OWN_INFO_CALLS
    if "info" in calls:
        calls["info"] -= own
        if calls["info"] <= 0:
            del calls["info"]
    total = after.total_commands - before.total_commands - own
    scripts = sum(n for name, n in calls.items() if name in SCRIPT_COMMANDS)
    per = messages or 1
    return {
        "redis_commands": total,
        "redis_script_calls": scripts,
        "redis_commands_per_msg": round(total / per, 3),
        "redis_script_calls_per_msg": round(scripts / per, 4),
        "redis_calls": dict(sorted(calls.items(), key=lambda kv: -kv[1])),
    }
