"""The state store's key layout in Redis: one home for the names that its
writer (the Spark job, streams/statestore.py and its state_apply.lua), its
reader (services.state.redis) and the drift check (services.state.live) use.

Every key shares one hash tag, `{<topic prefix>state}:`, so the Lua script
that writes a batch touches one slot on Redis Cluster. Standard library
only: streams/ imports this module (tests/test_architecture.py).

    {p state}:sessions      client -> the newest session event (its JSON)
    {p state}:session_v     client -> that event's version
    {p state}:session_node  client -> the node that wrote it
    {p state}:floors        client -> the version of its newest session end
    {p state}:subs          client -> its subscriptions (one JSON object)
    {p state}:routes        filter \\0 node -> live subscriptions
    {p state}:retained      topic -> the newest retained event (its JSON)
    {p state}:retained_v    topic -> that event's version
    {p state}:offsets       topic:partition -> the next offset to read
    {p state}:meta          the last batch, the log generation
    {p state}:meta:reseed   the claim of a node re-seeding the log
    {p state}:verify        the drift check's request
    {p state}:live:<node>   a node's answer to it
"""

from __future__ import annotations

from typing import Final

STATE_KEYS: Final = (  # in state_apply.lua's KEYS order: KEYS[1] is sessions
    "sessions",
    "session_v",
    "session_node",
    "floors",
    "subs",
    "routes",
    "retained",
    "retained_v",
    "offsets",
    "meta",
)


def tag(topic_prefix: str) -> str:
    return "{" + topic_prefix + "state}:"


def state_keys(topic_prefix: str) -> dict[str, str]:
    """Name -> key, in STATE_KEYS order (so `tuple(....values())` is the script's KEYS)."""
    return {name: tag(topic_prefix) + name for name in STATE_KEYS}


def reseed_key(topic_prefix: str) -> str:
    return tag(topic_prefix) + "meta:reseed"


def live_keys(topic_prefix: str) -> tuple[str, str]:
    """(the drift check's request key, the prefix of the nodes' dump keys)."""
    return tag(topic_prefix) + "verify", tag(topic_prefix) + "live:"
