"""Command line of the admission: `weir up`'s limit options and `weir ban`.

`weir ban add|list|del` works on the cluster's ban table in Redis
(`services.auth.banned.RedisBans`): `--redis URL` (or WEIR_REDIS_URL, or a
config file's redis_url; `weir up` prints its Redis in its ready line).
Adding a ban disconnects the clients it covers on every node at once (the
nodes follow the ban channel; a node that missed the message applies it
within `banned.POLL_S`). A node of `--backend memory` keeps its bans in its
own memory, which no other process can reach.

Exit codes: 0 done, 1 Redis unreachable or nothing to delete, 2 bad usage.
"""

from __future__ import annotations

import argparse
import asyncio
import calendar
import sys
import time
from collections.abc import Sequence

from services.auth.banned import KINDS, Ban, BanError, RedisBans, checked
from services.settings import SettingsError, load

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
TIMEOUT_S = 5.0
DURATION_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


RATE = "(a rate as 100/second or 10 per 5 seconds)"
UP_OPTIONS = (  # weir up: (flag, settings path, help)
    ("--max-conn-rate", "max_conn_rate",
     f"CONNECTs per listener; over: CONNACK 0x9F (3.x: 3) {RATE}"),
    ("--max-conn-rate-per-ip", "max_conn_rate_per_ip",
     f"CONNECTs per client address; over: CONNACK 0x9F (3.x: 3) {RATE}"),
    ("--client-msg-rate", "client_msg_rate",
     f"PUBLISHes read per client; over: reading pauses, nothing dropped {RATE}"),
    ("--client-byte-rate", "client_byte_rate",
     f"bytes read per client; over: reading pauses, nothing dropped {RATE}"),
    ("--max-subscriptions", "max_subscriptions",
     "topic filters per client (0: no limit); past it SUBACK 0x97 (3.x: 0x80)"),
    ("--max-inflight", "max_inflight",
     "QoS 1/2 messages out to a client unacknowledged (default: 3.x 32, 5.0 its Receive "
     "Maximum); 5.0 clients get at most their Receive Maximum"),
    ("--rate-storage", "rate_storage",
     "memory (per node, default) or redis (cluster-wide) for connection rates and flapping"),
    ("--flapping-max-connects", "flapping_max_connects",
     "CONNECTs of one client id allowed in the flapping window (15)"),
    ("--flapping-max-connects-ip", "flapping_max_connects_ip",
     "CONNECTs from one address allowed in the flapping window (0: not counted)"),
    ("--flapping-window", "flapping_window_s", "flapping window, seconds (60)"),
    ("--flapping-ban", "flapping_ban_s", "how long a flapping client is banned, seconds (300)"),
)  # fmt: skip


def add_up_options(p: argparse.ArgumentParser) -> None:
    """`weir up`'s options for rates, subscriptions and inflight per client, flapping."""
    for flag, path, text in UP_OPTIONS:
        p.add_argument(flag, dest=f"limits.{path}", help=text)
    p.add_argument(
        "--flapping",
        dest="limits.flapping",
        action="store_const",
        const=True,
        help="ban a client id that connects too often (15 times in 60 s: 300 s)",
    )


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        raise SettingsError(message)


def parser() -> argparse.ArgumentParser:
    p = _Parser(prog="weir ban", description="Ban clients cluster-wide (Redis).")
    p.add_argument("--redis", dest="redis_url", help="the cluster's Redis (WEIR_REDIS_URL)")
    p.add_argument("--config", help="TOML config file naming redis_url")
    sub = p.add_subparsers(dest="command", required=True)
    add = sub.add_parser("add", help="ban a client id, user name or address / CIDR")
    dele = sub.add_parser("del", help="lift a ban")
    for q in (add, dele):
        who = q.add_mutually_exclusive_group(required=True)
        who.add_argument("--clientid")
        who.add_argument("--username")
        who.add_argument("--peerhost", help="an address or a CIDR network")
    add.add_argument("--until", help="when it ends: 2026-12-31T00:00:00Z, a Unix time, or "
                     "a duration from now (90s, 30m, 12h, 7d); default: never")  # fmt: skip
    add.add_argument("--reason", default="")
    sub.add_parser("list", help="the bans in force")
    return p


def parse_until(text: str | None, now: float) -> float | None:
    if text is None:
        return None
    unit = DURATION_UNITS.get(text[-1:])
    if unit is not None and text[:-1].isdigit():
        return now + int(text[:-1]) * unit
    try:
        return float(text)
    except ValueError:
        pass
    try:
        return float(calendar.timegm(time.strptime(text, "%Y-%m-%dT%H:%M:%SZ")))
    except ValueError:
        raise SettingsError(f"--until: expected a time or a duration, got {text!r}") from None


def main(argv: Sequence[str]) -> int:
    try:
        args = parser().parse_args(list(argv))
        settings = load({"config": args.config, "redis_url": args.redis_url})
        if settings.redis_url is None:
            raise SettingsError("needs the cluster's Redis: --redis URL (or WEIR_REDIS_URL)")
        kind = next((k for k in KINDS if getattr(args, k, None)), "")
        ban = None
        if args.command == "add":
            until = parse_until(args.until, time.time())
            if until is not None and until <= time.time():
                raise SettingsError(f"--until {args.until} is in the past")
            ban = checked(Ban(kind, getattr(args, kind), until, args.reason))
    except (SettingsError, BanError) as exc:
        print(f"weir ban: {exc}", file=sys.stderr)
        return EXIT_USAGE
    return asyncio.run(_run(settings.redis_url, args, kind, ban))


async def _run(redis_url: str, args: argparse.Namespace, kind: str, ban: Ban | None) -> int:
    import redis.asyncio as aioredis

    client = aioredis.Redis.from_url(redis_url, socket_connect_timeout=TIMEOUT_S)
    bans = RedisBans(client)
    try:
        async with asyncio.timeout(TIMEOUT_S):
            if ban is not None:
                await bans.add(ban)
                print(f"banned {ban.describe()}")
            elif args.command == "del":
                if not await bans.delete(kind, getattr(args, kind)):
                    print(f"weir ban: no ban of {kind} {getattr(args, kind)}", file=sys.stderr)
                    return EXIT_FAILED
                print(f"ban of {kind} {getattr(args, kind)} lifted")
            else:
                for entry in await bans.list():
                    print(entry.describe())
    except BanError as exc:
        print(f"weir ban: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except (OSError, TimeoutError, Exception) as exc:
        print(f"weir ban: cannot reach Redis at {redis_url}: {exc}", file=sys.stderr)
        return EXIT_FAILED
    finally:
        await client.aclose()
    return EXIT_OK
