"""/api/v5/subscriptions, /topics, /mqtt/retainer/... and /publish.

Subscriptions, topics and retained messages come from the node's view of
the event log (`services.state.view`): the cluster's, whatever node
answers. A topic's nodes are the nodes of the sessions subscribed to it.
A publish goes through the node's router as a will does (no client, so no
ACL and no hooks of a client): local subscribers get it at once, peers
over the node links, retained in the log when asked. Deleting a retained
message logs its clearing (as an empty retained PUBLISH does) without
routing anything.
"""

from __future__ import annotations

import base64
import binascii
import time
from collections.abc import Iterable
from typing import Any

from aiohttp import web

from services.api.context import Context
from services.api.errors import BadRequest, NotFound, Unavailable
from services.api.paging import Page
from services.api.routes import Param, Route, body_of, page_params, paged
from services.mqtt.errors import TopicNameInvalid
from services.mqtt.packets import Message, Properties
from services.mqtt.topics import validate_topic_name

SUBSCRIPTION: dict[str, Any] = {"type": "object", "properties": {
    "clientid": {"type": "string"}, "topic": {"type": "string"}, "qos": {"type": "integer"},
    "nl": {"type": "integer"}, "rap": {"type": "integer"}, "rh": {"type": "integer"},
    "node": {"type": "string"}, "share_group": {"type": "string", "nullable": True}}}  # fmt: skip
TOPIC: dict[str, Any] = {"type": "object", "properties": {
    "topic": {"type": "string"}, "node": {"type": "string"}}}  # fmt: skip
RETAINED: dict[str, Any] = {"type": "object", "properties": {
    "topic": {"type": "string"}, "qos": {"type": "integer"},
    "payload": {"type": "string", "description": "base64 (in the detail only)"},
    "from_clientid": {"type": "string"}, "publish_at": {"type": "string", "nullable": True},
    "expires_at": {"type": "string", "nullable": True}}}  # fmt: skip
PUBLISH: dict[str, Any] = {"type": "object", "required": ["topic"], "properties": {
    "topic": {"type": "string"}, "payload": {"type": "string"},
    "payload_encoding": {"type": "string", "enum": ["plain", "base64"]},
    "qos": {"type": "integer", "enum": [0, 1, 2]}, "retain": {"type": "boolean"},
    "properties": {"type": "object", "properties": {
        "payload_format_indicator": {"type": "integer"},
        "message_expiry_interval": {"type": "integer"}, "content_type": {"type": "string"},
        "response_topic": {"type": "string"}, "correlation_data": {"type": "string"},
        "user_properties": {"type": "object",
                            "additionalProperties": {"type": "string"}}}}}}  # fmt: skip
PUBLISHED: dict[str, Any] = {"type": "object", "properties": {
    "id": {"type": "string"}, "matched": {"type": "integer"}}}  # fmt: skip
MAX_BATCH = 1000  # messages in one POST /publish/bulk


def iso_ms(ms: int | None) -> str | None:
    if ms is None:
        return None
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ms / 1000)) + f".{ms % 1000:03d}Z"


def share_group(topic_filter: str) -> str | None:
    if topic_filter.startswith("$share/"):
        return topic_filter.split("/", 2)[1]
    return None


