"""/api/v5/clients: list (cluster-wide, filtered), one client's detail, kick.

Theory of operation. Every node folds the whole event log into its view
(`services.state.view`): it knows every session of the cluster, online or
offline, the node that holds it, its protocol, user name and expiry. The
list comes from there, so it is cluster-wide whatever node answers and
costs no network call; a client on this node adds what only its
connection knows (address, keep alive, connected at, inflight, queue). A
client on another node shows the log's fields; its detail and its kick go
to that node (`Context.forward`), which answers with its own.

Kick is EMQX's: the client gets DISCONNECT 0x98 (administrative action;
3.1.1 clients are just closed) and its will goes out as on any server
disconnect. An offline persistent session is ended (its expiry brought
forward to now, logged as its expiry), as EMQX's kick cleans the session.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from aiohttp import web

from services.api.context import Context
from services.api.errors import ApiError, NotFound
from services.api.paging import Page
from services.api.routes import Param, Route, page_params, paged
from services.auth.api import ClientInfo
from services.broker.ports import ConnectionPort, now_ms
from services.hooks.api import Hooks
from services.mqtt.packets import ReasonCode
from services.state.entries import SessionEntry

CONN_STATES = ("connected", "disconnected")

CLIENT: dict[str, Any] = {
    "type": "object",
    "properties": {
        "clientid": {"type": "string"},
        "username": {"type": "string", "nullable": True},
        "node": {"type": "string"},
        "connected": {"type": "boolean"},
        "proto_name": {"type": "string"},
        "proto_ver": {"type": "integer"},
        "clean_start": {"type": "boolean"},
        "expiry_interval": {"type": "integer"},
        "ip_address": {"type": "string", "nullable": True},
        "port": {"type": "integer", "nullable": True},
        "keepalive": {"type": "integer", "nullable": True},
        "connected_at": {"type": "string", "nullable": True},
        "disconnected_at": {"type": "string", "nullable": True},
        "subscriptions_cnt": {"type": "integer"},
        "inflight_cnt": {"type": "integer", "nullable": True},
        "mqueue_len": {"type": "integer", "nullable": True},
        "listener": {"type": "string", "nullable": True},
    },
}
DETAIL: dict[str, Any] = {
    "type": "object",
    "properties": {
        **CLIENT["properties"],
        "subscriptions": {"type": "array", "items": {"type": "object"}},
        "mqueue_dropped": {"type": "integer", "nullable": True},
        "send_quota": {"type": "integer", "nullable": True},
        "inbound_inflight": {"type": "integer", "nullable": True},
    },
}


def iso_ms(ms: int | None) -> str | None:
    if ms is None:
        return None
    import time

    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ms / 1000)) + f".{ms % 1000:03d}Z"


def _split_peer(peer: str) -> tuple[str | None, int | None]:
    host, sep, port = peer.rpartition(":")
    if not sep or not port.isdigit():
        return (peer or None), None
    return host.strip("[]"), int(port)


HOOK_PRIORITY = 1 << 30  # before any plugin's callback: a plugin's STOP cannot hide a connect


class ConnectedAt:
    """When each client connected here (EMQX's connected_at), from the
    client.connected and client.disconnected hook points: a connection
    taken over ends after its successor connected, so an end removes the
    time only if it is its own connection's (the same ClientInfo object)."""

    def __init__(self, hooks: Hooks) -> None:
        self._at: dict[str, tuple[ClientInfo | None, int]] = {}
        hooks.add("client.connected", self._connected, HOOK_PRIORITY)
        hooks.add("client.disconnected", self._disconnected, HOOK_PRIORITY)

    def _connected(self, client_id: str, info: ClientInfo | None) -> None:
        self._at[client_id] = (info, now_ms())

    def _disconnected(self, client_id: str | None, info: ClientInfo | None) -> None:
        held = self._at.get(client_id or "")
        if held is not None and held[0] is info:
            del self._at[client_id or ""]

    def get(self, client_id: str) -> int | None:
        held = self._at.get(client_id)
        return held[1] if held is not None else None


class Clients:
    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.connected_at = ConnectedAt(ctx.broker.seams.hooks)

    def _conn(self, client_id: str) -> ConnectionPort | None:
        session = self.ctx.broker.sessions.get(client_id)
        conn = session.conn if session is not None else None
        return conn if conn is not None and not conn.closed else None

    def row(self, client_id: str, entry: SessionEntry | None) -> dict[str, Any]:
        """One client as the list shows it: the log's fields, and the
        connection's when the client is connected here."""
        broker = self.ctx.broker
        session = broker.sessions.get(client_id)
        conn = self._conn(client_id)
        row: dict[str, Any] = {
            "clientid": client_id,
            "username": entry.username if entry is not None else None,
            "node": entry.node if entry is not None else self.ctx.node_id,
            "connected": entry.online if entry is not None else conn is not None,
            "proto_name": "MQTT",
            "proto_ver": entry.protocol if entry is not None else 0,
            "clean_start": entry.clean_start if entry is not None else True,
            "expiry_interval": entry.expiry_s if entry is not None else 0,
            "ip_address": None, "port": None, "keepalive": None, "connected_at": None,
            "disconnected_at": iso_ms(entry.offline_since_ms) if entry is not None else None,
            "subscriptions_cnt": len(session.subs) if session is not None else 0,
            "inflight_cnt": None, "mqueue_len": None, "listener": None,
        }  # fmt: skip
        if entry is not None and entry.node != self.ctx.node_id:
            row["subscriptions_cnt"] = len(broker.logstate.view.subscriptions(client_id))
        if conn is not None:
            info = conn.client
            if info is not None:
                row["ip_address"], row["port"] = _split_peer(info.peer)
                row["username"] = info.username
                row["proto_ver"] = info.protocol_level
                row["listener"] = info.listener
            channel = conn.channel
            row["keepalive"] = channel.keep_alive
            row["connected_at"] = iso_ms(self.connected_at.get(client_id))
            row["inflight_cnt"] = channel.client_receive_maximum - channel.send_quota
            row["mqueue_len"] = session.backlog if session is not None else 0
            row["node"], row["connected"] = self.ctx.node_id, True
        return row

    def _matching(self, query: Any) -> tuple[list[str], dict[str, SessionEntry | None]]:
        """The ids of every client the filters keep, sorted (stable pages), and
        their entries. Each filter is one pass over the ids the ones before it
        kept, the cheap ones (the id, the log's fields) first.

        Lists of ids, not of (id, entry) pairs: strings are not tracked by the
        cyclic garbage collector, while 50,000 pairs made per request were, and
        lived long enough to be promoted; every few requests that set off a full
        collection over the whole node (hundreds of ms with 50,000 clients held)."""
        entries: dict[str, SessionEntry | None] = dict(self.ctx.broker.logstate.view.sessions())
        for client_id in self.ctx.broker.sessions:
            entries.setdefault(client_id, None)  # opened here, its event not folded in yet
        here = self.ctx.node_id
        ids = list(entries)
        if "clientid" in query:
            wanted = set(query.getall("clientid"))
            ids = [c for c in ids if c in wanted]
        if "like_clientid" in query:
            part = query["like_clientid"]
            ids = [c for c in ids if part in c]
        if "node" in query:
            node = query["node"]
            ids = [c for c in ids if _node_of(entries[c], here) == node]
        if "clean_start" in query:
            clean = query["clean_start"] == "true"
            ids = [c for c in ids if _clean_start(entries[c]) == clean]
        checks: list[Callable[[str, SessionEntry | None], bool]] = []
        if "username" in query:
            user = query["username"]
            checks.append(lambda c, e: self._user(c, e) == user)
        if "like_username" in query:
            upart = query["like_username"]
            checks.append(lambda c, e: upart in (self._user(c, e) or ""))
        if "conn_state" in query:
            online = query["conn_state"] == "connected"
            checks.append(lambda c, e: self._online(c, e) == online)
        if "proto_ver" in query:
            ver = int(query["proto_ver"])
            checks.append(lambda c, e: self._proto(c, e) == ver)
        if "ip_address" in query:  # only connections here know their address
            ip = query["ip_address"]
            checks.append(lambda c, e: self._ip(c) == ip)
        for check in checks:
            ids = [c for c in ids if check(c, entries[c])]
        ids.sort()
        return ids, entries

    def _user(self, client_id: str, entry: SessionEntry | None) -> str | None:
        conn = self._conn(client_id)
        if conn is not None and conn.client is not None:
            return conn.client.username
        return entry.username if entry is not None else None

    def _online(self, client_id: str, entry: SessionEntry | None) -> bool:
        if entry is not None and entry.node != self.ctx.node_id:
            return entry.online
        return self._conn(client_id) is not None

    def _proto(self, client_id: str, entry: SessionEntry | None) -> int:
        conn = self._conn(client_id)
        if conn is not None and conn.client is not None:
            return conn.client.protocol_level
        return entry.protocol if entry is not None else 0

    def _ip(self, client_id: str) -> str | None:
        conn = self._conn(client_id)
        if conn is None or conn.client is None:
            return None
        return _split_peer(conn.client.peer)[0]

    async def list(self, request: web.Request) -> Any:
        page = Page.of(request.query)
        ids, entries = self._matching(request.query)
        return page.answer(ids, lambda client_id: self.row(client_id, entries[client_id]))

    def _elsewhere(self, client_id: str) -> str | None:
        """The node holding `client_id` when it is not this one."""
        if self._conn(client_id) is not None or client_id in self.ctx.broker.sessions:
            return None
        entry = self.ctx.broker.logstate.view.session(client_id)
        if entry is None:
            raise NotFound(f"no such client: {client_id}", code="CLIENTID_NOT_FOUND")
        return entry.node if entry.node != self.ctx.node_id else None

    async def _forwarded(self, node: str, request: web.Request) -> Any:
        if self.ctx.forward is None:
            raise NotFound(f"client {request.match_info['clientid']} is on node {node}, "
                           "which this node cannot reach", code="CLIENTID_NOT_FOUND")  # fmt: skip
        status, body = await self.ctx.forward(node, request)
        if status >= 400:
            raise ApiError(body.get("message", f"node {node} answered {status}"),
                           status=status, code=body.get("code"))  # fmt: skip
        return body

    async def detail(self, request: web.Request) -> Any:
        client_id = request.match_info["clientid"]
        node = self._elsewhere(client_id)
        if node is not None:
            return await self._forwarded(node, request)
        broker = self.ctx.broker
        entry = broker.logstate.view.session(client_id)
        row = self.row(client_id, entry)
        session = broker.sessions.get(client_id)
        subs = session.subs if session is not None else {}
        row["subscriptions"] = [
            {"topic": topic, "qos": o.qos, "nl": int(o.no_local), "rap": int(o.retain_as_published)}
            for topic, o in sorted(subs.items())
        ]
        row["mqueue_dropped"] = await broker.queue.drops(client_id)
        conn = self._conn(client_id)
        row["send_quota"] = conn.channel.send_quota if conn is not None else None
        row["inbound_inflight"] = conn.channel.inbound_inflight if conn is not None else None
        return row

    async def kick(self, request: web.Request) -> Any:
        client_id = request.match_info["clientid"]
        node = self._elsewhere(client_id)
        if node is not None:
            return await self._forwarded(node, request)
        conn = self._conn(client_id)
        if conn is not None:
            conn.carry_out(conn.channel.server_disconnect(ReasonCode.ADMINISTRATIVE_ACTION))
            conn.close()
            return None
        session = self.ctx.broker.sessions.get(client_id)
        if session is None or session.conn is not None:  # gone, or its connection ending
            raise NotFound(f"client {client_id} is not connected", code="CLIENTID_NOT_FOUND")
        # An offline persistent session (EMQX's kick cleans it too): its expiry
        # comes now, through the one path that ends offline sessions (logged once).
        self.ctx.broker.expiries.later(session, 0.0, session.epoch)
        return None


def routes(ctx: Context) -> Iterable[Route]:
    clients = Clients(ctx)
    filters = (
        Param("clientid", "exact client id (repeat for several)"),
        Param("like_clientid", "part of the client id"),
        Param("username", "exact user name"),
        Param("like_username", "part of the user name"),
        Param("ip_address", "peer address (clients connected to the answering node)"),
        Param("proto_ver", "MQTT protocol level: 3, 4 or 5", "integer"),
        Param("conn_state", "connected or not", enum=CONN_STATES),
        Param("clean_start", "the Clean Start flag of its last CONNECT", "boolean"),
        Param("node", "the node that holds it"),
    )
    clientid = Param("clientid", "the client id", where="path", required=True)
    return (
        Route("GET", "/clients", "List clients (cluster-wide)", clients.list, "clients",
              page_params(*filters), paged(CLIENT)),
        Route("GET", "/clients/{clientid:.+}", "One client's detail", clients.detail, "clients",
              (clientid,), DETAIL),
        Route("DELETE", "/clients/{clientid:.+}", "Kick a client (DISCONNECT 0x98) or end its "
              "offline session", clients.kick, "clients", (clientid,), None, status=204),
    )  # fmt: skip


def _node_of(entry: SessionEntry | None, here: str) -> str:
    return entry.node if entry is not None else here  # not in the log yet: opened here


def _clean_start(entry: SessionEntry | None) -> bool:
    return entry.clean_start if entry is not None else True
