"""The ACL file: ordered allow/deny rules in TOML, and the built-in default rules.

Theory of operation. The file is TOML: optional `[groups]` of user names and
an ordered array of `[[rule]]` tables, the first matching rule deciding
(`services.auth.aclrules`):

    [groups]
    admin = ["alice"]

    [[rule]]
    permission = "allow"          # allow | deny (required)
    user = "bob"                  # who, all optional: user, client, ip (CIDR), group
    action = "publish"            # publish | subscribe | all (the default)
    topics = ["dev/%u/#", {eq = "#"}]   # filters; {eq = ...} exact; none: every topic
    qos = [0, 1]                  # optional: only these QoS
    retain = false                # optional: only (non-)retained publishes

Anything else (an unknown key, a bad filter, an undefined group, a QoS
outside 0..2) is an `AclFileError` naming the rule: a node does not start
with it, and a running node keeps the rules it had. A file with no rules
is valid and denies everything (`services.auth.acl`). `DEFAULT_ACL` is what
a node runs without a file, as EMQX ships its acl.conf.
"""

from __future__ import annotations

import ipaddress
import tomllib
from pathlib import Path
from typing import Any, Final

from services.auth.aclrules import Covers, Rule, Topic
from services.mqtt.errors import TopicFilterInvalid
from services.mqtt.topics import validate_topic_filter

DEFAULT_ACL: Final = """\
# Weir's built-in rules (no acl_file set), as EMQX ships its acl.conf.
[groups]
admin = []  # user names that may read $SYS/# from anywhere

# Loopback peers may do everything, $SYS/# and # included.
[[rule]]
permission = "allow"
ip = "127.0.0.0/8"

[[rule]]
permission = "allow"
ip = "::1/128"

[[rule]]
permission = "allow"
group = "admin"
action = "subscribe"
topics = ["$SYS/#"]

# Everybody else: no $SYS, and not # itself (everything at once).
[[rule]]
permission = "deny"
action = "subscribe"
topics = ["$SYS/#", {eq = "#"}]

# The rest is allowed.
[[rule]]
permission = "allow"
"""

RULE_KEYS: Final = frozenset(
    {"permission", "user", "client", "ip", "group", "action", "topics", "qos", "retain"}
)
ACTIONS: Final = {"publish": Covers.PUBLISH, "subscribe": Covers.SUBSCRIBE, "all": Covers.ALL}


class AclFileError(Exception):
    """The ACL file cannot be read or is malformed; the message is one line."""


class AclFileUnreadable(AclFileError):
    """The file could not be read at all (missing, no permission)."""


class _Bad(Exception):
    """One rule's problem; `parse` adds where it is."""


def _text(rule: dict[str, Any], key: str) -> str | None:
    value = rule.get(key)
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        raise _Bad(f"{key} must be a non-empty string")
    return value


def _topic(raw: Any) -> Topic:
    if isinstance(raw, dict):
        if set(raw) != {"eq"} or not isinstance(raw["eq"], str) or not raw["eq"]:
            raise _Bad('an exact topic is written {eq = "filter"}')
        return Topic(raw["eq"], exact=True)
    if not isinstance(raw, str):
        raise _Bad(f"a topic must be a string or {{eq = ...}}, not {raw!r}")
    try:
        validate_topic_filter(raw)
    except TopicFilterInvalid:
        raise _Bad(f"{raw!r} is not a valid topic filter") from None
    return Topic(raw, placeholders="%u" in raw or "%c" in raw)


def _rule(raw: dict[str, Any], groups: dict[str, frozenset[str]], source: str) -> Rule:
    unknown = set(raw) - RULE_KEYS
    if unknown:
        raise _Bad(f"unknown key {sorted(unknown)[0]!r}")
    permission = raw.get("permission")
    if permission not in ("allow", "deny"):
        raise _Bad('permission must be "allow" or "deny"')
    action = raw.get("action", "all")
    if action not in ACTIONS:
        raise _Bad('action must be "publish", "subscribe" or "all"')
    topics: tuple[Topic, ...] | None = None
    if "topics" in raw:
        if not isinstance(raw["topics"], list) or not raw["topics"]:
            raise _Bad("topics must be a non-empty list (leave it out for every topic)")
        topics = tuple(_topic(t) for t in raw["topics"])
    ip = _text(raw, "ip")
    try:
        network = None if ip is None else ipaddress.ip_network(ip, strict=False)
    except ValueError:
        raise _Bad(f"ip {ip!r} is not an address or CIDR network") from None
    group_name = _text(raw, "group")
    if group_name is not None and group_name not in groups:
        raise _Bad(f"group {group_name!r} is not defined in [groups]")
    qos = raw.get("qos")
    if qos is not None and (
        not isinstance(qos, list) or not qos or any(q not in (0, 1, 2) for q in qos)
    ):
        raise _Bad("qos must be a list of 0, 1 and 2")
    retain = raw.get("retain")
    if retain is not None and not isinstance(retain, bool):
        raise _Bad("retain must be true or false")
    return Rule(
        allow=permission == "allow",
        covers=ACTIONS[action],
        topics=topics,
        user=_text(raw, "user"),
        client=_text(raw, "client"),
        network=network,
        group=None if group_name is None else groups[group_name],
        qos=None if qos is None else frozenset(qos),
        retain=retain,
        source=source,
    )


def _groups(raw: Any) -> dict[str, frozenset[str]]:
    if not isinstance(raw, dict):
        raise _Bad("[groups] must be a table of name = [user names]")
    groups: dict[str, frozenset[str]] = {}
    for name, users in raw.items():
        if not isinstance(users, list) or not all(isinstance(u, str) for u in users):
            raise _Bad(f"group {name!r} must be a list of user names")
        groups[name] = frozenset(users)
    return groups


def parse(text: str, name: str) -> tuple[Rule, ...]:
    """The rules of an ACL file's text; `name` labels them ("acl.toml rule 3")."""
    try:
        table = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise AclFileError(f"ACL file {name}: {exc}") from None
    unknown = set(table) - {"groups", "rule"}
    if unknown:
        raise AclFileError(
            f"ACL file {name}: unknown table {sorted(unknown)[0]!r} (expected [groups], [[rule]])"
        )
    try:
        groups = _groups(table.get("groups", {}))
    except _Bad as exc:
        raise AclFileError(f"ACL file {name}: {exc}") from None
    raw_rules = table.get("rule", [])
    if not isinstance(raw_rules, list):
        raise AclFileError(f"ACL file {name}: rules are [[rule]] tables")
    rules: list[Rule] = []
    for number, raw in enumerate(raw_rules, start=1):
        source = f"{name} rule {number}"
        try:
            if not isinstance(raw, dict):
                raise _Bad("a rule is a [[rule]] table")
            rules.append(_rule(raw, groups, source))
        except _Bad as exc:
            raise AclFileError(f"ACL file {source}: {exc}") from None
    return tuple(rules)


def read(path: Path) -> tuple[Rule, ...]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise AclFileUnreadable(f"ACL file {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise AclFileError(f"ACL file {path}: not UTF-8") from None
    return parse(text, str(path))


def default_rules(final_allow: bool = True) -> tuple[Rule, ...]:
    """The built-in rules; without their last "allow the rest" when another
    source (Redis) is to decide what they leave open."""
    rules = parse(DEFAULT_ACL, "built-in ACL")
    return rules if final_allow else rules[:-1]
