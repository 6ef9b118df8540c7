"""Differences between what the log says and what a source holds (the drift check).

Theory of operation. The reference is a full replay of the log into a
`ClusterView`. Every source (the state store loaded the way a starting node
loads it, each live node's dump) is described by the same records
(services.state.records), so comparing is a matter of keys and fields:
an entry the source lacks, an entry the log does not have, or an entry
whose fields differ, one line each, naming every differing field with both
values. Lines are sorted by what they are about, so two runs over the same
state print the same text.

Routes are compared as the state store keeps them: filter -> node -> live
subscriptions, the node being that of the client's newest session event
(also when that event ended the session). The replay tracks that node per
client (`SessionNodes`), since the view forgets ended sessions.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from services.event.schema import Event, SessionEvent
from services.state.live import Positions, Record
from services.state.records import ViewRecords

LOG = "log"  # how the reference is named in a line


@dataclass(slots=True)
class SessionNodes:
    """The node of each client's newest session event, as a replay meets them."""

    newest: dict[str, tuple[int, str]] = field(default_factory=dict)

    def see(self, event: Event) -> None:
        if isinstance(event, SessionEvent):
            held = self.newest.get(event.client_id)
            if held is None or event.version > held[0]:
                self.newest[event.client_id] = (event.version, event.node)

    def node(self, client_id: str) -> str:
        held = self.newest.get(client_id)
        return held[1] if held is not None else ""


def expected_routes(
    subscriptions: Iterable[tuple[str, str]], nodes: SessionNodes
) -> dict[str, dict[str, int]]:
    """filter -> node -> live subscriptions, from (client, filter) pairs."""
    routes: dict[str, dict[str, int]] = {}
    for client_id, filter_ in subscriptions:
        per_node = routes.setdefault(filter_, {})
        where = nodes.node(client_id)
        per_node[where] = per_node.get(where, 0) + 1
    return routes


def _show(value: object) -> str:
    return repr(value)


def _record(record: Record) -> str:
    return " ".join(f"{k}={_show(v)}" for k, v in sorted(record.items()))


def _entries(
    what: str,
    source: str,
    got: Mapping[str, Record] | Mapping[tuple[str, str], Record],
    want: Mapping[str, Record] | Mapping[tuple[str, str], Record],
) -> list[tuple[str, str]]:
    """(sort key, line) per differing entry."""
    out: list[tuple[str, str]] = []
    keys = set(got) | set(want)
    for key in keys:
        name = " ".join(map(_show, key)) if isinstance(key, tuple) else _show(key)
        mine, theirs = got.get(key), want.get(key)  # type: ignore[call-overload]
        if mine is None:
            line = f"{what} {name}: missing; the {LOG} has {_record(theirs)}"
        elif theirs is None:
            line = f"{what} {name}: not in the {LOG}; the {source} has {_record(mine)}"
        else:
            fields = sorted(set(mine) | set(theirs))
            changed = [
                f"{f} {source}={_show(mine.get(f))} {LOG}={_show(theirs.get(f))}"
                for f in fields
                if mine.get(f) != theirs.get(f)
            ]
            if not changed:
                continue
            line = f"{what} {name}: " + ", ".join(changed)
        out.append((f"{what}\0{key}", line))
    return out


def view_differences(source: str, got: ViewRecords, want: ViewRecords) -> list[str]:
    """Every session, subscription and retained message that differs."""
    lines = [
        *_entries("session", source, got.sessions, want.sessions),
        *_entries("subscription", source, got.subscriptions, want.subscriptions),
        *_entries("retained", source, got.retained, want.retained),
    ]
    return [line for _, line in sorted(lines)]


def route_differences(
    source: str, got: Mapping[str, Mapping[str, int]], want: Mapping[str, Mapping[str, int]]
) -> list[str]:
    flat_got = {(f, n): c for f, per in got.items() for n, c in per.items()}
    flat_want = {(f, n): c for f, per in want.items() for n, c in per.items()}
    lines = []
    for filter_, node in sorted(set(flat_got) | set(flat_want)):
        mine, theirs = flat_got.get((filter_, node), 0), flat_want.get((filter_, node), 0)
        if mine != theirs:
            lines.append(
                f"route {_show(filter_)} on node {_show(node)}: "
                f"{source} {mine} subscriptions, {LOG} {theirs}"
            )
    return lines


def table_differences(
    table: Iterable[tuple[str, str]], subscriptions: Iterable[tuple[str, str]]
) -> list[str]:
    """A node's routing trie against the log's subscriptions (keys only)."""
    got, want = set(table), set(subscriptions)
    lines = [
        f"routing table {_show(c)} {_show(f)}: missing; the {LOG} has that subscription"
        for c, f in sorted(want - got)
    ]
    lines += [
        f"routing table {_show(c)} {_show(f)}: not a subscription in the {LOG}"
        for c, f in sorted(got - want)
    ]
    return lines


def records_behind(at: Positions, end: Positions) -> int:
    """Records between `at` and `end`, counting only where `at` is behind."""
    return sum(max(0, n - at.get(tp, 0)) for tp, n in end.items())


def position_differences(at: Positions, end: Positions) -> list[str]:
    """A source's log positions against where the replay ended."""
    lines = []
    behind, ahead = records_behind(at, end), records_behind(end, at)
    if behind:
        lines.append(f"lags the {LOG} by {_records(behind)}")
    if ahead:
        lines.append(f"claims {_records(ahead)} beyond the end of the {LOG}")
    return lines


def _records(n: int) -> str:
    return f"{n} record{'s' if n != 1 else ''}"


def in_step(at: Positions, end: Positions) -> bool:
    return not records_behind(at, end) and not records_behind(end, at)