class PubSub:
    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self._published = 0

    def _node_of(self, client_id: str) -> str:
        entry = self.ctx.broker.logstate.view.session(client_id)
        return entry.node if entry is not None else self.ctx.node_id

    async def subscriptions(self, request: web.Request) -> Any:
        q = request.query
        view = self.ctx.broker.logstate.view
        rows = []
        for client_id, subs in sorted(view.all_subscriptions().items()):
            if "clientid" in q and client_id != q["clientid"]:
                continue
            node = self._node_of(client_id)
            if "node" in q and node != q["node"]:
                continue
            for topic, o in sorted(subs.items()):
                group = share_group(topic)
                if ("topic" in q and topic != q["topic"]) or (
                    "qos" in q and o.qos != int(q["qos"])) or (
                    "share_group" in q and group != q["share_group"]):  # fmt: skip
                    continue
                rows.append({
                    "clientid": client_id, "topic": topic, "qos": o.qos,
                    "nl": int(o.no_local), "rap": int(o.retain_as_published),
                    "rh": o.retain_handling, "node": node, "share_group": group,
                })  # fmt: skip
        return Page.of(q).answer(rows)

    def _routes(self) -> dict[str, set[str]]:
        """Each subscribed filter and the nodes of its subscribers."""
        view = self.ctx.broker.logstate.view
        found: dict[str, set[str]] = {}
        for client_id, subs in view.all_subscriptions().items():
            node = self._node_of(client_id)
            for topic in subs:
                found.setdefault(topic, set()).add(node)
        return found

    async def topics(self, request: web.Request) -> Any:
        q = request.query
        rows = [{"topic": topic, "node": node}
                for topic, nodes in sorted(self._routes().items()) for node in sorted(nodes)
                if ("topic" not in q or topic == q["topic"]) and (
                    "node" not in q or node == q["node"])]  # fmt: skip
        return Page.of(q).answer(rows)

    async def topic(self, request: web.Request) -> Any:
        topic = request.match_info["topic"]
        nodes = self._routes().get(topic)
        if nodes is None:
            raise NotFound(f"no subscription to {topic}", code="TOPIC_NOT_FOUND")
        return [{"topic": topic, "node": node} for node in sorted(nodes)]

    def _retained(self, entry: Any, payload: bool) -> dict[str, Any]:
        row = {"topic": entry.topic, "qos": entry.qos, "from_clientid": entry.sender,
               "publish_at": None, "expires_at": iso_ms(entry.expires_at_ms)}  # fmt: skip
        if payload:
            row["payload"] = base64.b64encode(entry.payload).decode()
        return row

    async def retained_list(self, request: web.Request) -> Any:
        q = request.query
        found = sorted(self.ctx.broker.logstate.view.retained_topics().items())
        rows = [e for t, e in found if "topic" not in q or q["topic"] in t]
        return Page.of(q).answer(rows, lambda e: self._retained(e, False))

    def _retained_entry(self, request: web.Request) -> Any:
        topic = request.match_info["topic"]
        entry = self.ctx.broker.logstate.view.retained(topic)
        if entry is None:
            raise NotFound(f"no retained message on {topic}")
        return entry

    async def retained_one(self, request: web.Request) -> Any:
        return self._retained(self._retained_entry(request), True)

    async def retained_delete(self, request: web.Request) -> Any:
        entry = self._retained_entry(request)
        if not await self.ctx.broker.dispatch.set_retained(Message(entry.topic, b"", 0, True)):
            raise Unavailable(f"the clearing of {entry.topic} could not be logged; try again")
        return None

    def _message(self, body: Any) -> Message:
        if not isinstance(body, dict):
            raise BadRequest("a message must be a JSON object")
        topic = body.get("topic")
        if not isinstance(topic, str) or not topic:
            raise BadRequest("topic (a string) is required")
        try:
            validate_topic_name(topic)
        except TopicNameInvalid as exc:
            raise BadRequest(str(exc)) from None
        if topic.startswith("$"):
            raise BadRequest(f"topic {topic!r}: $ topics are the broker's")
        qos, retain = body.get("qos", 0), body.get("retain", False)
        if qos not in (0, 1, 2) or not isinstance(retain, bool):
            raise BadRequest("qos must be 0, 1 or 2 and retain true or false")
        raw = body.get("payload", "")
        if not isinstance(raw, str):
            raise BadRequest("payload must be a string (payload_encoding: plain or base64)")
        encoding = body.get("payload_encoding", "plain")
        if encoding == "base64":
            try:
                payload = base64.b64decode(raw, validate=True)
            except binascii.Error:
                raise BadRequest("payload is not base64") from None
        elif encoding == "plain":
            payload = raw.encode()
        else:
            raise BadRequest("payload_encoding must be plain or base64")
        props, expires = self._properties(body.get("properties") or {})
        return Message(topic, payload, qos, retain, props, sender="", expires_at_ms=expires)

    @staticmethod
    def _properties(given: Any) -> tuple[Properties, int | None]:
        if not isinstance(given, dict):
            raise BadRequest("properties must be an object")
        known = {"payload_format_indicator", "message_expiry_interval", "content_type",
                 "response_topic", "correlation_data", "user_properties"}  # fmt: skip
        unknown = set(given) - known
        if unknown:
            raise BadRequest(f"unknown properties: {', '.join(sorted(unknown))}")
        users = given.get("user_properties", {})
        if not isinstance(users, dict) or not all(isinstance(v, str) for v in users.values()):
            raise BadRequest("user_properties must be an object of strings")
        expiry = given.get("message_expiry_interval")
        if expiry is not None and (not isinstance(expiry, int) or expiry < 0):
            raise BadRequest("message_expiry_interval must be a number of seconds")
        correlation = given.get("correlation_data")
        try:
            props = Properties(
                payload_format_indicator=given.get("payload_format_indicator"),
                message_expiry_interval=expiry,
                content_type=given.get("content_type"),
                response_topic=given.get("response_topic"),
                correlation_data=correlation.encode() if isinstance(correlation, str) else None,
                user_property=tuple(users.items()),
            )
        except (TypeError, ValueError) as exc:
            raise BadRequest(f"properties: {exc}") from None
        expires = int(time.time() * 1000) + expiry * 1000 if expiry else None
        return props, expires

    def _send(self, message: Message) -> dict[str, Any]:
        matched = self.ctx.broker.publish_message(message)
        if not matched:  # counted as a client's PUBLISH is (services.broker.dispatch)
            self.ctx.broker.metrics.messages_dropped["no_subscribers"] += 1
        self._published += 1
        return {"id": f"{self.ctx.node_id}-{self._published}", "matched": matched}

    async def publish(self, request: web.Request) -> Any:
        return self._send(self._message(await body_of(request)))

    async def publish_bulk(self, request: web.Request) -> Any:
        try:
            batch = await request.json()
        except ValueError:
            raise BadRequest("the body is not JSON") from None
        if not isinstance(batch, list) or not 0 < len(batch) <= MAX_BATCH:
            raise BadRequest(f"the body must be a list of 1 to {MAX_BATCH} messages")
        messages = [self._message(item) for item in batch]  # all valid, or none sent
        return [self._send(m) for m in messages]


