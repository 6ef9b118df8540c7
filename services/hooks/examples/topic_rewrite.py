"""The `topic_rewrite` plugin: PUBLISH topics rewritten by rules (EMQX's topic
rewrite, for publishes).

    [[plugin]]
    name = "topic_rewrite"
    [plugin.config]
    rules = [
      { filter = "x/#", from = '^x/y/(.+)$', to = "z/y/$1" },
    ]

A message whose topic matches a rule's MQTT `filter` and its regular
expression `from` gets the topic `to`, where `$1`... are the expression's
groups. Rules are tried in order; the first whose filter and expression
both match is applied, and no other. A rule's result must be a valid topic
name (no wildcards): one that is not leaves the topic as it was, and the
rule is reported once. Rewriting runs on the message.publish hook, before
authorization of subscribers and routing, so retained messages and bridges
see the new topic; the publisher's own authorization was on the old one.
"""

from __future__ import annotations

import dataclasses
import logging
import re
from dataclasses import dataclass
from typing import Any

from services.hooks.api import CONTINUE, Continue, Hooks
from services.mqtt.topics import matches

log = logging.getLogger("weir.plugins.topic_rewrite")

_GROUP = re.compile(r"\$(\d+)")


@dataclass(frozen=True, slots=True)
class Rule:
    filter: str
    source: re.Pattern[str]
    to: str

    def apply(self, topic: str) -> str | None:
        if not matches(self.filter, topic):
            return None
        found = self.source.search(topic)
        if found is None:
            return None
        return _GROUP.sub(lambda m: found.group(int(m.group(1))) or "", self.to)


def rules_from(config: dict[str, Any]) -> list[Rule]:
    """The config's rules; ValueError (one line) for a bad one."""
    unknown = set(config) - {"rules"}
    if unknown:
        raise ValueError(f"unknown key {sorted(unknown)[0]!r} (topic_rewrite takes: rules)")
    out = []
    for number, raw in enumerate(config.get("rules", ()), start=1):
        if not isinstance(raw, dict) or set(raw) != {"filter", "from", "to"}:
            raise ValueError(f"rule {number}: needs exactly filter, from and to")
        try:
            source = re.compile(str(raw["from"]))
        except re.error as exc:
            raise ValueError(f"rule {number}: from is not a regular expression: {exc}") from None
        groups = [int(g) for g in _GROUP.findall(str(raw["to"]))]
        if groups and max(groups) > source.groups:
            raise ValueError(f"rule {number}: to names ${max(groups)}; from has "
                             f"{source.groups} group(s)")  # fmt: skip
        out.append(Rule(str(raw["filter"]), source, str(raw["to"])))
    return out


class TopicRewrite:
    def __init__(self, config: dict[str, Any]) -> None:
        self.rules = rules_from(config)
        self.rewritten = 0

    def register(self, hooks: Hooks) -> None:
        hooks.add("message.publish", self.on_publish, priority=100)  # before other plugins

    def on_publish(self, client: Any, message: Any) -> Any:
        for rule in self.rules:
            topic = rule.apply(message.topic)
            if topic is None:
                continue
            if not topic or "+" in topic or "#" in topic:
                log.warning("rule %s -> %s made %r, not a topic name; topic kept",
                            rule.source.pattern, rule.to, topic)  # fmt: skip
                return CONTINUE
            self.rewritten += 1
            return Continue(dataclasses.replace(message, topic=topic))
        return CONTINUE
