"""`weir ctl`: the group and what its commands share.

Every command is one or two calls of the management API (docs/api.md), never
Redis: `--url` / `--data-dir` / `--api-key` say where and as whom
(`services.admin.ctl.client`), `--json` prints the API's answer for a
script (`services.admin.ctl.output`). Exit codes: 0 done, 1 the API said no
or could not be reached (one line: its message, or the URL that did not
answer), 2 bad arguments. The commands: `services.admin.ctl.pubsub`
(clients, subscriptions, topics, retained messages, publish) and
`services.admin.ctl.manage` (bans, keys, alarms, nodes); `command` joins them.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import click

from services.admin.ctl.client import Api, BadKey, CtlError, target
from services.admin.ctl.output import Out
from services.cli import CONTEXT, Group, fail
from services.config import SettingsError, load
from services.config.flags import given, settings_flags, some

EXIT_FAILED = 1
F = TypeVar("F", bound=Callable[..., Any])


@dataclass
class Ctl:
    """What the group's options say; the Api is made when a command first calls it."""

    url: str | None
    data_dir: str
    api_key: str | None
    out: Out
    _api: Api | None = field(default=None, init=False)

    @property
    def api(self) -> Api:
        if self._api is None:
            try:
                self._api = Api(target(self.url, self.data_dir, self.api_key))
            except BadKey as exc:
                fail(str(exc))
        assert self._api is not None
        return self._api

    def call(self, method: str, path: str, **kw: Any) -> Any:
        """The API's answer; its refusal or an unreachable node: one line naming
        the command (`weir ctl clients show: no such client: c1 (HTTP 404)`), exit 1."""
        try:
            return self.api.call(method, path, **kw)
        except CtlError as exc:
            where = click.get_current_context().command_path
            print(f"{where}: {exc}", file=sys.stderr)
            raise click.exceptions.Exit(EXIT_FAILED) from None

    def close(self) -> None:
        if self._api is not None:
            self._api.close()


pass_ctl = click.make_pass_decorator(Ctl)


@click.group("ctl", cls=Group, context_settings=CONTEXT,
             help="Manage a running Weir through its HTTP API (docs/api.md).")
@click.option("--url", help="the API's base URL, http://HOST:PORT (default: the weir up "
              "running on the data dir)")  # fmt: skip
@settings_flags(some("data_dir"))
@click.option("--api-key", metavar="KEY:SECRET", help="an API key (default: WEIR_API_KEY, "
              "else the key the local weir up wrote to <data-dir>/api.key)")  # fmt: skip
@click.option("--json", "as_json", is_flag=True, help="print the API's JSON answer")
@click.pass_context
def ctl(ctx: click.Context, /, url: str | None, api_key: str | None, as_json: bool,
        **flags: Any) -> None:  # fmt: skip
    try:
        data_dir = load(given(flags)).data_dir
    except SettingsError as exc:
        fail(str(exc))
    ctx.obj = Ctl(url, data_dir, api_key, Out(as_json))
    ctx.call_on_close(ctx.obj.close)


def paging(function: F) -> F:
    function = click.option("--limit", type=click.IntRange(1, 10_000), help="items per page "
                            "(default 100)")(function)  # fmt: skip
    return click.option("--page", type=click.IntRange(min=1), help="page, from 1")(function)


@ctl.command("status", help="whether the node answers (no API key needed)")
@pass_ctl
def status(c: Ctl, /) -> None:
    c.out.record(c.call("GET", "/status", params={"format": "json"}))
