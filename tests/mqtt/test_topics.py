"""Topic name and filter rules, shared-subscription parsing, the reference matcher."""

from __future__ import annotations

import pytest

from services.mqtt.errors import TopicFilterInvalid, TopicNameInvalid
from services.mqtt.packets import ReasonCode
from services.mqtt.topics import (
    matches,
    parse_shared,
    validate_topic_filter,
    validate_topic_name,
)


@pytest.mark.parametrize("name", ["a", "/", "a/b", "$SYS/x", " ", "a//b", "é/ü", "x" * 65535])
def test_valid_topic_names(name: str) -> None:
    validate_topic_name(name)


@pytest.mark.parametrize("name", ["", "a/+", "#", "a/b#", "+x", "a\x00b", "x" * 65536, "é" * 32768])
def test_invalid_topic_names(name: str) -> None:
    with pytest.raises(TopicNameInvalid) as info:
        validate_topic_name(name)
    assert info.value.reason_code == ReasonCode.TOPIC_NAME_INVALID


@pytest.mark.parametrize(
    "topic_filter",
    [
        "a",
        "#",
        "+",
        "a/#",
        "+/+",
        "/+",
        "a/+/b/#",
        "$SYS/#",
        "a//b",
        "$share/g/a/#",
        "$share/g/#",
        "$share/g/$share/x",
        "$sharex/a",
        "x" * 65535,
    ],
)
def test_valid_filters(topic_filter: str) -> None:
    validate_topic_filter(topic_filter)


@pytest.mark.parametrize(
    "topic_filter",
    [
        "",
        "a/#/b",
        "#/",
        "a#",
        "a/b#",
        "+a",
        "a/+b",
        "a\x00",
        "x" * 65536,
        "$share",
        "$share/",
        "$share/g",
        "$share/g/",
        "$share//a",
        "$share/g+/a",
        "$share/#/a",
        "$share/g/a/#/b",
    ],
)
def test_invalid_filters(topic_filter: str) -> None:
    with pytest.raises(TopicFilterInvalid) as info:
        validate_topic_filter(topic_filter)
    assert info.value.reason_code == ReasonCode.TOPIC_FILTER_INVALID


def test_parse_shared() -> None:
    assert parse_shared("$share/grp/a/+/c") == ("grp", "a/+/c")
    assert parse_shared("$share/g/#") == ("g", "#")
    assert parse_shared("a/b") is None
    assert parse_shared("$sharex/a") is None
    assert parse_shared("$SYS/#") is None
    with pytest.raises(TopicFilterInvalid):
        parse_shared("$share/g")


@pytest.mark.parametrize(
    ("topic_filter", "topic", "expected"),
    [
        ("a/b", "a/b", True),
        ("a/b", "a/c", False),
        ("a/+", "a/b", True),
        ("a/+", "a", False),
        ("a/+", "a/", True),
        ("a/+", "a/b/c", False),
        ("a/#", "a", True),
        ("a/#", "a/b/c", True),
        ("a/#", "ab", False),
        ("#", "a/b", True),
        ("#", "/", True),
        ("+/+", "/x", True),
        ("+", "/x", False),
        ("/+", "/x", True),
        ("#", "$SYS/x", False),
        ("+/x", "$SYS/x", False),
        ("$SYS/#", "$SYS/x", True),
        ("$SYS/#", "$SYS", True),
        ("$SYS/+", "$SYS/x", True),
        ("$share/g/a/+", "a/b", True),
        ("$share/g/#", "$SYS/a", False),
        ("a//b", "a//b", True),
        ("a/+/b", "a//b", True),
    ],
)
def test_matches(topic_filter: str, topic: str, expected: bool) -> None:
    assert matches(topic_filter, topic) is expected
