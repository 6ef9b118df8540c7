"""`weir ctl` on bans, API keys, alarms, nodes, the cluster and the data bridges."""

from __future__ import annotations

import time
from typing import Any

import click

from services.admin.ctl.base import Ctl, ctl, paging, pass_ctl
from services.admin.ctl.client import segment
from services.auth.cli import one_who, parse_until, who_options
from services.cli import Group

KINDS = ("clientid", "username", "peerhost")

# -- banned ----------------------------------------------------------------------------


@ctl.group("banned", cls=Group, help="the cluster's bans (the table weir ban writes)")
def banned() -> None:
    pass


BAN_COLUMNS = [("as", "as"), ("who", "who"), ("until", "until"), ("reason", "reason"),
               ("by", "by")]  # fmt: skip


@banned.command("list", help="the bans in force")
@paging
@pass_ctl
def banned_list(c: Ctl, /, page: int | None, limit: int | None) -> None:
    answer = c.call("GET", "/banned", params={"page": page, "limit": limit})
    c.out.rows(answer, BAN_COLUMNS, "bans")


@banned.command("add", help="ban a client id, user name or address / CIDR; its clients "
                "are disconnected on every node")  # fmt: skip
@who_options
@click.option("--until", help="when it ends: 2026-12-31T00:00:00Z, a Unix time, or a duration "
              "from now (90s, 30m, 12h, 7d); default: never")  # fmt: skip
@click.option("--reason", default="")
@pass_ctl
def banned_add(c: Ctl, /, until: str | None, reason: str, **who: str | None) -> None:
    kind, value = one_who(who)
    body: dict[str, Any] = {"as": kind, "who": value, "reason": reason, "by": "weir ctl"}
    ends = parse_until(until, time.time())
    if ends is not None:
        body["until"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ends))
    shown = c.call("POST", "/banned", body=body)
    c.out.done(f"banned {kind} {value}" + (f" until {shown['until']}" if shown["until"] else ""),
               shown)  # fmt: skip


@banned.command("delete", help="lift a ban")
@who_options
@pass_ctl
def banned_delete(c: Ctl, /, **who: str | None) -> None:
    kind, value = one_who(who)
    c.call("DELETE", f"/banned/{kind}/{segment(value)}")
    c.out.done(f"ban of {kind} {value} lifted")


# -- API keys --------------------------------------------------------------------------


@ctl.group("apikey", cls=Group, help="list, create and revoke API keys")
def apikey() -> None:
    pass


@apikey.command("list", help="the API keys (never their secrets)")
@pass_ctl
def apikey_list(c: Ctl, /) -> None:
    columns = [("api_key", "key"), ("name", "name"), ("desc", "description"),
               ("enable", "enabled"), ("created_at", "created at")]  # fmt: skip
    c.out.rows(c.call("GET", "/api_key"), columns, "API keys")


@apikey.command("create", help="create an API key; its secret is shown this once")
@click.argument("name")
@click.option("--desc", default="", help="what it is for")
@click.option("--secret", help="its secret (default: made at random)")
@pass_ctl
def apikey_create(c: Ctl, /, name: str, desc: str, secret: str | None) -> None:
    body = {"name": name, "desc": desc, **({"api_secret": secret} if secret else {})}
    made = c.call("POST", "/api_key", body=body)
    c.out.done(f"created API key {made['api_key']}; its secret (shown once): "
               f"{made['api_secret']}\nuse: --api-key {made['api_key']}:{made['api_secret']}",
               made)  # fmt: skip


@apikey.command("revoke", help="revoke an API key (every node refuses it at once)")
@click.argument("name")
@pass_ctl
def apikey_revoke(c: Ctl, /, name: str) -> None:
    c.call("DELETE", f"/api_key/{segment(name)}")
    c.out.done(f"revoked API key {name}")


# -- alarms ----------------------------------------------------------------------------


@ctl.command("alarms", help="the answering node's active alarms (--past: the ended ones)")
@click.option("--past", is_flag=True, help="the alarms that ended")
@paging
@pass_ctl
def alarms(c: Ctl, /, past: bool, page: int | None, limit: int | None) -> None:
    params = {"activated": "false" if past else "true", "page": page, "limit": limit}
    columns = [("name", "alarm"), ("message", "message"), ("activate_at", "since"),
               ("deactivate_at", "until"), ("node", "node")]  # fmt: skip
    c.out.rows(c.call("GET", "/alarms", params=params), columns, "alarms")


