"""Figures of the cluster chaos test (`test_cluster_chaos`): what the kill
schedule did and what each listener got, as tallies the test asserts on and
as the printed report whose first line is the one to quote.

Ids are the publishers' payloads (`Publisher.ids`); negative ones are the
barrier's probes and never counted. A tally of several subscribers (the
shared group) counts the group as one listener: a copy on one member and
another on another member is a duplicate.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field

from tests.chaos.clients import OfflineSubscriber, Publisher, Subscriber
from tests.chaos.harness import NodeProcess, Ports


@dataclass
class Kill:
    node: str
    quick: bool
    at: float  # monotonic
    away: list[str] = field(default_factory=list)  # offline subscribers away at the kill
    lapsed: bool = False  # the heartbeat record was seen gone before the node was ready
    restart_s: float = 0.0  # from the restart to ready


@dataclass
class Cast:
    publishers: list[Publisher]
    online: list[Subscriber]
    offline: list[OfflineSubscriber]
    clean: list[Subscriber]
    members: list[Subscriber]
    ports: dict[str, Ports] = field(default_factory=dict)  # client id -> its Ports
    publish_s: float = 0.0  # from the publishers' start to their `finish`

    @property
    def persistent(self) -> list[Subscriber]:
        return [*self.online, *self.offline]

    @property
    def listeners(self) -> list[Subscriber]:
        return [*self.online, *self.offline, *self.clean, *self.members]


def all_ids(cast: Cast) -> set[int]:
    """Every id the publishers sent."""
    return {i for p in cast.publishers for i in p.ids()}


def group_seen(cast: Cast) -> set[int]:
    return set().union(*(m.seen for m in cast.members))


@dataclass
class Tally:
    """One listener's (or the group's) deliveries of the publishers' messages."""

    name: str
    deliveries: int = 0
    missing: list[int] = field(default_factory=list)
    qos2_twice: list[int] = field(default_factory=list)  # a QoS 2 publisher's id seen again
    dup0: list[int] = field(default_factory=list)  # repeated deliveries without DUP=1
    dup0_unexplained: list[int] = field(default_factory=list)  # of them, not a QoS 1 resend
    order: list[tuple[int, int, int]] = field(default_factory=list)  # (conn, seq, high)
    order_unexplained: list[tuple[int, int, int]] = field(default_factory=list)


def tally(name: str, subs: list[Subscriber], cast: Cast) -> Tally:
    stride = len(cast.publishers)
    qos2 = {i for p in cast.publishers if p.qos == 2 for i in p.ids()}
    resent = set().union(*(p.resent_seqs for p in cast.publishers))
    counts: Counter[int] = Counter()
    t = Tally(name)
    for s in subs:
        counts.update(seq for seq, _ in s.delivered if seq >= 0)
        t.dup0 += [seq for seq, dup in s.duplicates() if seq >= 0 and not dup]
        t.order += [v for v in s.order_violations(stride) if v[1] >= 0]
    if len(subs) > 1:  # the group: a copy on one member and another on another
        first: set[int] = set()
        for s in subs:
            again = {seq for seq in s.seen if seq >= 0} & first
            t.dup0 += sorted(again - qos2)
            first |= s.seen
    t.deliveries = sum(counts.values())
    t.missing = sorted(all_ids(cast) - set(counts))
    if all(s.qos == 2 for s in subs):  # at QoS 1 / 0 a redelivery may come (DUP=1 at QoS 1)
        t.qos2_twice = sorted(i for i in qos2 if counts[i] > 1)
    t.dup0_unexplained = [i for i in t.dup0 if i in qos2 or i not in resent]
    t.order_unexplained = [v for v in t.order if v[1] not in resent]
    return t


