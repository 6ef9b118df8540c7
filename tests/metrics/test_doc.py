"""The README's metric list is the declarations' (services.metrics.doc)."""

from __future__ import annotations

from pathlib import Path

from services.metrics.doc import BEGIN, END, block, main, rewrite, table
from services.metrics.registry import FAMILIES

README = Path(__file__).resolve().parents[2] / "README.md"


def test_the_readme_lists_every_family_as_declared() -> None:
    assert block(README.read_text(encoding="utf-8")) == table(), (
        "README.md's metric list is stale: python -m services.metrics.doc README.md"
    )
    assert table().count("\n| `weir_") == len(FAMILIES)


def test_rewrite_replaces_only_the_block(tmp_path: Path) -> None:
    path = tmp_path / "R.md"
    path.write_text(f"before\n{BEGIN}\nold\n{END}\nafter\n", encoding="utf-8")
    assert main([str(path)]) == 0
    text = path.read_text(encoding="utf-8")
    assert text.startswith("before\n") and text.endswith(f"{END}\nafter\n")
    assert block(text) == table() and rewrite(text) == text


def test_a_file_without_the_markers_is_one_line(tmp_path: Path, capsys: object) -> None:
    path = tmp_path / "R.md"
    path.write_text("no markers\n", encoding="utf-8")
    assert main([str(path)]) == 1
    assert main([]) == 2
