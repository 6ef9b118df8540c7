"""`weir ctl` on clients, subscriptions, topics, retained messages, and publish."""

from __future__ import annotations

import base64
from typing import Any

import click

from services.admin.ctl.base import Ctl, ctl, paging, pass_ctl
from services.admin.ctl.client import segment
from services.cli import Group, fail

# -- clients ---------------------------------------------------------------------------

CLIENT_COLUMNS = [
    ("clientid", "client id"), ("username", "user"), ("node", "node"),
    ("connected", "connected"), ("proto_ver", "MQTT"), ("ip_address", "address"),
    ("connected_at", "connected at"), ("subscriptions_cnt", "subs"), ("mqueue_len", "queued"),
]  # fmt: skip


@ctl.group("clients", cls=Group, help="list, show and kick clients (cluster-wide)")
def clients() -> None:
    pass


@clients.command("list", help="clients, filtered")
@click.option("--clientid", multiple=True, help="exact client id (repeat for several)")
@click.option("--like", help="part of the client id")
@click.option("--username", help="exact user name")
@click.option("--like-username", help="part of the user name")
@click.option("--ip", help="peer address (clients of the answering node)")
@click.option("--proto-ver", type=click.Choice(["3", "4", "5"]), help="MQTT protocol level")
@click.option("--connected/--disconnected", default=None, help="connected ones, or not")
@click.option("--node", help="the node that holds them")
@paging
@pass_ctl
def clients_list(c: Ctl, /, clientid: tuple[str, ...], like: str | None, username: str | None,
                 like_username: str | None, ip: str | None, proto_ver: str | None,
                 connected: bool | None, node: str | None, page: int | None,
                 limit: int | None) -> None:  # fmt: skip
    state = None if connected is None else ("connected" if connected else "disconnected")
    params = {"clientid": list(clientid), "like_clientid": like, "username": username,
              "like_username": like_username, "ip_address": ip, "proto_ver": proto_ver,
              "conn_state": state, "node": node, "page": page, "limit": limit}  # fmt: skip
    c.out.rows(c.call("GET", "/clients", params=params), CLIENT_COLUMNS, "clients")


@clients.command("show", help="one client's detail")
@click.argument("clientid")
@pass_ctl
def clients_show(c: Ctl, /, clientid: str) -> None:
    doc = c.call("GET", f"/clients/{segment(clientid)}")
    if not c.out.as_json:
        doc["subscriptions"] = [f"{s['topic']} (QoS {s['qos']})" for s in doc["subscriptions"]]
    c.out.record(doc)


@clients.command("kick", help="disconnect a client (5.0: DISCONNECT 0x98)")
@click.argument("clientid")
@pass_ctl
def clients_kick(c: Ctl, /, clientid: str) -> None:
    c.call("DELETE", f"/clients/{segment(clientid)}")
    c.out.done(f"kicked {clientid}")


# -- subscriptions, topics -------------------------------------------------------------


@ctl.command("subscriptions", help="subscriptions (cluster-wide), filtered")
@click.option("--clientid", help="exact client id")
@click.option("--topic", help="exact topic filter")
@click.option("--qos", type=click.Choice(["0", "1", "2"]), help="granted QoS")
@click.option("--share-group", help="shared subscription group")
@click.option("--node", help="the client's node")
@paging
@pass_ctl
def subscriptions(c: Ctl, /, clientid: str | None, topic: str | None, qos: str | None,
                  share_group: str | None, node: str | None, page: int | None,
                  limit: int | None) -> None:  # fmt: skip
    params = {"clientid": clientid, "topic": topic, "qos": qos, "share_group": share_group,
              "node": node, "page": page, "limit": limit}  # fmt: skip
    columns = [("clientid", "client id"), ("topic", "filter"), ("qos", "QoS"),
               ("share_group", "group"), ("node", "node"), ("nl", "nl"), ("rap", "rap"),
               ("rh", "rh")]  # fmt: skip
    c.out.rows(c.call("GET", "/subscriptions", params=params), columns, "subscriptions")


@ctl.group("topics", cls=Group, help="subscribed topic filters and their nodes")
def topics() -> None:
    pass


