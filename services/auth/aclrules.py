"""ACL rules: the model and the first-match evaluator (EMQX's authorization rules).

Theory of operation. A rule is a permission (allow or deny), who it is for,
the actions it covers (publish, subscribe or both), the topics it names and
optional QoS and retain conditions. `first_match` walks rules in order and
returns the first whose every condition holds; the caller (`services.auth.acl`)
turns "none matched" into the configured `no_match`.

- Who: any of a user name, a client id, an address network (CIDR, matched
  against the peer's address) and a group (a set of user names); a rule
  naming several needs all of them, a rule naming none is for everybody.
- Topics: MQTT filters. A published topic name is matched as usual; a
  subscribed filter matches a rule's filter when every topic it can receive
  is one the rule's filter covers, as EMQX does: `a/#` covers `a/+/b` and
  `a/#`, `a/+` does not cover `a/#`, and `#` or `+` at the first level never
  covers a `$` topic. A shared subscription (`$share/g/f`) is checked as
  `f`. `eq` topics compare the whole string, so `{eq = "#"}` names the
  filter `#` itself and nothing it covers. A rule without topics covers all.
- Placeholders `%u` and `%c` in a (non-`eq`) topic become the client's user
  name and client id. A value that is missing, empty, or contains `+`, `#`
  or `/` would widen the filter, so then the rule does not match at all.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from enum import Enum
from typing import Final

from services.auth.api import Action, ClientInfo
from services.mqtt.topics import parse_shared

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
Address = ipaddress.IPv4Address | ipaddress.IPv6Address

UNSAFE_IN_PLACEHOLDER: Final = frozenset("+#/")


class Covers(Enum):
    PUBLISH = frozenset({Action.PUBLISH})
    SUBSCRIBE = frozenset({Action.SUBSCRIBE})
    ALL = frozenset({Action.PUBLISH, Action.SUBSCRIBE})


@dataclass(frozen=True, slots=True)
class Topic:
    pattern: str
    exact: bool = False  # `eq`: the whole string, wildcards taken literally
    placeholders: bool = False  # holds %u or %c

    def __str__(self) -> str:
        return f"eq {self.pattern}" if self.exact else self.pattern


@dataclass(frozen=True, slots=True)
class Rule:
    allow: bool
    covers: Covers = Covers.ALL
    topics: tuple[Topic, ...] | None = None  # None: every topic
    user: str | None = None
    client: str | None = None
    network: Network | None = None
    group: frozenset[str] | None = None  # user names
    qos: frozenset[int] | None = None
    retain: bool | None = None
    source: str = ""  # where it was written: "acl.toml rule 3", "redis weir:acl:bob"
    actions: frozenset[Action] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:  # an Enum's .value costs a descriptor call per check
        object.__setattr__(self, "actions", self.covers.value)

    def __str__(self) -> str:
        what = "allow" if self.allow else "deny"
        who = [
            f"{name} {value}"
            for name, value in (
                ("user", self.user),
                ("client", self.client),
                ("ip", self.network),
            )
            if value is not None
        ]
        if self.group is not None:
            who.append(f"group of {len(self.group)}")
        topics = "all topics" if self.topics is None else ", ".join(map(str, self.topics))
        text = f"{what} {' and '.join(who) or 'all'} {self.covers.name.lower()} {topics}"
        if self.qos is not None:
            text += f" qos {','.join(map(str, sorted(self.qos)))}"
        if self.retain is not None:
            text += f" retain {str(self.retain).lower()}"
        return f"{self.source} ({text})" if self.source else text

    @property
    def is_catch_all(self) -> bool:
        """Matches every client, topic, QoS and retain flag for its actions."""
        return (
            self.topics is None
            and self.user is None
            and self.client is None
            and self.network is None
            and self.group is None
            and self.qos is None
            and self.retain is None
        )


def peer_address(peer: str) -> Address | None:
    """The address of a "host:port" peer (IPv6 hosts are not bracketed here)."""
    host = peer.rpartition(":")[0].strip("[]")
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def covers(rule_filter: str, topic: str) -> bool:
    """Whether `rule_filter` covers `topic`: a topic name, or a filter whose
    wildcards must be matched by the same or a wider wildcard."""
    r_levels = rule_filter.split("/")
    t_levels = topic.split("/")
    if topic.startswith("$") and r_levels[0] in ("+", "#"):
        return False
    for i, level in enumerate(r_levels):
        if level == "#":
            return True
        if i >= len(t_levels):
            return False
        wanted = t_levels[i]
        if wanted == "#" or level not in ("+", wanted):
            return False
    return len(r_levels) == len(t_levels)


def _substitute(pattern: str, client: ClientInfo) -> str | None:
    """The pattern with %u / %c filled in, or None if a value could widen it."""
    for mark, value in (("%u", client.username), ("%c", client.client_id)):
        if mark not in pattern:
            continue
        if not value or not UNSAFE_IN_PLACEHOLDER.isdisjoint(value):
            return None
        pattern = pattern.replace(mark, value)
    return pattern


def _topic_matches(rule: Rule, client: ClientInfo, topic: str) -> bool:
    if rule.topics is None:
        return True
    inner = parse_shared(topic) if topic.startswith("$share/") else None
    checked = topic if inner is None else inner[1]
    for candidate in rule.topics:
        if candidate.exact:
            if candidate.pattern == checked:
                return True
            continue
        pattern = candidate.pattern
        if candidate.placeholders:
            filled = _substitute(pattern, client)
            if filled is None:
                continue
            pattern = filled
        if covers(pattern, checked):
            return True
    return False


def rule_matches(
    rule: Rule,
    client: ClientInfo,
    address: Address | None,
    action: Action,
    topic: str,
    qos: int,
    retain: bool,
) -> bool:
    if action not in rule.actions:
        return False
    if rule.user is not None and client.username != rule.user:
        return False
    if rule.client is not None and client.client_id != rule.client:
        return False
    if rule.network is not None and (address is None or address not in rule.network):
        return False
    if rule.group is not None and client.username not in rule.group:
        return False
    if rule.qos is not None and qos not in rule.qos:
        return False
    if rule.retain is not None and retain != rule.retain:
        return False
    return _topic_matches(rule, client, topic)


def first_match(
    rules: tuple[Rule, ...],
    client: ClientInfo,
    address: Address | None,
    action: Action,
    topic: str,
    qos: int,
    retain: bool,
) -> Rule | None:
    for rule in rules:
        if rule_matches(rule, client, address, action, topic, qos, retain):
            return rule
    return None


def may_deny(rules: tuple[Rule, ...], action: Action, no_match_allows: bool) -> bool:
    """Whether some client could be denied `action` under these rules: False
    once a catch-all allow for it comes before any deny that covers it."""
    for rule in rules:
        if action not in rule.actions:
            continue
        if not rule.allow:
            return True
        if rule.is_catch_all:
            return False
    return not no_match_allows
