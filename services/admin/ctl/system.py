"""`weir ctl` on users, plugins, listeners, the log level and draining a node."""

from __future__ import annotations

import sys

import click

from services.admin.ctl.base import Ctl, ctl, paging, pass_ctl
from services.admin.ctl.client import segment
from services.cli import Group, fail

# -- users (the stores `weir passwd` writes) -------------------------------------------


@ctl.group("users", cls=Group, help="clients' users: the password file's, or Redis's (--redis)")
def users() -> None:
    pass


def _store(function: click.decorators.FC) -> click.decorators.FC:
    store = click.option("--redis", "in_redis", is_flag=True,
                         help="the users in Redis (default: --password-file)")  # fmt: skip
    return store(function)


def _backend(in_redis: bool) -> str:
    return "redis" if in_redis else "password_file"


@users.command("list", help="user names")
@click.option("--like", help="part of the name")
@_store
@paging
@pass_ctl
def users_list(c: Ctl, /, like: str | None, in_redis: bool, page: int | None,
               limit: int | None) -> None:  # fmt: skip
    params = {"like_user_id": like, "page": page, "limit": limit}
    answer = c.call("GET", f"/authentication/{_backend(in_redis)}/users", params=params)
    c.out.rows(answer, [("user_id", "user")], "users")


def _password(stdin: bool) -> str:
    if stdin:
        password = sys.stdin.readline().rstrip("\n")
    else:
        password = click.prompt("password", hide_input=True, confirmation_prompt=True)
    if not password:
        fail("the password is empty")
    return password


@users.command("add", help="add a user, or change its password (prompting twice)")
@click.argument("user")
@click.option("--password-stdin", is_flag=True, help="read the password from one line of stdin")
@click.option("--scram", is_flag=True, help="SCRAM-SHA-256 credentials too")
@_store
@pass_ctl
def users_add(c: Ctl, /, user: str, password_stdin: bool, scram: bool, in_redis: bool) -> None:
    body = {"user_id": user, "password": _password(password_stdin), "scram": scram}
    path = f"/authentication/{_backend(in_redis)}/users"
    existing = c.call("GET", path, params={"like_user_id": user, "limit": 10_000})["data"]
    if any(u["user_id"] == user for u in existing):
        c.out.done(f"changed the password of {user}",
                   c.call("PUT", f"{path}/{segment(user)}", body=body))  # fmt: skip
    else:
        c.out.done(f"added user {user}", c.call("POST", path, body=body))


@users.command("delete", help="delete a user")
@click.argument("user")
@_store
@pass_ctl
def users_delete(c: Ctl, /, user: str, in_redis: bool) -> None:
    c.call("DELETE", f"/authentication/{_backend(in_redis)}/users/{segment(user)}")
    c.out.done(f"deleted user {user}")


# -- plugins, listeners, the log level ------------------------------------------------


@ctl.group("plugins", cls=Group, help="the answering node's plugins: list, start, stop")
def plugins() -> None:
    pass


@plugins.command("list", help="plugins installed or configured, and which run")
@pass_ctl
def plugins_list(c: Ctl, /) -> None:
    columns = [("name", "plugin"), ("running", "running"), ("configured", "configured")]
    c.out.rows(c.call("GET", "/plugins"), columns, "plugins")


@plugins.command("start", help="load a plugin (until the node restarts)")
@click.argument("name")
@pass_ctl
def plugins_start(c: Ctl, /, name: str) -> None:
    c.out.done(f"started plugin {name}", c.call("PUT", f"/plugins/{segment(name)}/start"))


@plugins.command("stop", help="unload a plugin (until the node restarts)")
@click.argument("name")
@pass_ctl
def plugins_stop(c: Ctl, /, name: str) -> None:
    c.out.done(f"stopped plugin {name}", c.call("PUT", f"/plugins/{segment(name)}/stop"))


@ctl.command("listeners", help="the answering node's MQTT listeners")
@pass_ctl
def listeners(c: Ctl, /) -> None:
    columns = [("name", "listener"), ("type", "type"), ("bind", "address"),
               ("running", "running"), ("current_connections", "connections"),
               ("max_connections", "limit")]  # fmt: skip
    c.out.rows(c.call("GET", "/listeners"), columns, "listeners")


@ctl.command("log-level", help="the answering node's log level; LEVEL sets it (until a "
             "SIGHUP or a restart)")  # fmt: skip
@click.argument("level", required=False,
                type=click.Choice(["debug", "info", "warning", "error"]))  # fmt: skip
@pass_ctl
def log_level(c: Ctl, /, level: str | None) -> None:
    if level is None:
        answer = c.call("GET", "/log/level")
        c.out.done(answer["level"], answer)
    else:
        c.out.done(f"log level {level}", c.call("PUT", "/log/level", body={"level": level}))


# -- packet traces (the answering node's) ---------------------------------------------


@ctl.group("trace", cls=Group, help="packet traces of a client or a topic, on the node that "
           "answers (--url per node for others)")  # fmt: skip
def trace() -> None:
    pass


@trace.command("list", help="traces kept, running or stopped")
@pass_ctl
def trace_list(c: Ctl, /) -> None:
    columns = [("name", "trace"), ("type", "type"), ("clientid", "client id"),
               ("topic", "topic"), ("status", "status"), ("log_size", "bytes"),
               ("node", "node")]  # fmt: skip
    c.out.rows(c.call("GET", "/trace"), columns, "traces")


@trace.command("start", help="trace a client's packets (--clientid) or a topic's (--topic)")
@click.argument("name")
@click.option("--clientid", help="the client to trace")
@click.option("--topic", help="the topic (filter) to trace")
@click.option("--duration", type=click.FloatRange(min=0, min_open=True),
              help="seconds it runs (default 600)")  # fmt: skip
@pass_ctl
def trace_start(c: Ctl, /, name: str, clientid: str | None, topic: str | None,
                duration: float | None) -> None:  # fmt: skip
    if (clientid is None) == (topic is None):
        fail("give one of --clientid, --topic")
    kind, what = ("clientid", clientid) if clientid is not None else ("topic", topic)
    body = {"name": name, "type": kind, kind: what,
            **({"duration": duration} if duration is not None else {})}  # fmt: skip
    c.out.done(f"trace {name} of {kind} {what} started", c.call("POST", "/trace", body=body))


@trace.command("stop", help="stop a trace (its file stays)")
@click.argument("name")
@pass_ctl
def trace_stop(c: Ctl, /, name: str) -> None:
    c.out.done(f"trace {name} stopped", c.call("PUT", f"/trace/{segment(name)}/stop"))


@trace.command("delete", help="delete a trace and its file")
@click.argument("name")
@pass_ctl
def trace_delete(c: Ctl, /, name: str) -> None:
    c.call("DELETE", f"/trace/{segment(name)}")
    c.out.done(f"trace {name} deleted")


@trace.command("download", help="a trace's file (JSON lines) on stdout, or into --out FILE")
@click.argument("name")
@click.option("-o", "--out", "into", type=click.Path(dir_okay=False, writable=True),
              help="write it here")  # fmt: skip
@pass_ctl
def trace_download(c: Ctl, /, name: str, into: str | None) -> None:
    text = c.call("GET", f"/trace/{segment(name)}/download") or ""
    if into is None:
        sys.stdout.write(text)
        return
    try:
        with open(into, "w") as f:
            f.write(text)
    except OSError as exc:
        fail(f"--out {into}: {exc.strerror or exc}")
    c.out.done(f"wrote {len(text.encode()):,} bytes to {into}", {"file": into})
