"""The view as records: one vocabulary for every source the drift check compares.

The records (`session_record`, `subscription_record`, `retained_record`)
describe a live node's view (`services.node.dump`), the replay and the state
store alike, so every source is compared field by field in one vocabulary. A
retained message is described by digests of its payload and properties,
never the payload itself.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Final

from services.state.clientsubs import SubscriptionOptions
from services.state.entries import RetainedEntry, SessionEntry
from services.state.live import Record
from services.state.view import ClusterView

DIGEST_BYTES: Final = 16  # blake2b digest size: 128 bits tell payloads apart


# -- records: one vocabulary for every source ------------------------------------


def session_record(e: SessionEntry) -> Record:
    return {
        "node": e.node,
        "online": e.online,
        "expiry_s": e.expiry_s,
        "version": e.version,
        "epoch": e.epoch,
        "clean_start": e.clean_start,
        "protocol": e.protocol,
        "username": e.username,
        "offline_since_ms": e.offline_since_ms,
    }


def subscription_record(o: SubscriptionOptions) -> Record:
    return {
        "qos": o.qos,
        "no_local": o.no_local,
        "retain_as_published": o.retain_as_published,
        "retain_handling": o.retain_handling,
        "subscription_id": o.subscription_id,
        "version": o.version,
    }


def digest(data: bytes) -> str:
    return "blake2b:" + hashlib.blake2b(data, digest_size=DIGEST_BYTES).hexdigest()


def retained_record(e: RetainedEntry) -> Record:
    props = [
        e.payload_format_indicator,
        e.content_type,
        e.response_topic,
        e.correlation_data.hex() if e.correlation_data is not None else None,
        [list(p) for p in e.user_property],
    ]
    has_props = any(p for p in props if p is not None)
    return {
        "version": e.version,
        "qos": e.qos,
        "payload": digest(e.payload),
        "size": len(e.payload),
        "expires_at_ms": e.expires_at_ms,
        "sender": e.sender,
        "properties": digest(json.dumps(props).encode()) if has_props else None,
    }


@dataclass(frozen=True, slots=True)
class ViewRecords:
    sessions: dict[str, Record]
    subscriptions: dict[tuple[str, str], Record]
    retained: dict[str, Record]


def view_records(view: ClusterView) -> ViewRecords:
    """A view as records (the drift check's replay and state store, too)."""
    return records_of(view.sessions(), view.all_subscriptions(), view.retained_topics())


def records_of(
    sessions: dict[str, SessionEntry],
    subscriptions: dict[str, dict[str, SubscriptionOptions]],
    retained: dict[str, RetainedEntry],
) -> ViewRecords:
    return ViewRecords(
        sessions={c: session_record(e) for c, e in sessions.items()},
        subscriptions={
            (c, f): subscription_record(o)
            for c, subs in subscriptions.items()
            for f, o in subs.items()
        },
        retained={t: retained_record(e) for t, e in retained.items()},
    )
