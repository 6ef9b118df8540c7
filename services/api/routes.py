"""One declaration per route, and the aiohttp routes made from them.

Theory of operation. Each endpoint is a `Route`: method, path (aiohttp's
`{name}` segments, which are OpenAPI's too), a summary, its parameters, the
JSON schema of its answer (and of its body, for writes) and the handler.
The same tuple of routes gives the aiohttp routes (`aiohttp_routes`) and
the OpenAPI document (`services.api.openapi`), so the document cannot
drift from what is served; a test compares them.

The wrapper around each handler does what every endpoint shares, in one
place: the API key (`guard`, skipped for `public` routes), the declared
query parameters (an undeclared one, a non-integer where an integer is
declared or a value outside an enum is a 400 naming it), the audit line
of a write, and errors as JSON (`services.api.errors`; anything else is a
500 with one log line, never a traceback to the caller). A handler returns
the JSON body (or a ready `web.StreamResponse`). A request to an /api/v5
path no route declares is a JSON 404, or 405 when only the method is wrong.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal

from aiohttp import web

from services.api.errors import (
    METHOD_NOT_ALLOWED,
    ApiError,
    BadRequest,
    NotFound,
    error_response,
    json_response,
)

log = logging.getLogger("weir.api")
audit = logging.getLogger("weir.api.audit")

PREFIX: Final = "/api/v5"
WRITES: Final = frozenset({"POST", "PUT", "DELETE"})
Schema = dict[str, Any]
Handler = Callable[[web.Request], Awaitable[Any]]
Guard = Callable[[web.Request], Awaitable[str]]  # the caller's key, or Unauthorized


@dataclass(frozen=True, slots=True)
class Param:
    name: str
    help: str = ""
    kind: Literal["string", "integer", "boolean"] = "string"
    where: Literal["query", "path"] = "query"
    required: bool = False
    enum: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Route:
    method: str
    path: str  # under PREFIX; "{name}" segments are path parameters
    summary: str
    handler: Handler
    tag: str
    params: tuple[Param, ...] = ()
    response: Schema | None = None  # the 2xx body's JSON schema; None: no body (204)
    body: Schema | None = None  # the request body's JSON schema, for writes
    status: int = 200
    public: bool = False  # no API key asked (the status check)

    @property
    def full_path(self) -> str:
        """aiohttp's path: `{topic:.+}` (a segment that may hold slashes) kept."""
        return PREFIX + self.path

    @property
    def doc_path(self) -> str:
        """OpenAPI's path: `{topic}`."""
        return re.sub(r"\{([^}:]+):[^}]+\}", r"{\1}", self.full_path)


def page_params(*filters: Param) -> tuple[Param, ...]:
    """The parameters of a paginated list: its filters, then page and limit."""
    return (
        *filters,
        Param("page", "page number, from 1", "integer"),
        Param("limit", "items per page (default 100)", "integer"),
    )


def paged(item: Schema) -> Schema:
    """The JSON schema of a paginated answer of `item`s (services.api.paging)."""
    meta = {
        "type": "object",
        "properties": {
            "page": {"type": "integer"},
            "limit": {"type": "integer"},
            "count": {"type": "integer"},
            "hasnext": {"type": "boolean"},
        },
    }
    return {"type": "object", "properties": {"data": {"type": "array", "items": item},
                                             "meta": meta}}  # fmt: skip


async def body_of(request: web.Request) -> dict[str, Any]:
    """The request's JSON object body, or a 400 saying what is wrong with it."""
    try:
        body = json.loads(await request.read() or b"null")
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BadRequest(f"the body is not JSON: {exc}") from None
    if not isinstance(body, dict):
        raise BadRequest("the body must be a JSON object")
    return body


def _check_query(route: Route, request: web.Request) -> None:
    declared = {p.name: p for p in route.params if p.where == "query"}
    for name in request.query:
        param = declared.get(name)
        if param is None:
            raise BadRequest(f"unknown parameter {name!r} (known: {', '.join(declared) or 'none'})")
        for value in request.query.getall(name):
            if param.kind == "integer" and not re.fullmatch(r"-?\d+", value):
                raise BadRequest(f"{name} must be an integer, not {value!r}")
            if param.kind == "boolean" and value not in ("true", "false"):
                raise BadRequest(f"{name} must be true or false, not {value!r}")
            if param.enum and value not in param.enum:
                raise BadRequest(f"{name} must be one of {', '.join(param.enum)}, not {value!r}")
    for param in route.params:
        if param.required and param.where == "query" and param.name not in request.query:
            raise BadRequest(f"{param.name} is required")
        segment = request.match_info.get(param.name) if param.where == "path" else None
        if param.enum and segment is not None and segment not in param.enum:
            raise BadRequest(f"{param.name} must be one of {', '.join(param.enum)}, "
                             f"not {segment!r}")  # fmt: skip


def _wrap(route: Route, guard: Guard) -> Handler:
    async def handle(request: web.Request) -> web.StreamResponse:
        who = "-"
        try:
            if not route.public:
                who = await guard(request)
            _check_query(route, request)
            result = await route.handler(request)
        except ApiError as err:
            if route.method in WRITES and err.status != 401:
                _audit(request, who, err.status)
            return error_response(err)
        except Exception:
            log.exception("api %s %s failed", request.method, request.path)
            return error_response(ApiError("the node failed to answer; see its log",
                                           status=500, code="INTERNAL_ERROR"))  # fmt: skip
        if route.method in WRITES:
            _audit(request, who, route.status)
        if isinstance(result, web.StreamResponse):
            return result
        if route.response is None:
            return web.Response(status=route.status)
        return json_response(result, route.status)

    return handle


def _audit(request: web.Request, who: str, status: int) -> None:
    """One structured line per write: who (the API key), what, and how it ended."""
    audit.info(
        "api %s %s -> %d by key %s", request.method, request.path_qs, status, who,
        extra={"api_key": who, "method": request.method, "path": request.path,
               "status": status, "remote": request.remote or "", "unlimited": True},
    )  # fmt: skip


def _pattern(route: Route) -> re.Pattern[str]:
    """What paths `route` answers: a `{name}` is one segment, `{name:.+}` any."""
    parts = re.split(r"(\{[^}]+\})", route.full_path)
    return re.compile("".join(
        (".+" if ":" in part else "[^/]+") if part.startswith("{") else re.escape(part)
        for part in parts
    ) + "$")  # fmt: skip


def aiohttp_routes(routes: Sequence[Route], guard: Guard) -> list[web.RouteDef]:
    """The aiohttp routes of `routes`, then the JSON 404/405 for the rest of /api/v5."""
    patterns = [(_pattern(r), r.method) for r in routes]

    async def unknown(request: web.Request) -> web.Response:
        allowed = sorted({m for p, m in patterns if p.match(request.path)})
        if allowed:
            response = error_response(ApiError(
                f"{request.method} is not allowed here (allowed: {', '.join(allowed)})",
                status=405, code=METHOD_NOT_ALLOWED,
            ))  # fmt: skip
            response.headers["Allow"] = ", ".join(allowed)
            return response
        return error_response(NotFound(f"no such endpoint: {request.method} {request.path}"))

    defs = [web.route(r.method, r.full_path, _wrap(r, guard)) for r in routes]
    return [*defs, web.route("*", PREFIX + "/{tail:.*}", unknown)]
