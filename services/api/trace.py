"""/api/v5/trace: per-client and per-topic packet traces (EMQX's trace API).

The traces are the node's (`services.metrics.trace.Tracer`, files under
`<data-dir>/trace`). A trace runs on the node the request reaches: a client
trace sees that client while it is connected here, a topic trace the
PUBLISHes this node reads and writes. (EMQX starts a trace on every node;
here, ask each node, e.g. `weir ctl --url` per node.)

- `POST /trace {"name", "type": "clientid"|"topic", "clientid"|"topic",
  "duration"?, "end_at"?, "max_bytes"?, "payload_bytes"?}`: start one. It
  ends by itself at `end_at` (seconds since the epoch, EMQX's field) or
  after `duration` seconds (default 600), or when its file reaches
  `max_bytes`. A bad request is a 400 naming what is wrong, a name in use a
  409.
- `GET /trace`: every trace kept, running or stopped.
- `PUT /trace/{name}/stop`, `DELETE /trace/{name}` (the file too).
- `GET /trace/{name}/log?position=&bytes=`: a part of the file (EMQX's
  shape: `{"items": text, "meta": {"position": next, "bytes": n}}`).
- `GET /trace/{name}/download`: the whole file (JSON lines).
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

from aiohttp import web

from services.api.context import Context
from services.api.errors import BadRequest, Conflict, NotFound
from services.api.routes import Param, Route, body_of
from services.metrics.trace import DEFAULT_DURATION_S, READ_MAX, TraceError, TraceInfo

TRACE: dict[str, Any] = {"type": "object", "properties": {
    "name": {"type": "string"}, "type": {"type": "string", "enum": ["clientid", "topic"]},
    "clientid": {"type": "string"}, "topic": {"type": "string"},
    "status": {"type": "string", "enum": ["running", "stopped"]},
    "start_at": {"type": "number"}, "end_at": {"type": "number"},
    "stopped_by": {"type": "string", "nullable": True}, "log_size": {"type": "integer"},
    "node": {"type": "string"}}}  # fmt: skip
START: dict[str, Any] = {"type": "object", "required": ["name", "type"], "properties": {
    "name": {"type": "string"}, "type": {"type": "string", "enum": ["clientid", "topic"]},
    "clientid": {"type": "string"}, "topic": {"type": "string"},
    "duration": {"type": "number"}, "end_at": {"type": "number"},
    "max_bytes": {"type": "integer"}, "payload_bytes": {"type": "integer"}}}  # fmt: skip
LOG: dict[str, Any] = {"type": "object", "properties": {
    "items": {"type": "string"}, "meta": {"type": "object", "properties": {
        "position": {"type": "integer"}, "bytes": {"type": "integer"}}}}}  # fmt: skip


def _number(body: dict[str, Any], name: str) -> float | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise BadRequest(f"{name} must be a number, not {value!r}")
    return float(value)


class Traces:
    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx

    @property
    def tracer(self) -> Any:
        return self.ctx.broker.tracer

    def _shown(self, info: TraceInfo) -> dict[str, Any]:
        return {"name": info.name, "type": info.kind, info.kind: info.value,
                "status": info.status, "start_at": info.started_at, "end_at": info.ends_at,
                "stopped_by": info.stopped_by, "log_size": info.bytes,
                "node": self.ctx.node_id}  # fmt: skip

    def _get(self, name: str) -> TraceInfo:
        try:
            info: TraceInfo = self.tracer.get(name)
        except TraceError as exc:
            raise NotFound(str(exc)) from None
        return info

    async def list(self, request: web.Request) -> Any:
        return [self._shown(info) for info in self.tracer.list()]

    async def start(self, request: web.Request) -> Any:
        body = await body_of(request)
        name, kind = body.get("name"), body.get("type")
        if not isinstance(name, str) or kind not in ("clientid", "topic"):
            raise BadRequest('a trace needs "name" and "type" ("clientid" or "topic")')
        value = body.get(kind)
        if not isinstance(value, str):
            raise BadRequest(f'a {kind} trace needs "{kind}" (a string)')
        duration, end_at = _number(body, "duration"), _number(body, "end_at")
        if duration is None:
            duration = DEFAULT_DURATION_S if end_at is None else end_at - time.time()
        options = {k: body[k] for k in ("max_bytes", "payload_bytes") if k in body}
        for key, given in options.items():
            if isinstance(given, bool) or not isinstance(given, int):
                raise BadRequest(f"{key} must be an integer, not {given!r}")
        if name in {info.name for info in self.tracer.list()}:
            raise Conflict(f"trace {name!r} exists (delete it first)")
        try:
            info = self.tracer.start(name, kind, value, duration, **options)
        except TraceError as exc:
            raise BadRequest(str(exc)) from None
        return self._shown(info)

    async def stop(self, request: web.Request) -> Any:
        name = request.match_info["name"]
        self._get(name)
        return self._shown(self.tracer.stop(name))

    async def delete(self, request: web.Request) -> Any:
        name = request.match_info["name"]
        self._get(name)
        self.tracer.delete(name)
        return None

    async def log(self, request: web.Request) -> Any:
        name = request.match_info["name"]
        self._get(name)
        position = int(request.query.get("position", "0"))
        size = int(request.query.get("bytes", str(READ_MAX)))
        if position < 0 or size <= 0:
            raise BadRequest("position must be >= 0 and bytes > 0")
        data = self.tracer.read(name, position, size)
        text = data.decode("utf-8", errors="replace")
        return {"items": text, "meta": {"position": position + len(data), "bytes": len(data)}}

    async def download(self, request: web.Request) -> Any:
        name = request.match_info["name"]
        self._get(name)
        response = web.FileResponse(self.tracer.path(name))
        response.headers["Content-Type"] = "application/x-ndjson"
        response.headers["Content-Disposition"] = f'attachment; filename="{name}.log"'
        return response


def routes(ctx: Context) -> Iterable[Route]:
    traces = Traces(ctx)
    name = Param("name", "the trace's name", where="path", required=True)
    log_params = (name, Param("position", "byte offset to read from", "integer"),
                  Param("bytes", f"bytes to read (at most {READ_MAX})", "integer"))  # fmt: skip
    return (
        Route("GET", "/trace", "Packet traces of this node, running or stopped", traces.list,
              "trace", (), {"type": "array", "items": TRACE}),
        Route("POST", "/trace", "Start a client or topic trace on this node", traces.start,
              "trace", (), TRACE, body=START),
        Route("PUT", "/trace/{name}/stop", "Stop a running trace (its file stays)",
              traces.stop, "trace", (name,), TRACE),
        Route("DELETE", "/trace/{name}", "Delete a trace and its file", traces.delete,
              "trace", (name,), None, status=204),
        Route("GET", "/trace/{name}/log", "A part of a trace's file", traces.log, "trace",
              log_params, LOG),
        Route("GET", "/trace/{name}/download", "A trace's whole file (JSON lines)",
              traces.download, "trace", (name,), {"type": "string"}),
    )  # fmt: skip