@topics.command("list", help="topic filters and the nodes of their subscribers")
@click.option("--topic", help="exact topic filter")
@click.option("--node", help="a node")
@paging
@pass_ctl
def topics_list(c: Ctl, /, topic: str | None, node: str | None, page: int | None,
                limit: int | None) -> None:  # fmt: skip
    params = {"topic": topic, "node": node, "page": page, "limit": limit}
    c.out.rows(c.call("GET", "/topics", params=params), TOPIC_COLUMNS, "topics")


TOPIC_COLUMNS = [("topic", "filter"), ("node", "node")]


@topics.command("show", help="the nodes of one topic filter")
@click.argument("topic")
@pass_ctl
def topics_show(c: Ctl, /, topic: str) -> None:
    c.out.rows(c.call("GET", f"/topics/{segment(topic)}"), TOPIC_COLUMNS, "routes")


# -- retained messages, publish ---------------------------------------------------------


@ctl.group("retained", cls=Group, help="list, show and delete retained messages")
def retained() -> None:
    pass


@retained.command("list", help="retained messages (no payloads)")
@click.option("--topic", help="part of the topic")
@paging
@pass_ctl
def retained_list(c: Ctl, /, topic: str | None, page: int | None, limit: int | None) -> None:
    columns = [("topic", "topic"), ("qos", "QoS"), ("from_clientid", "from"),
               ("publish_at", "published at"), ("expires_at", "expires at")]  # fmt: skip
    params = {"topic": topic, "page": page, "limit": limit}
    c.out.rows(c.call("GET", "/mqtt/retainer/messages", params=params), columns, "retained")


@retained.command("show", help="one retained message, its payload as text when it is UTF-8")
@click.argument("topic")
@pass_ctl
def retained_show(c: Ctl, /, topic: str) -> None:
    doc = c.call("GET", f"/mqtt/retainer/message/{segment(topic)}")
    if not c.out.as_json and isinstance(doc.get("payload"), str):
        raw = base64.b64decode(doc["payload"])
        try:
            doc["payload"] = raw.decode()
        except UnicodeDecodeError:
            doc["payload"] = f"{len(raw)} bytes, base64 {doc['payload']}"
    c.out.record(doc)


@retained.command("delete", help="delete a retained message")
@click.argument("topic")
@pass_ctl
def retained_delete(c: Ctl, /, topic: str) -> None:
    c.call("DELETE", f"/mqtt/retainer/message/{segment(topic)}")
    c.out.done(f"deleted the retained message of {topic}")


def _user_property(text: str) -> tuple[str, str]:
    name, sep, value = text.partition("=")
    if not sep or not name:
        fail(f"--user-property {text!r}: expected NAME=VALUE")
    return name, value


@ctl.command("publish", help="publish a message (routed as a will is: no client)")
@click.argument("topic")
@click.argument("payload", default="")
@click.option("-q", "--qos", type=click.IntRange(0, 2), default=0, show_default=True)
@click.option("-r", "--retain", is_flag=True, help="retain it")
@click.option("--base64", "is_base64", is_flag=True, help="PAYLOAD is base64")
@click.option("--content-type")
@click.option("--expiry", type=click.IntRange(min=0), help="message expiry interval [s]")
@click.option("--response-topic")
@click.option("--correlation-data")
@click.option("--user-property", multiple=True, metavar="NAME=VALUE")
@pass_ctl
def publish(c: Ctl, /, topic: str, payload: str, qos: int, retain: bool, is_base64: bool,
            content_type: str | None, expiry: int | None, response_topic: str | None,
            correlation_data: str | None, user_property: tuple[str, ...]) -> None:  # fmt: skip
    props: dict[str, Any] = {"content_type": content_type, "message_expiry_interval": expiry,
                             "response_topic": response_topic,
                             "correlation_data": correlation_data}  # fmt: skip
    props = {k: v for k, v in props.items() if v is not None}
    if user_property:
        props["user_properties"] = dict(_user_property(p) for p in user_property)
    body: dict[str, Any] = {"topic": topic, "payload": payload, "qos": qos, "retain": retain,
                            "payload_encoding": "base64" if is_base64 else "plain"}  # fmt: skip
    if props:
        body["properties"] = props
    answer = c.call("POST", "/publish", body=body)
    matched = answer.get("matched", 0) if isinstance(answer, dict) else 0
    c.out.done(f"published to {topic}: {matched} subscription(s) reached", answer)

