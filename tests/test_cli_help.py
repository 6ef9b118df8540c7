"""Every `weir` command answers --help with exit 0, and `weir --version` works."""

from __future__ import annotations

import pytest

from services.__main__ import main

COMMANDS = [
    [], ["up"], ["drain"], ["bench"], ["streams"], ["streams", "run"], ["streams", "verify"],
    ["report"], ["passwd"], ["ban"], ["ban", "add"], ["ban", "list"], ["ban", "del"],
    ["config"], ["config", "show"], ["config", "check"], ["config", "example"],
]  # fmt: skip


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: " ".join(c) or "weir")
def test_help_exits_0(command: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*command, "--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"Usage: weir {' '.join(command)}".rstrip()), out


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.startswith("weir 0.")


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["frobnicate"], "weir: unknown command 'frobnicate'"),
        (["streams", "frob"], "weir streams: unknown command 'frob'"),
        (["ban", "add", "--clientid"], "weir ban add: Option '--clientid' requires an argument"),
        (["up", "--queue-full", "sometimes"], "weir up: --queue-full: bad value 'sometimes'"),
        (["config", "check"], "weir config check: Missing argument 'FILE'"),
    ],
)
def test_bad_arguments_are_one_line_and_exit_2(
    argv: list[str], needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(needle), err
