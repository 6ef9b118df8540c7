"""bench.aclfile: the N-rule ACL file for `weir bench` against a node with an ACL."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import aclfile
from services.auth.aclfile import read


def test_writes_n_rules_the_node_reads(tmp_path: Path) -> None:
    out = tmp_path / "acl.toml"
    assert aclfile.main([str(out), "--rules", "25"]) == 0
    assert len(read(out)) == 25


@pytest.mark.parametrize("argv", [["--help"], [], ["f.toml", "--rules", "0"], ["f.toml", "x"]])
def test_bad_arguments_exit_2_and_write_nothing(
    argv: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exc:
        aclfile.main(argv)
    assert exc.value.code == (0 if argv == ["--help"] else 2)
    assert list(tmp_path.iterdir()) == []  # "--help" used to be written as a file
