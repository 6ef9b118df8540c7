"""The state store's key layout has one home (services.state.keys); the
Lua script that writes it names its KEYS by number, so its header must list
them in the same order."""

from __future__ import annotations

import re
from importlib import resources

from services.state.keys import STATE_KEYS, live_keys, reseed_key, state_keys


def test_state_apply_lua_lists_its_keys_in_state_keys_order() -> None:
    script = resources.files("streams").joinpath("scripts/state_apply.lua").read_text()
    header = script[script.index("-- KEYS") : script.index("-- ARGV")]
    listed = re.findall(r"^--\s+(\d+) (\w+)\s", header, flags=re.MULTILINE)
    assert [int(n) for n, _ in listed] == list(range(1, len(STATE_KEYS) + 1))
    assert tuple(name for _, name in listed) == STATE_KEYS


def test_every_key_shares_one_hash_tag() -> None:
    keys = [*state_keys("p."), *state_keys("p.").values(), reseed_key("p."), *live_keys("p.")]
    tagged = [k for k in keys if k.startswith("{p.state}:")]
    assert list(state_keys("p.")) == list(STATE_KEYS)
    assert len(tagged) == len(STATE_KEYS) + 3
