"""Log lines: JSON with the client's fields off a terminal, readable on one,
the same line rate-limited, the level changeable at run time."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator

import pytest

from services import logs


@pytest.fixture
def restore_root() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


def test_json_lines_carry_the_client_fields(restore_root: None) -> None:
    out = io.StringIO()  # not a terminal: JSON
    logs.setup("info", node_id="n1", stream=out)
    log = logging.getLogger("weir.test")
    log.warning("refused %s", "c1", extra=logs.client_fields("c1", "alice", "127.0.0.1:5"))
    logs.ClientLog(log, logs.client_fields("c2", None, "127.0.0.1:6")).info("hello")
    log.info("about nobody")
    first, second, third = (json.loads(line) for line in out.getvalue().splitlines())
    assert {k: first[k] for k in ("level", "logger", "msg")} == {
        "level": "warning", "logger": "weir.test", "msg": "refused c1"}
    assert (first["client_id"], first["user"], first["peer"], first["node"]) == (
        "c1", "alice", "127.0.0.1:5", "n1")
    assert (second["client_id"], second["peer"], second["node"]) == ("c2", "127.0.0.1:6", "n1")
    assert "user" not in second  # None: left out
    assert "client_id" not in third


def test_readable_lines_on_a_terminal(restore_root: None) -> None:
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    out = Tty()
    logs.setup("info", node_id="n1", stream=out)
    logging.getLogger("weir.test").warning("x", extra=logs.client_fields("c1", "u", "p"))
    assert out.getvalue().rstrip().endswith("WARNING weir.test: x [client_id=c1 user=u "
                                            "peer=p node=n1]")  # fmt: skip


def test_the_same_line_is_rate_limited(restore_root: None) -> None:
    out = io.StringIO()
    logs.setup("info", stream=out)
    log = logging.getLogger("weir.test")

    def warn(i: int) -> None:
        log.warning("hook failed %d", i)  # one call site, one template

    for i in range(5):
        warn(i)
    lines = out.getvalue().splitlines()
    assert [json.loads(line)["msg"] for line in lines] == ["hook failed 0"]
    limit = logging.getLogger().handlers[-1].filters[0]
    assert isinstance(limit, logs.RateLimit)
    limit.window_s = 0.0  # the window passed: the next line says what was held back
    warn(5)
    assert json.loads(out.getvalue().splitlines()[-1])["msg"] == (
        "hook failed 5 (4 like it suppressed)")


def test_a_gated_line_is_made_once_per_window_and_tells_what_it_held_back() -> None:
    gate = logs.Gate()
    made = [f"line {i}{gate.held()}" for i in range(5) if gate.due()]
    assert made == ["line 0"]  # the others were not made at all
    gate.window_s = 0.0
    gate._until = 0.0  # the window passed
    assert gate.due() and gate.held() == " (4 like it suppressed)"
    assert gate.due() and gate.held() == ""


def test_the_level_changes_at_run_time(restore_root: None) -> None:
    out = io.StringIO()
    logs.setup("warning", stream=out)
    log = logging.getLogger("weir.test.level")
    log.info("hidden")
    logs.set_level("debug")
    log.debug("shown")
    assert [json.loads(line)["msg"] for line in out.getvalue().splitlines()] == ["shown"]
