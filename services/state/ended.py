"""Ended clients' versions (`ClusterView` rule 4) in a few flat buffers.

A client whose session ended leaves its versions in the view (its session
version and its subscriptions' floor), there to refuse its own late events,
until `keep_ended` other clients ended after it. Held as dict entries and
objects, that was four small objects per departed client (its client id
string, a `ClientSubs`, an OrderedDict node, the version int), made while
its connection's memory was being freed, in the holes it left: a few of
them in every page kept the allocator from handing the pages of 19,000
departed connections back to the system (README, "Memory after
departures"). Here an ended client is bytes in a bytearray and integers in
`array`s, which grow by reallocation in large blocks: no Python object per
client.

Layout. Entries have absolute numbers in the order they were added (the
order the clients ended); entry `e` sits at position `e - _base` of the
arrays: `_hashes` (the client id's `hash`), `_versions`, `_floors` and
`_seqs` (the view's end sequence number, REMOVED once the entry is taken
out); its client id's UTF-8 bytes run from `_starts[pos]` to
`_starts[pos + 1]`, offsets into the whole byte stream of which `_ids`
holds the part from `_ids_base` on. `_index` is an open-addressing table
(linear probing, at most half full) of entry numbers + 1, 0 an empty slot;
an entry taken out leaves no tombstone (the entries after it in its run
shift back). Entries taken out at the front are cut off once they are
many; once more entries are out than in anywhere, the buffers are rebuilt
with the live ones: the memory held stays within about twice what the live
entries need.

`Ended` is rule 4's bookkeeping as a whole: every ended client in the order
it ended, those that still hold more than their versions by name (the view
looks at their state) and the others in an `EndedClients` table, one end
sequence number across both.
"""

from __future__ import annotations

from array import array
from collections import OrderedDict
from collections.abc import Iterator
from typing import Final

REMOVED: Final = -1  # a `_seqs` value: the entry was taken out
MIN_SLOTS: Final = 16
SLACK: Final = 4096  # entries out before the buffers are cut or rebuilt, at least


class EndedClients:
    """Client id -> (version, floor), oldest first, without an object per
    client. A look-up is a probe in Python, about a microsecond."""

    __slots__ = ("_base", "_floors", "_hashes", "_head", "_ids", "_ids_base", "_index",
                 "_seqs", "_starts", "_versions", "size")  # fmt: skip

    def __init__(self) -> None:
        self._reset(MIN_SLOTS)

    def _reset(self, slots: int) -> None:
        self.size = 0  # live entries (an attribute: the view asks before each look-up)
        self._ids = bytearray()
        self._ids_base = 0
        self._starts = array("q", [0])
        self._hashes = array("q")
        self._versions = array("q")
        self._floors = array("q")
        self._seqs = array("q")
        self._base = 0  # the number of the entry at position 0
        self._head = 0  # positions before it are out
        self._index = array("q", bytes(8 * slots))

    def __len__(self) -> int:
        return self.size

    def __contains__(self, client_id: object) -> bool:
        return isinstance(client_id, str) and self._slot(client_id) >= 0

    def add(self, client_id: str, version: int, floor: int, seq: int) -> None:
        """Append an ended client that is not held (`seq` above every one held)."""
        if (self.size + 1) * 2 > len(self._index):
            self._rehash(2 * len(self._index))
        data = client_id.encode()
        self._ids += data
        self._starts.append(self._starts[-1] + len(data))
        code = hash(client_id)
        self._hashes.append(code)
        self._versions.append(version)
        self._floors.append(floor)
        self._seqs.append(seq)
        self._place(code, self._base + len(self._seqs) - 1)
        self.size += 1

    def get(self, client_id: str) -> tuple[int, int] | None:
        """A client's (version, floor), or None if it is not held."""
        slot = self._slot(client_id)
        if slot < 0:
            return None
        pos = self._index[slot] - 1 - self._base
        return self._versions[pos], self._floors[pos]

    def pop(self, client_id: str) -> tuple[int, int] | None:
        """Take a client out: (version, floor), or None if it is not held."""
        slot = self._slot(client_id)
        if slot < 0:
            return None
        pos = self._index[slot] - 1 - self._base
        held = self._versions[pos], self._floors[pos]
        self._take(slot, pos)
        return held

    def oldest_seq(self) -> int | None:
        """The end sequence number of the longest-ended client held."""
        pos = self._first()
        return None if pos < 0 else self._seqs[pos]

    def pop_oldest(self) -> tuple[str, int]:
        """Take the longest-ended client out: (client id, version)."""
        pos = self._first()
        if pos < 0:
            raise KeyError("no ended client held")
        client_id, version = self._client(pos), self._versions[pos]
        index = self._index
        mask = len(index) - 1
        slot = self._hashes[pos] & mask
        while index[slot] != self._base + pos + 1:
            slot = (slot + 1) & mask
        self._take(slot, pos)
        return client_id, version

    def clients(self) -> Iterator[tuple[str, int, int]]:
        """(client id, version, floor) of each client held, oldest first."""
        for _, held in self._positions():
            yield held

    # -- the buffers ---------------------------------------------------------------

    def _key(self, pos: int) -> bytearray:
        base = self._ids_base
        return self._ids[self._starts[pos] - base : self._starts[pos + 1] - base]

    def _client(self, pos: int) -> str:
        return self._key(pos).decode()

    def _first(self) -> int:
        seqs = self._seqs
        head = self._head
        while head < len(seqs) and seqs[head] == REMOVED:
            head += 1
        self._head = head
        return head if head < len(seqs) else -1

    def _slot(self, client_id: str) -> int:
        """The `_index` slot of `client_id`'s entry, or -1."""
        if not self.size:
            return -1
        code = hash(client_id)
        index = self._index
        mask = len(index) - 1
        slot = code & mask
        while held := index[slot]:
            pos = held - 1 - self._base
            if self._hashes[pos] == code and self._key(pos) == client_id.encode():
                return slot
            slot = (slot + 1) & mask
        return -1

    def _place(self, code: int, entry: int) -> None:
        index = self._index
        mask = len(index) - 1
        slot = code & mask
        while index[slot]:
            slot = (slot + 1) & mask
        index[slot] = entry + 1

    def _take(self, slot: int, pos: int) -> None:
        self._seqs[pos] = REMOVED
        self.size -= 1
        self._unplace(slot)
        if not self.size:
            self._reset(MIN_SLOTS)
            return
        out = len(self._seqs) - self.size
        if out > max(self.size, SLACK):
            if self._first() < out // 2:  # out mostly in the middle: rebuild
                self._rebuild()
            else:
                self._cut()

    def _unplace(self, slot: int) -> None:
        """Empty `slot`, shifting back the entries after it in its run that may
        sit there (so that no probe stops early)."""
        index = self._index
        hashes = self._hashes
        mask = len(index) - 1
        hole = slot
        probe = slot
        while True:
            probe = (probe + 1) & mask
            held = index[probe]
            if not held:
                break
            home = hashes[held - 1 - self._base] & mask
            if (probe - home) & mask >= (probe - hole) & mask:
                index[hole] = held
                hole = probe
        index[hole] = 0

    def _cut(self) -> None:
        """Drop the positions before the first live entry (they are all out)."""
        head = self._first()
        start = self._starts[head]
        del self._ids[: start - self._ids_base]
        self._ids_base = start
        del self._starts[:head]
        for column in (self._hashes, self._versions, self._floors, self._seqs):
            del column[:head]
        self._base += head
        self._head = 0

    def _rehash(self, slots: int) -> None:
        self._index = array("q", bytes(8 * slots))
        for pos in range(self._head, len(self._seqs)):
            if self._seqs[pos] != REMOVED:
                self._place(self._hashes[pos], self._base + pos)

    def _rebuild(self) -> None:
        """The live entries only, in their order."""
        live = [(client_id, version, floor, self._seqs[pos])
                for pos, (client_id, version, floor) in self._positions()]  # fmt: skip
        slots = MIN_SLOTS
        while slots < 4 * (len(live) + 1):
            slots *= 2
        self._reset(slots)
        for client_id, version, floor, seq in live:
            self.add(client_id, version, floor, seq)

    def _positions(self) -> Iterator[tuple[int, tuple[str, int, int]]]:
        for pos in range(self._head, len(self._seqs)):
            if self._seqs[pos] != REMOVED:
                yield pos, (self._client(pos), self._versions[pos], self._floors[pos])