def report(
    seed: int, began: float, cast: Cast, kills: list[Kill], nodes: dict[str, NodeProcess]
) -> dict[str, Tally]:
    """Print the figures (the first line is the one to quote); the tallies by name."""
    expected = all_ids(cast)
    qos2_msgs = sum(p.total for p in cast.publishers if p.qos == 2)
    acked = sum(len(p.acked_at) for p in cast.publishers)
    tallies = {s.client_id: tally(s.name, [s], cast) for s in [*cast.persistent, *cast.clean]}
    group_name = f"{cast.members[0].topic} ({len(cast.members)} members)"
    group = tallies["group"] = tally(group_name, cast.members, cast)
    persistent = [tallies[s.client_id] for s in cast.persistent]
    qos2_subs = [tallies[s.client_id] for s in cast.persistent if s.qos == 2]
    quick = [k for k in kills if k.quick]
    qos2 = {i for p in cast.publishers if p.qos == 2 for i in p.ids()}
    resent = set().union(*(p.resent_seqs for p in cast.publishers))
    loss = ", ".join(
        f"{s.client_id.removeprefix('chaos-')} lost {len(tallies[s.client_id].missing)}"
        f" ({100 * len(tallies[s.client_id].missing) / max(1, len(expected)):.1f}%), "
        f"QoS 2 messages twice {len(twice)} (resent by their publisher {len(twice & resent)}, "
        f"on one connection {len(twice_on_one_connection(s) & qos2)})"
        for s in cast.clean
        for twice in [{seq for seq, _ in s.duplicates() if seq in qos2}]
    )
    lines = [
        f"=== cluster chaos figures: seed {seed}, {len(nodes)} nodes, kills {len(kills)} "
        f"(quick {len(quick)}, back within the TTL {sum(not k.lapsed for k in quick)}; "
        f"slow {len(kills) - len(quick)}), messages {len(expected)} (QoS 2 {qos2_msgs}, "
        f"QoS 1 {len(expected) - qos2_msgs}; {len(expected) / max(1.0, cast.publish_s):.0f} msg/s "
        f"over {cast.publish_s:.0f} s), acknowledged {acked}; missing: persistent "
        f"{sum(len(t.missing) for t in persistent)}, shared {len(group.missing)}; QoS 2 "
        f"duplicates: subscribers "
        f"{sum(len(t.qos2_twice) for t in qos2_subs)}, "
        f"shared {len(group.qos2_twice)}; DUP=0 duplicates "
        f"{sum(len(t.dup0) for t in persistent) + len(group.dup0)} (not QoS 1 resends "
        f"{sum(len(t.dup0_unexplained) for t in persistent) + len(group.dup0_unexplained)}); "
        f"order violations: persistent {sum(len(t.order) for t in persistent)} (not resends "
        f"{sum(len(t.order_unexplained) for t in persistent)}), shared {len(group.order)}; "
        f"clean: {loss}; time {time.monotonic() - began:.0f} s ===",
        "kills: "
        + ", ".join(
            f"{k.node}@{k.at - began:.1f}s {'quick' if k.quick else 'slow'}"
            f"{' (lapsed)' if k.quick and k.lapsed else ''} ready {k.restart_s:.1f}s"
            for k in kills
        ),
        "publishers: "
        + ", ".join(
            f"{p.client_id} QoS {p.qos} sent {p.total} connects {p.connects} resent "
            f"{p.resent_publish}/{p.resent_pubrel} lost {p.sessions_lost} outstanding "
            f"{len(p.outstanding)} {sorted(p.outstanding.items())[:4]}, "
            f"ack latency s median/p99/max {latency(p)}"
            for p in cast.publishers
        ),
        f"{'listener':<44} {'deliv':>6} {'miss':>5} {'q2x2':>4} {'dup0':>5} {'unexp':>5} "
        f"{'order':>5} {'unexp':>5} {'conns':>5} {'lost':>4}  by node",
    ]
    for s in [*cast.persistent, *cast.clean, *cast.members]:
        t = tallies.get(s.client_id) or tally(s.name, [s], cast)
        used = cast.ports[s.client_id].used
        lines.append(
            f"{t.name:<44} {t.deliveries:>6} {len(t.missing):>5} {len(t.qos2_twice):>4} "
            f"{len(t.dup0):>5} {len(t.dup0_unexplained):>5} {len(t.order):>5} "
            f"{len(t.order_unexplained):>5} {s.connects:>5} {s.sessions_lost:>4}  "
            + " ".join(f"{port}:{n}" for port, n in sorted(used.items()))
        )
    lines.append(
        f"{group.name:<44} {group.deliveries:>6} {len(group.missing):>5} "
        f"{len(group.qos2_twice):>4} {len(group.dup0):>5} {len(group.dup0_unexplained):>5} "
        f"{len(group.order):>5}"
    )
    for t in tallies.values():
        if t.name.startswith("chaos-clean"):
            continue
        for what, items in (
            ("missing", t.missing),
            ("QoS 2 twice", t.qos2_twice),
            ("DUP=0 duplicates not from a QoS 1 resend", t.dup0_unexplained),
        ):
            if items:
                runs = ranges(items, len(cast.publishers))
                lines.append(f"  {t.name}: {what} {len(items)}: {runs}")
        if t.order_unexplained:
            lines.append(
                f"  {t.name}: order violations not from resends: "
                + ", ".join(f"{q} after {h} (conn {c})" for c, q, h in t.order_unexplained[:8])
            )
    lines.append(
        "offline subscribers: "
        + ", ".join(
            f"{s.client_id} windows {len(s.offline_windows)}, kills while away "
            f"{sum(1 for k in kills if s.client_id in k.away)}"
            for s in cast.offline
        )
    )
    ports = {n.port: node_id for node_id, n in nodes.items()}
    lines.append("ports: " + ", ".join(f"{p} {i}" for p, i in ports.items()))
    for node_id, node in nodes.items():
        lines.append(f"{node_id} log {node.log_path}:{node.warnings(12)}")
    print("\n".join(lines))
    return tallies


def ranges(seqs: list[int], stride: int) -> str:
    """Runs of ids `stride` apart (one publisher's consecutive messages), the first 12."""
    out: list[list[int]] = []
    for seq in sorted(seqs):
        if out and out[-1][1] + stride == seq:
            out[-1][1] = seq
        else:
            out.append([seq, seq])
    text = ", ".join(f"{a}" if a == b else f"{a}-{b}" for a, b in out[:12])
    return text + (f" (+{len(out) - 12} runs)" if len(out) > 12 else "")


def twice_on_one_connection(sub: Subscriber) -> set[int]:
    """Ids the subscriber's application got twice on one connection (a clean
    session's next connection is a new session: a copy there is not counted)."""
    seen: set[tuple[int, int]] = set()
    again = set()
    for seq, _, _, conn in sub.trace:
        if (seq, conn) in seen:
            again.add(seq)
        seen.add((seq, conn))
    return again


def latency(pub: Publisher) -> str:
    """Seconds from each message's first PUBLISH to its first PUBACK / PUBREC."""
    waits = sorted(pub.acked_at[i] - t for i, t in pub.sent_at.items() if i in pub.acked_at)
    if not waits:
        return "-"
    return "/".join(f"{waits[int(q * (len(waits) - 1))]:.2f}" for q in (0.5, 0.99, 1.0))
