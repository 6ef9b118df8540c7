"""/api/v5/banned: the ban table `weir ban` writes (EMQX's paths and fields).

The node's own ban store (`services.auth.banned`): Redis hash
`weir:banned` shared by the cluster and `weir ban` (a ban added here
reaches every node over the ban channel and disconnects the clients it
covers), or the node's memory on `--backend memory`. EMQX's field `as`
is the kind (clientid, username, peerhost), `until` an RFC 3339 time or
absent (never ends).
"""

from __future__ import annotations

import calendar
import time
from collections.abc import Iterable
from typing import Any

from aiohttp import web

from services.api.context import Context
from services.api.errors import BadRequest, NotFound, Unavailable
from services.api.paging import Page
from services.api.routes import Param, Route, body_of, page_params, paged
from services.auth.banned import KINDS, Ban, BanError, checked

BAN: dict[str, Any] = {"type": "object", "properties": {
    "as": {"type": "string", "enum": list(KINDS)}, "who": {"type": "string"},
    "by": {"type": "string"}, "reason": {"type": "string"},
    "until": {"type": "string", "nullable": True,
              "description": "RFC 3339; null: never"}}}  # fmt: skip
NEW_BAN: dict[str, Any] = {"type": "object", "required": ["as", "who"], "properties": {
    **BAN["properties"], "duration": {"type": "integer", "description": "seconds from now "
                                      "(instead of until)"}}}  # fmt: skip


def iso(t: float | None) -> str | None:
    return None if t is None else time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


def parse_time(text: str) -> float:
    """RFC 3339 in UTC (`2030-01-01T00:00:00Z`) to Unix seconds."""
    for form in ("%Y-%m-%dT%H:%M:%SZ", "%Y-%m-%dT%H:%M:%S+00:00", "%Y-%m-%dT%H:%M:%S.%fZ"):
        try:
            return float(calendar.timegm(time.strptime(text, form)))
        except ValueError:
            continue
    raise BadRequest(f"until must be an RFC 3339 UTC time (2030-01-01T00:00:00Z), not {text!r}")


def shown(ban: Ban) -> dict[str, Any]:
    return {"as": ban.kind, "who": ban.who, "by": ban.by, "reason": ban.reason,
            "until": iso(ban.until)}  # fmt: skip


def routes(ctx: Context) -> Iterable[Route]:
    def store() -> Any:
        admission = ctx.broker.seams.admission
        if admission is None:
            raise Unavailable("this node has no ban table")
        return admission.bans

    async def listing(request: web.Request) -> Any:
        try:
            bans = await store().list()
        except (OSError, TimeoutError) as exc:
            raise Unavailable(f"cannot read the bans: {exc}") from None
        now = time.time()
        rows = sorted((b for b in bans if b.active(now)), key=lambda b: (b.kind, b.who))
        return Page.of(request.query).answer(rows, shown)

    async def add(request: web.Request) -> Any:
        body = await body_of(request)
        kind, who = body.get("as"), body.get("who")
        if not isinstance(kind, str) or not isinstance(who, str):
            raise BadRequest(f"as (one of {', '.join(KINDS)}) and who are required")
        until: float | None = None
        if body.get("until") is not None:
            until = parse_time(str(body["until"]))
        elif body.get("duration") is not None:
            if not isinstance(body["duration"], int) or body["duration"] <= 0:
                raise BadRequest("duration must be a positive number of seconds")
            until = time.time() + body["duration"]
        if until is not None and until <= time.time():
            raise BadRequest("the ban would end before it begins")
        try:
            ban = checked(Ban(kind, who, until, str(body.get("reason", "")),
                              str(body.get("by", "api"))))  # fmt: skip
            await store().add(ban)
        except BanError as exc:
            raise BadRequest(str(exc)) from None
        except (OSError, TimeoutError) as exc:
            raise Unavailable(f"cannot store the ban: {exc}") from None
        return shown(ban)

    async def delete(request: web.Request) -> Any:
        kind, who = request.match_info["as"], request.match_info["who"]
        try:
            gone = await store().delete(kind, who)
        except BanError as exc:
            raise BadRequest(str(exc)) from None
        except (OSError, TimeoutError) as exc:
            raise Unavailable(f"cannot delete the ban: {exc}") from None
        if not gone:
            raise NotFound(f"no ban of {kind} {who}")
        return None

    kind = Param("as", "clientid, username or peerhost", where="path", required=True,
                 enum=KINDS)  # fmt: skip
    who = Param("who", "the banned id, name or address (URL-encoded)", where="path",
                required=True)  # fmt: skip
    return (
        Route("GET", "/banned", "Bans in force", listing, "banned", page_params(), paged(BAN)),
        Route("POST", "/banned", "Ban a client id, user name or address (CIDR)", add, "banned",
              (), BAN, body=NEW_BAN),
        Route("DELETE", "/banned/{as}/{who:.+}", "Lift a ban", delete, "banned", (kind, who),
              None, status=204),
    )  # fmt: skip
