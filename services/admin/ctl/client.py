"""Where `weir ctl` finds the API, with which key, and one call to it.

The API: `--url`, else the `weir up` running on the data dir (`--data-dir`,
WEIR_DATA_DIR, default ./data), from the `endpoints.json` it writes there
(`services.embedded.endpoints`). The supervisor of `weir up --nodes N` has
no HTTP port of its own; its nodes write theirs in their own data dirs
(`<data-dir>/nodes/<id>/`), and the first live one answers (any node
answers for the cluster). The key: `--api-key KEY:SECRET`, else
WEIR_API_KEY, else the key that node wrote for local tools beside its
endpoints (`services.embedded.localkey`, mode 0600).

Every failure is a `CtlError`, one line for the user: the node unreachable
(naming the URL), the API's own message for a 4xx/5xx (its JSON `message`,
as for a bad key or an unknown client), no running node found.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final
from urllib.parse import quote

import httpx

from services.embedded import endpoints, localkey
from services.machine.pidfiles import nodes_dir

PREFIX: Final = "/api/v5"
TIMEOUT_S: Final = 10.0  # a cluster-wide answer may ask a peer (5 s) first
ENV_KEY: Final = "WEIR_API_KEY"
WILDCARD_HOSTS: Final = ("", "0.0.0.0", "::")


class CtlError(Exception):
    """Something the user is told in one line (exit 1)."""


class BadKey(ValueError):
    """--api-key / WEIR_API_KEY is not KEY:SECRET (a usage error, exit 2)."""


@dataclass(frozen=True, slots=True)
class Target:
    url: str  # http://host:port, no trailing slash
    key: tuple[str, str] | None  # None: only public routes answer


def parse_key(text: str, where: str) -> tuple[str, str]:
    key, sep, secret = text.partition(":")
    if not (sep and key and secret):
        raise BadKey(f"{where} must be KEY:SECRET")
    return key, secret


def http_url(address: str) -> str:
    """The base URL of an endpoints `scheme://host:port` (https with --http-certfile;
    no scheme: http); a wildcard bind is reached on loopback."""
    scheme, sep, rest = address.partition("://")
    if not sep:
        scheme, rest = "http", address
    host, _, port = rest.rpartition(":")
    if host in WILDCARD_HOSTS:
        host = "127.0.0.1"
    elif ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"{scheme}://{host}:{port}"


def _running_api(data_dir: str) -> tuple[endpoints.Endpoints, Path]:
    """The endpoints of a live node with an HTTP port on `data_dir` (the
    supervisor's own first, then its nodes'), and that node's data dir."""
    try:
        top = endpoints.find(data_dir, "start one with `weir up`, or give --url")
    except endpoints.EndpointsError as exc:
        raise CtlError(str(exc)) from None
    if top.http is not None:
        return top, Path(data_dir)
    root = nodes_dir(data_dir)
    for child in sorted(p for p in root.iterdir() if p.is_dir()) if root.is_dir() else []:
        try:
            found = endpoints.find(child)
        except endpoints.EndpointsError:
            continue
        if found.http is not None:
            return found, child
    raise CtlError(
        f"the weir up on data dir {Path(data_dir).resolve()} has no HTTP port running "
        "(--http-port off?); give --url"
    )


def target(url: str | None, data_dir: str, api_key: str | None) -> Target:
    """Where and with what key (BadKey for a malformed key, CtlError if no API is found)."""
    key = parse_key(api_key, "--api-key") if api_key else None
    if key is None and os.environ.get(ENV_KEY):
        key = parse_key(os.environ[ENV_KEY], ENV_KEY)
    if url is not None:
        return Target(url.rstrip("/"), key)
    found, node_dir = _running_api(data_dir)
    assert found.http is not None
    return Target(http_url(found.http), key or localkey.read(node_dir))


def segment(value: str) -> str:
    """A path segment: `/` and all encoded (client ids and topics may hold them)."""
    return quote(value, safe="")


class Api:
    """The API at `target`, one HTTP request per call (a command makes one or two)."""

    def __init__(self, target: Target) -> None:
        self.target = target
        self._http = httpx.Client(base_url=target.url + PREFIX, auth=target.key,
                                  timeout=TIMEOUT_S)  # fmt: skip

    def call(self, method: str, path: str, *, params: dict[str, Any] | None = None,
             body: Any = None) -> Any:  # fmt: skip
        """The answer's JSON (None for a 204, the text of a text answer), or CtlError."""
        query = {k: v for k, v in (params or {}).items() if v is not None and v != ()}
        try:
            answer = self._http.request(method, path, params=query, json=body)
        except httpx.TransportError as exc:
            raise CtlError(f"cannot reach the API at {self.target.url}: {_why(exc)}") from None
        if answer.status_code >= 400:
            raise CtlError(_message(answer))
        if answer.status_code == 204 or not answer.content:
            return None
        if answer.headers.get("content-type", "").startswith("application/json"):
            return answer.json()
        return answer.text

    def close(self) -> None:
        self._http.close()


def _why(exc: httpx.TransportError) -> str:
    text = str(exc) or type(exc).__name__
    return " ".join(text.split())


def _message(answer: httpx.Response) -> str:
    """The API's one-line error (EMQX's {"code", "message"}), else the status line."""
    try:
        doc = answer.json()
        message = str(doc["message"])
    except (ValueError, KeyError, TypeError):
        message = answer.reason_phrase or "error"
    if answer.status_code == 401 and "key" not in message.lower():
        message += " (an API key: --api-key KEY:SECRET or WEIR_API_KEY)"
    return f"{' '.join(message.split())} (HTTP {answer.status_code})"
