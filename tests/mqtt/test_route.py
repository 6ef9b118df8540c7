"""`Route` is a hand-written (compiled) class, not a `@value` record: it still
compares, hashes, prints and matches as the records do, pure and compiled."""

from __future__ import annotations

from services.mqtt.actions import Route
from services.mqtt.packets import Message

M = Message("t/1", b"x", qos=1)


def test_equal_by_fields_and_hashed_alike() -> None:
    assert Route(M, 3) == Route(Message("t/1", b"x", qos=1), 3, None)
    assert hash(Route(M, 3)) == hash(Route(M, 3))
    assert Route(M, 3) != Route(M, 4)
    assert Route(M, 3, 9) != Route(M, 3)
    assert Route(M) != M  # another type: never equal
    assert len({Route(M, 3), Route(M, 3), Route(M)}) == 2


def test_repr_names_its_fields() -> None:
    assert repr(Route(M, 3)) == f"Route(message={M!r}, token=3, qos2_packet_id=None)"


def test_matches_by_position_and_keyword() -> None:
    match Route(M, 5, 7):
        case Route(message, token, qos2_packet_id=pid):
            assert (message, token, pid) == (M, 5, 7)
        case _:
            raise AssertionError("no match")