# -- nodes -----------------------------------------------------------------------------

NODE_COLUMNS = [("node", "node"), ("node_status", "status"), ("version", "version"),
                ("uptime", "uptime"), ("connections", "sessions"),
                ("live_connections", "connected"), ("memory_used", "memory")]  # fmt: skip


def _readable(node: dict[str, Any]) -> dict[str, Any]:
    """Uptime and memory in units a reader takes in (the JSON keeps ms and bytes)."""
    shown = dict(node)
    if isinstance(node.get("uptime"), int):
        s = node["uptime"] // 1000
        shown["uptime"] = f"{s // 86400}d {s // 3600 % 24}h {s // 60 % 60}m {s % 60}s"
    for field in ("memory_used", "memory_total"):
        if isinstance(node.get(field), int):
            shown[field] = f"{node[field] / 2**20:,.1f} MiB"
    return shown


@ctl.group("node", cls=Group, help="one node: its status, drain it")
def node() -> None:
    pass


@node.command("status", help="a node's status (default: the node that answers)")
@click.argument("node_id", required=False)
@pass_ctl
def node_status(c: Ctl, /, node_id: str | None) -> None:
    if node_id is None:
        doc = c.call("GET", "/nodes")[0]  # the answering node comes first, in full
    else:
        doc = c.call("GET", f"/nodes/{segment(node_id)}")
    c.out.record(doc if c.out.as_json else _readable(doc))


@node.command("drain", help="drain a node: its clients told to use another server, then it "
              "stops (default: the node that answers)")  # fmt: skip
@click.argument("node_id", required=False)
@pass_ctl
def node_drain(c: Ctl, /, node_id: str | None) -> None:
    target = node_id or c.call("GET", "/nodes")[0]["node"]
    answer = c.call("POST", f"/nodes/{segment(target)}/drain")
    c.out.done(f"node {target} is draining", answer)


@ctl.group("cluster", cls=Group, help="the cluster's nodes")
def cluster() -> None:
    pass


@cluster.command("status", help="the answering node and its live peers")
@pass_ctl
def cluster_status(c: Ctl, /) -> None:
    nodes = c.call("GET", "/nodes")
    c.out.rows(nodes if c.out.as_json else [_readable(n) for n in nodes], NODE_COLUMNS, "nodes")


@cluster.command("processes", help="under weir up --nodes/--workers: the supervisor's view "
                 "of its nodes (pid, running, log)")  # fmt: skip
@pass_ctl
def cluster_processes(c: Ctl, /) -> None:
    columns = [("node", "node"), ("pid", "pid"), ("running", "running"), ("log", "log")]
    c.out.rows(c.call("GET", "/supervisor/nodes"), columns, "nodes")


@ctl.command("stats", help="the answering node's counts (connections, sessions, topics...)")
@pass_ctl
def stats(c: Ctl, /) -> None:
    answer = c.call("GET", "/stats")
    c.out.record(answer if c.out.as_json else answer[0])


# -- data bridges ----------------------------------------------------------------------

BRIDGE_COLUMNS = [("name", "bridge"), ("direction", "dir"), ("status", "status"),
                  ("records", "records"), ("failures", "failures"), ("dropped", "dropped"),
                  ("buffered_records", "in flight"), ("lag", "lag"),
                  ("latency", "mean latency")]  # fmt: skip


def _bridge_row(bridge: dict[str, Any]) -> dict[str, Any]:
    """One line per bridge: its figures flat, the mean latency in ms (out only)."""
    figures = bridge.get("metrics") or {}
    row = {**bridge, **figures}
    records, total = figures.get("records"), figures.get("latency_us_total")
    if bridge.get("direction") == "out" and isinstance(total, int) and total and records:
        row["latency"] = f"{total / records / 1000:.2f} ms"
    if bridge.get("direction") == "out":
        row["lag"] = ""
    return row


@ctl.command("bridges", help="the answering node's data bridges: state and figures")
@pass_ctl
def bridges(c: Ctl, /) -> None:
    answer = c.call("GET", "/bridges")
    c.out.rows(answer if c.out.as_json else [_bridge_row(b) for b in answer], BRIDGE_COLUMNS,
               "bridges")  # fmt: skip