def routes(ctx: Context) -> Iterable[Route]:
    ps = PubSub(ctx)
    topic = Param("topic", "the topic (URL-encoded)", where="path", required=True)
    subs = page_params(
        Param("clientid", "exact client id"), Param("topic", "exact topic filter"),
        Param("qos", "granted QoS", "integer", enum=("0", "1", "2")),
        Param("share_group", "shared subscription group"), Param("node", "the client's node"),
    )  # fmt: skip
    return (
        Route("GET", "/subscriptions", "Subscriptions (cluster-wide)", ps.subscriptions,
              "subscriptions", subs, paged(SUBSCRIPTION)),
        Route("GET", "/topics", "Subscribed topic filters and their nodes", ps.topics, "topics",
              page_params(Param("topic", "exact topic filter"), Param("node", "a node")),
              paged(TOPIC)),
        Route("GET", "/topics/{topic:.+}", "One topic filter's nodes", ps.topic, "topics",
              (topic,), {"type": "array", "items": TOPIC}),
        Route("GET", "/mqtt/retainer/messages", "Retained messages (no payloads)",
              ps.retained_list, "retainer", page_params(Param("topic", "part of the topic")),
              paged(RETAINED)),
        Route("GET", "/mqtt/retainer/message/{topic:.+}", "One retained message (payload in "
              "base64)", ps.retained_one, "retainer", (topic,), RETAINED),
        Route("DELETE", "/mqtt/retainer/message/{topic:.+}", "Delete a retained message",
              ps.retained_delete, "retainer", (topic,), None, status=204),
        Route("POST", "/publish", "Publish a message", ps.publish, "publish", (), PUBLISHED,
              body=PUBLISH),
        Route("POST", "/publish/bulk", "Publish several messages (all valid, or none sent)",
              ps.publish_bulk, "publish", (), {"type": "array", "items": PUBLISHED},
              body={"type": "array", "items": PUBLISH}),
    )  # fmt: skip
