"""Topic names and topic filters: validation, shared-subscription parsing,
and the brute-force reference matcher.

Rules (MQTT 3.1.1 section 4.7, MQTT 5 section 4.7 and 4.8.2):
- names and filters are non-empty UTF-8 of at most 65535 bytes, without U+0000;
- a name holds no wildcard; in a filter `+` is a whole level and `#` is a
  whole, last level;
- `$share/<group>/<filter>` is a shared subscription: the group is non-empty
  and holds none of `+ # /`; the inner filter is a valid non-empty filter;
- a filter whose first level is a wildcard does not match a topic that
  starts with `$` (so `#` never sees `$SYS/...`).

`matches` is the reference the trie is tested against: clear, not fast.
"""

from __future__ import annotations

from services.mqtt.errors import TopicFilterInvalid, TopicNameInvalid

MAX_TOPIC_BYTES = 65535  # the two-byte length prefix of an MQTT UTF-8 string
SHARE_PREFIX = "$share/"
_SAFE_CHARS = MAX_TOPIC_BYTES // 4  # at most 4 UTF-8 bytes a character: no need to encode


def _too_long(text: str) -> bool:
    return len(text) > _SAFE_CHARS and len(text.encode("utf-8", "surrogatepass")) > MAX_TOPIC_BYTES


def validate_topic_name(name: str) -> None:
    """Raise TopicNameInvalid unless `name` may be published to."""
    if not name:
        raise TopicNameInvalid("empty topic name")
    if "+" in name or "#" in name:
        raise TopicNameInvalid(f"wildcard in topic name {name!r}")
    if "\x00" in name:
        raise TopicNameInvalid("U+0000 in topic name")
    if _too_long(name):
        raise TopicNameInvalid("topic name longer than 65535 bytes")


def _validate_plain_filter(topic_filter: str) -> None:
    if not topic_filter:
        raise TopicFilterInvalid("empty topic filter")
    if "\x00" in topic_filter:
        raise TopicFilterInvalid("U+0000 in topic filter")
    if _too_long(topic_filter):
        raise TopicFilterInvalid("topic filter longer than 65535 bytes")
    if "+" not in topic_filter and "#" not in topic_filter:
        return
    levels = topic_filter.split("/")
    last = len(levels) - 1
    for i, level in enumerate(levels):
        if level == "+":
            continue
        if level == "#":
            if i != last:
                raise TopicFilterInvalid(f"'#' is not the last level of {topic_filter!r}")
            continue
        if "+" in level or "#" in level:
            raise TopicFilterInvalid(f"wildcard inside a level of {topic_filter!r}")


def parse_shared(topic_filter: str) -> tuple[str, str] | None:
    """`$share/group/filter` -> (group, filter); None for a non-shared filter.

    Raises TopicFilterInvalid for a malformed shared filter (`$share`,
    `$share/`, an empty group or one holding `+ # /`, a bad inner filter).
    """
    if not topic_filter.startswith(SHARE_PREFIX):
        if topic_filter == "$share":
            raise TopicFilterInvalid("'$share' without a group and filter")
        return None
    group, sep, inner = topic_filter[len(SHARE_PREFIX) :].partition("/")
    if not group:
        raise TopicFilterInvalid(f"empty share group in {topic_filter!r}")
    if not sep:
        raise TopicFilterInvalid(f"no filter after the share group in {topic_filter!r}")
    if "+" in group or "#" in group:
        raise TopicFilterInvalid(f"wildcard in share group of {topic_filter!r}")
    if _too_long(topic_filter):
        raise TopicFilterInvalid("topic filter longer than 65535 bytes")
    _validate_plain_filter(inner)
    return group, inner


def validate_topic_filter(topic_filter: str) -> None:
    """Raise TopicFilterInvalid unless `topic_filter` may be subscribed to."""
    if parse_shared(topic_filter) is None:
        _validate_plain_filter(topic_filter)


def matches(topic_filter: str, topic: str) -> bool:
    """Whether a valid filter matches a valid topic name, level by level.

    A shared filter matches as its inner filter does.
    """
    shared = parse_shared(topic_filter)
    if shared is not None:
        topic_filter = shared[1]
    f_levels = topic_filter.split("/")
    t_levels = topic.split("/")
    if topic.startswith("$") and f_levels[0] in ("+", "#"):
        return False
    for i, level in enumerate(f_levels):
        if level == "#":
            return True
        if i >= len(t_levels):
            return False
        if level != "+" and level != t_levels[i]:
            return False
    return len(f_levels) == len(t_levels)
