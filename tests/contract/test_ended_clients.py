"""EndedClients (services.state.ended) against a dict model: random adds,
removals by id, removals of the oldest and look-ups, with the buffers cut
and rebuilt often (a small SLACK) and ids that are not ASCII."""

from __future__ import annotations

import random

import pytest

from services.state import ended
from services.state.ended import EndedClients


@pytest.mark.parametrize("seed", range(60))
def test_the_table_answers_as_a_dict_in_end_order(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ended, "SLACK", 8)
    rnd = random.Random(seed)
    table = EndedClients()
    model: dict[str, tuple[int, int, int]] = {}  # id -> (version, floor, seq)
    seq = 0
    ids = 60 if seed % 2 else 3000  # few ids: the same ones come and go; many: mostly new
    for _ in range(rnd.choice([40, 400, 2500])):
        client_id = f"c{rnd.randrange(ids)}" + ("é" if rnd.random() < 0.1 else "")
        op = rnd.random()
        if op < 0.55:
            if client_id not in model:
                seq += 1
                version, floor = rnd.randrange(1 << 40), rnd.randrange(1 << 40)
                table.add(client_id, version, floor, seq)
                model[client_id] = (version, floor, seq)
        elif op < 0.8:
            expected = model.pop(client_id, None)
            assert table.pop(client_id) == (None if expected is None else expected[:2])
        elif op < 0.95:
            if not model:
                assert table.oldest_seq() is None
                continue
            oldest = min(model, key=lambda c: model[c][2])
            assert table.oldest_seq() == model[oldest][2]
            assert table.pop_oldest() == (oldest, model.pop(oldest)[0])
        else:
            held = model.get(client_id)
            assert (client_id in table) == (held is not None)
            assert table.get(client_id) == (None if held is None else held[:2])
        assert len(table) == len(model)
    in_order = sorted(model, key=lambda c: model[c][2])
    assert list(table.clients()) == [(c, *model[c][:2]) for c in in_order]


def test_an_empty_table() -> None:
    table = EndedClients()
    assert len(table) == 0 and "x" not in table and table.get("x") is None
    assert table.pop("x") is None and table.oldest_seq() is None
    with pytest.raises(KeyError):
        table.pop_oldest()
