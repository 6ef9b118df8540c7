"""`weir ban`: the cluster's ban table, from the command line.

`weir ban add|list|del` works on the cluster's ban table in Redis
(`services.auth.banned.RedisBans`): `--redis URL` (or WEIR_REDIS_URL, or a
config file's redis_url); without one, the Redis of the `weir up` running
on the data dir (`--data-dir`, default ./data: `services.embedded.endpoints`).
Adding a ban disconnects the clients it covers on every node at once (the
nodes follow the ban channel; a node that missed the message applies it
within `banned.POLL_S`). A node of `--backend memory` keeps its bans in its
own memory, which no other process can reach.

Exit codes: 0 done, 1 Redis unreachable (or no `weir up` running) or nothing
to delete, 2 bad usage.
"""

from __future__ import annotations

import asyncio
import calendar
import sys
import time
from collections.abc import Sequence
from typing import Any

import click

from services.auth.banned import Ban, BanError, RedisBans, checked
from services.cli import CONTEXT, Group, fail, run
from services.config import SettingsError, load
from services.config.flags import given, settings_flags, some
from services.embedded import endpoints
from services.store.redis import connect

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
TIMEOUT_S = 5.0
DURATION_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


@click.group("ban", cls=Group, context_settings=CONTEXT,
             help="Ban clients cluster-wide (Redis): by client id, user name or address.")
@click.option("--config", help="TOML config file naming redis_url")
@settings_flags(some("redis_url", "data_dir"))
@click.pass_context
def ban(ctx: click.Context, /, config: str | None, **flags: Any) -> None:
    ctx.obj = {"config": config, **given(flags)}  # read by the subcommand (after its --help)


def _redis_url(options: dict[str, Any]) -> str:
    """The named Redis, or the running `weir up`'s (one line, exit 1, if none runs)."""
    settings = load(options)
    if settings.redis_url is not None:
        return settings.redis_url
    return endpoints.backends(settings.data_dir, "weir ban")[0]


def who_options(function: Any) -> Any:
    """--clientid | --username | --peerhost: exactly one."""
    for kind, text in (("peerhost", "an address or a CIDR network"), ("username", "a user name"),
                       ("clientid", "a client id")):  # fmt: skip
        function = click.option(f"--{kind}", help=text)(function)
    return function


def one_who(who: dict[str, str | None]) -> tuple[str, str]:
    named = [(kind, value) for kind, value in who.items() if value is not None]
    if len(named) != 1:
        fail("give one of --clientid, --username, --peerhost")
    return named[0]


@ban.command("add", help="ban a client id, user name or address / CIDR")
@who_options
@click.option("--until", help="when it ends: 2026-12-31T00:00:00Z, a Unix time, or a duration "
              "from now (90s, 30m, 12h, 7d); default: never")  # fmt: skip
@click.option("--reason", default="")
@click.pass_obj
def add(options: dict[str, Any], /, until: str | None, reason: str, **who: str | None) -> int:
    redis_url = _redis_url(options)
    kind, value = one_who(who)
    now = time.time()
    ends = parse_until(until, now)
    if ends is not None and ends <= now:
        fail(f"--until {until} is in the past")
    try:
        wanted = checked(Ban(kind, value, ends, reason))
    except BanError as exc:
        fail(str(exc))
    return asyncio.run(_run(redis_url, "add", kind, value, wanted))


@ban.command("del", help="lift a ban")
@who_options
@click.pass_obj
def delete(options: dict[str, Any], /, **who: str | None) -> int:
    redis_url = _redis_url(options)
    kind, value = one_who(who)
    return asyncio.run(_run(redis_url, "del", kind, value, None))


@ban.command("list", help="the bans in force")
@click.pass_obj
def listing(options: dict[str, Any], /) -> int:
    return asyncio.run(_run(_redis_url(options), "list", "", "", None))


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
    return run(ban, argv, "weir ban")


async def _run(redis_url: str, command: str, kind: str, value: str, entry: Ban | None) -> int:
    client = connect(redis_url, TIMEOUT_S)  # one Redis or a cluster
    bans = RedisBans(client)
    try:
        async with asyncio.timeout(TIMEOUT_S):
            if entry is not None:
                await bans.add(entry)
                print(f"banned {entry.describe()}")
            elif command == "del":
                if not await bans.delete(kind, value):
                    print(f"weir ban: no ban of {kind} {value}", file=sys.stderr)
                    return EXIT_FAILED
                print(f"ban of {kind} {value} lifted")
            else:
                for listed in await bans.list():
                    print(listed.describe())
    except BanError as exc:
        print(f"weir ban: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except (OSError, TimeoutError, Exception) as exc:
        print(f"weir ban: cannot reach Redis at {redis_url}: {exc}", file=sys.stderr)
        return EXIT_FAILED
    finally:
        await client.aclose()
    return EXIT_OK
