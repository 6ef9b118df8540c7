"""The API's errors: one JSON shape, as EMQX v5's, `{"code": "...", "message": "..."}`.

A handler raises `ApiError` (or a subclass naming its code); the route
wrapper (`services.api.routes`) turns it into that body with its status.
The codes are EMQX's words so a script that matches on them keeps working.
"""

from __future__ import annotations

import json
from typing import Any, Final

from aiohttp import web

BAD_REQUEST: Final = "BAD_REQUEST"
NOT_FOUND: Final = "NOT_FOUND"
UNAUTHORIZED: Final = "BAD_API_KEY_OR_SECRET"  # EMQX's code for a refused API key
ALREADY_EXISTS: Final = "ALREADY_EXISTS"
METHOD_NOT_ALLOWED: Final = "METHOD_NOT_ALLOWED"
SERVICE_UNAVAILABLE: Final = "SERVICE_UNAVAILABLE"  # a backend (Redis, a peer) did not answer
INTERNAL_ERROR: Final = "INTERNAL_ERROR"


class ApiError(Exception):
    """An answer other than success: HTTP `status`, EMQX-style `code`, one-line `message`."""

    status = 400
    code = BAD_REQUEST

    def __init__(self, message: str, *, status: int | None = None, code: str | None = None):
        super().__init__(message)
        self.message = message
        if status is not None:
            self.status = status
        if code is not None:
            self.code = code


class BadRequest(ApiError):
    pass


class NotFound(ApiError):
    status = 404
    code = NOT_FOUND


class Unauthorized(ApiError):
    status = 401
    code = UNAUTHORIZED


class Conflict(ApiError):
    status = 409
    code = ALREADY_EXISTS


class Unavailable(ApiError):
    status = 503
    code = SERVICE_UNAVAILABLE


def json_response(body: Any, status: int = 200) -> web.Response:
    return web.Response(
        body=json.dumps(body, separators=(",", ":")).encode(),
        status=status,
        content_type="application/json",
    )


def error_response(err: ApiError) -> web.Response:
    response = json_response({"code": err.code, "message": err.message}, err.status)
    if err.status == 401:  # as RFC 9110 asks; the realm names what the key opens
        response.headers["WWW-Authenticate"] = 'Basic realm="weir api"'
    return response
