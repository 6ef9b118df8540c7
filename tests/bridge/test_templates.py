"""Templates of a bridge: a kafka_out record's key, value and headers from a
message, a kafka_in message's topic and payload from a record."""

from __future__ import annotations

import base64
import json

import pytest

from services.bridge.templates import Fields, Record, envelope, message_template, record_template
from services.config.bridges import check_record_template, check_template, check_topic_template
from services.mqtt.packets import Message, Properties

PROPS = Properties(user_property=(("dev", "d-1"), ("site", "lyon"), ("dev", "second")))
MESSAGE = Message("tele/a", b"\x00\xffraw", qos=1, retain=True, properties=PROPS, sender="c-9")
FIELDS = Fields(MESSAGE, "alice", 1_700_000_000_123)


@pytest.mark.parametrize(
    ("text", "rendered"),
    [
        ("${clientid}", b"c-9"),
        ("${username}", b"alice"),
        ("${topic}", b"tele/a"),
        ("${payload}", b"\x00\xffraw"),
        ("${qos}", b"1"),
        ("${retain}", b"true"),
        ("${timestamp}", b"1700000000123"),
        ("${user_property.dev}", b"d-1"),  # the first of a repeated property
        ("${user_property.none}", b""),
        ("plain", b"plain"),
        ("", b""),
        ("${clientid}/${topic}:${qos}!", b"c-9/tele/a:1!"),
        ("$clientid {topic} $", b"$clientid {topic} $"),  # only ${...} is a variable
    ],
)
def test_a_template_renders_its_variables(text: str, rendered: bytes) -> None:
    assert check_template(text) == text
    assert message_template(text).render(FIELDS) == rendered
    assert message_template(text).renderer(FIELDS) == rendered  # what a bridge calls


def test_a_payload_template_hands_the_payload_on_as_it_is() -> None:
    assert message_template("${payload}").render(FIELDS) is MESSAGE.payload


def test_no_username_renders_empty() -> None:
    assert message_template("[${username}]").render(Fields(MESSAGE, None, 0)) == b"[]"


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("${nope}", "unknown template variable ${nope}"),
        ("${user_property.}", "unknown template variable ${user_property.}"),
        ("${}", "unknown template variable ${}"),
        ("a ${clientid", "unclosed ${"),
    ],
)
def test_a_bad_template_is_one_line(text: str, error: str) -> None:
    with pytest.raises(ValueError, match=error.replace("$", r"\$").replace("{", r"\{")) as caught:
        check_template(text)
    assert "\n" not in str(caught.value)


def test_the_envelope_is_json_with_the_message_and_its_sender() -> None:
    text = Message("t/1", "héllo".encode(), qos=2, sender="c", properties=PROPS)
    assert json.loads(envelope(Fields(text, "u", 5))) == {
        "topic": "t/1", "payload": "héllo", "payload_encoding": "utf-8", "qos": 2,
        "retain": False, "clientid": "c", "username": "u", "timestamp": 5,
        "user_properties": [["dev", "d-1"], ["site", "lyon"], ["dev", "second"]],
    }  # fmt: skip
    binary = json.loads(envelope(FIELDS))
    assert binary["payload"] == "AP9yYXc=" and binary["payload_encoding"] == "base64"
    assert binary["username"] == "alice" and binary["retain"] is True


@pytest.mark.parametrize(
    ("topic", "payload", "username", "pairs"),
    [
        ("tele/a", b"plain", None, ()),
        ('q"uo\\te/\u00e9t\u00e9', "caf\u00e9 \U0001f600".encode(), "\u00fc\n\t",
         (("k\x00", '"v"'),)),
        ("\u2028/+", b"\xff\xfe", "", (("a", "1"), ("a", "2"), ("", ""))),
        ("t", b"", "u", ()),
    ],
)
def test_the_envelope_is_what_json_dumps_gives_byte_for_byte(
    topic: str, payload: bytes, username: str | None, pairs: tuple[tuple[str, str], ...]
) -> None:
    """The envelope is written out by hand (speed): the same bytes as the
    `json.dumps` it replaced, escapes and key order included."""
    message = Message(topic, payload, qos=1, retain=bool(pairs), sender="c\u00e9-\"1\"",
                      properties=Properties(user_property=pairs))  # fmt: skip
    fields = Fields(message, username, 1_700_000_000_999)
    try:
        text, encoding = payload.decode(), "utf-8"
    except UnicodeDecodeError:
        text, encoding = base64.b64encode(payload).decode(), "base64"
    expected = json.dumps(
        {"topic": topic, "payload": text, "payload_encoding": encoding, "qos": 1,
         "retain": bool(pairs), "clientid": message.sender, "username": username,
         "timestamp": 1_700_000_000_999, "user_properties": [list(p) for p in pairs]},
        separators=(",", ":"),
    ).encode()  # fmt: skip
    assert envelope(fields) == expected


RECORD = Record("cmds", 3, 42, b"dev-7", b"\x01on", 1_700_000_000_456,
                (("trace", b"t-1"), ("via", b"x"), ("trace", b"t-2")))  # fmt: skip


@pytest.mark.parametrize(
    ("text", "rendered"),
    [
        ("devices/${key}/cmd", b"devices/dev-7/cmd"),
        ("${value}", b"\x01on"),
        ("${payload}", b"\x01on"),
        ("${topic}:${partition}:${offset}", b"cmds:3:42"),
        ("${timestamp}", b"1700000000456"),
        ("${header.trace}", b"t-1"),  # the first of a repeated header
        ("${header.none}", b""),
    ],
)
def test_a_record_template_renders_its_variables(text: str, rendered: bytes) -> None:
    assert check_record_template(text) == text
    assert record_template(text).render(RECORD) == rendered


def test_a_record_without_a_key_renders_it_empty() -> None:
    keyless = Record("t", 0, 0, None, b"v", 0)
    assert record_template("k/${key}/x").render(keyless) == b"k//x"
    assert record_template("${value}").render(keyless) is keyless.value


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("${clientid}", "unknown template variable ${clientid}"),  # a message's, not a record's
        ("${user_property.a}", "unknown template variable ${user_property.a}"),
        ("d/+/${key}", "a topic name has no wildcard"),
        ("d/${key}/#", "a topic name has no wildcard"),
        ("$SYS/${key}", "$ topics are the broker's"),
    ],
)
def test_a_bad_topic_template_is_one_line(text: str, error: str) -> None:
    with pytest.raises(ValueError) as caught:
        check_topic_template(text)
    assert error in str(caught.value) and "\n" not in str(caught.value)
