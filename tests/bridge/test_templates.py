"""Templates of a bridge's key, value and headers: what each variable renders."""

from __future__ import annotations

import json

import pytest

from services.bridge.templates import Fields, Template, envelope
from services.config.bridges import check_template
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
    assert Template(text).render(FIELDS) == rendered


def test_a_payload_template_hands_the_payload_on_as_it_is() -> None:
    assert Template("${payload}").render(FIELDS) is MESSAGE.payload


def test_no_username_renders_empty() -> None:
    assert Template("[${username}]").render(Fields(MESSAGE, None, 0)) == b"[]"


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
