"""The hook chain: order, values, stopping, failures; plugins load and unload."""

from __future__ import annotations

from typing import Any

import pytest

from services.hooks.api import CONTINUE, HOOK_POINTS, STOP, Continue, Hooks, Stop
from services.hooks.plugins import Plugins


def test_hook_points_are_designs_nineteen() -> None:
    assert len(HOOK_POINTS) == 19 and len(set(HOOK_POINTS)) == 19
    assert "message.publish" in HOOK_POINTS and "client.authenticate" in HOOK_POINTS


def test_callbacks_run_by_priority_then_in_order_added() -> None:
    hooks, seen = Hooks(), []
    hooks.add("client.connected", lambda c: seen.append(("low", c)), priority=-1)
    hooks.add("client.connected", lambda c: seen.append(("first", c)))
    hooks.add("client.connected", lambda c: seen.append(("second", c)))
    hooks.add("client.connected", lambda c: seen.append(("high", c)), priority=5)
    hooks.run("client.connected", "c1")
    assert seen == [("high", "c1"), ("first", "c1"), ("second", "c1"), ("low", "c1")]


def test_fold_replaces_and_stops() -> None:
    hooks = Hooks()
    hooks.add("message.publish", lambda who, m: Continue(m + "+a"), priority=2)
    hooks.add("message.publish", lambda who, m: CONTINUE, priority=1)
    hooks.add("message.publish", lambda who, m: Stop(m + "+stop"))
    hooks.add("message.publish", lambda who, m: Continue("never"), priority=-1)
    assert hooks.fold("message.publish", "m", "client") == "m+a+stop"
    hooks2 = Hooks()
    hooks2.add("message.publish", lambda who, m: STOP)
    hooks2.add("message.publish", lambda who, m: Continue("never"), priority=-1)
    assert hooks2.fold("message.publish", "m", "client") == "m"
    assert Hooks().fold("message.publish", "untouched", "client") == "untouched"


def test_a_failing_callback_is_skipped(caplog: pytest.LogCaptureFixture) -> None:
    hooks, seen = Hooks(), []

    def broken(client: str) -> None:
        raise RuntimeError("plugin bug")

    hooks.add("client.disconnected", broken, priority=1)
    hooks.add("client.disconnected", seen.append)
    hooks.run("client.disconnected", "c1")
    assert seen == ["c1"]
    assert "plugin bug" in caplog.text


def test_unknown_points_fail_loudly() -> None:
    with pytest.raises(ValueError, match=r"unknown hook point 'client\.teleported'"):
        Hooks().add("client.teleported", print)


def test_remove_and_has() -> None:
    hooks = Hooks()
    hooks.add("session.created", print)
    assert hooks.has("session.created")
    assert hooks.remove("session.created", print)
    assert not hooks.has("session.created")
    assert not hooks.remove("session.created", print)


class _Plugin:
    def __init__(self) -> None:
        self.seen: list[Any] = []

    def register(self, hooks: Hooks) -> None:
        hooks.add("session.created", self.seen.append)
        hooks.add("message.publish", lambda who, m: Continue(m.upper()))


def test_plugins_load_list_and_unload() -> None:
    hooks = Hooks()
    plugins = Plugins(hooks)
    plugin = _Plugin()
    plugins.load("upper", plugin)
    assert plugins.names() == ["upper"]
    hooks.run("session.created", "c1")
    assert plugin.seen == ["c1"]
    assert hooks.fold("message.publish", "abc", None) == "ABC"
    with pytest.raises(ValueError, match="loaded already"):
        plugins.load("upper", plugin)
    plugins.unload("upper")
    assert plugins.names() == []
    assert not hooks.has("session.created") and not hooks.has("message.publish")
    with pytest.raises(ValueError, match="no plugin 'upper'"):
        plugins.unload("upper")


def test_discover_finds_nothing_in_an_empty_group() -> None:
    assert Plugins(Hooks()).discover("weir.plugins.none-installed") == []
