"""The OpenAPI 3 document of the API, made from the route declarations
(`services.api.routes.Route`), served at /api/v5/openapi.json."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from services.api.routes import Route

ERROR_SCHEMA = {
    "type": "object",
    "required": ["code", "message"],
    "properties": {"code": {"type": "string"}, "message": {"type": "string"}},
}


def _parameter(param: Any) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": param.kind}
    if param.enum:
        schema["enum"] = list(param.enum)
    return {
        "name": param.name,
        "in": param.where,
        "required": param.required or param.where == "path",
        "description": param.help,
        "schema": schema,
    }


def _operation(route: Route) -> dict[str, Any]:
    error = {"content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}
    responses: dict[str, Any] = {}
    if route.response is None:
        responses[str(route.status)] = {"description": "done"}
    else:
        responses[str(route.status)] = {
            "description": "OK",
            "content": {"application/json": {"schema": route.response}},
        }
    responses["400"] = {"description": "bad request", **error}
    if not route.public:
        responses["401"] = {"description": "missing, wrong or revoked API key", **error}
    op: dict[str, Any] = {
        "summary": route.summary,
        "tags": [route.tag],
        "operationId": route.method.lower() + re.sub(r"[^A-Za-z0-9]+", "_", route.doc_path),
        "parameters": [_parameter(p) for p in route.params],
        "responses": responses,
    }
    if route.public:
        op["security"] = []
    if route.body is not None:
        op["requestBody"] = {
            "required": True,
            "content": {"application/json": {"schema": route.body}},
        }
    return op


def document(routes: Sequence[Route], version: str) -> dict[str, Any]:
    paths: dict[str, dict[str, Any]] = {}
    for route in routes:
        paths.setdefault(route.doc_path, {})[route.method.lower()] = _operation(route)
    return {
        "openapi": "3.0.3",
        "info": {
            "title": "Weir management API",
            "version": version,
            "description": "EMQX v5-style management API of a Weir node (docs/api.md).",
        },
        "paths": paths,
        "components": {
            "schemas": {"Error": ERROR_SCHEMA},
            "securitySchemes": {"apiKey": {"type": "http", "scheme": "basic"}},
        },
        "security": [{"apiKey": []}],
    }