class Ended:
    """Ended clients, longest-ended first: named (with their end numbers) while
    they hold more than their versions, else in the flat table (`retire`)."""

    __slots__ = ("_flat", "_named", "_seq")

    def __init__(self) -> None:
        self._named: OrderedDict[str, int] = OrderedDict()
        self._flat = EndedClients()
        self._seq = 0

    def __len__(self) -> int:
        return len(self._named) + self._flat.size

    def __contains__(self, client_id: object) -> bool:
        """Named (not retired) and ended."""
        return client_id in self._named

    @property
    def retired(self) -> int:
        """How many are in the flat table (the view asks before each look-up)."""
        return self._flat.size

    def end(self, client_id: str) -> None:
        """The client ended now (or shows a sign of life after its end)."""
        self._seq += 1
        self._named[client_id] = self._seq
        self._named.move_to_end(client_id)

    def discard(self, client_id: str) -> None:
        """Named and back: not ended any more."""
        self._named.pop(client_id, None)

    def get(self, client_id: str) -> tuple[int, int] | None:
        """A retired client's (version, floor)."""
        return self._flat.get(client_id)

    def retire(self, client_id: str, version: int, floor: int) -> None:
        """A named client whose only state now is its versions, into the table."""
        del self._named[client_id]
        self._seq += 1  # above every number the table holds: it stays in order
        self._flat.add(client_id, version, floor, self._seq)

    def back(self, client_id: str) -> tuple[int, int] | None:
        """A retired client out of the table, named again as ended now: its
        (version, floor) for the view's dicts; None if it is not retired."""
        held = self._flat.pop(client_id)
        if held is not None:
            self.end(client_id)
        return held

    def pop_oldest(self) -> tuple[str, int | None]:
        """The longest-ended client taken out: (client id, version) if it was
        retired, (client id, None) if named (the view looks at its state)."""
        oldest = self._flat.oldest_seq()
        named = self._named
        if oldest is not None and (not named or oldest < next(iter(named.values()))):
            return self._flat.pop_oldest()
        client_id, _ = named.popitem(last=False)
        return client_id, None

    def retired_clients(self) -> Iterator[tuple[str, int, int]]:
        """(client id, version, floor) of each retired client, oldest first."""
        return self._flat.clients()
