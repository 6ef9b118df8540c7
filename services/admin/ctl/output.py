"""How `weir ctl` shows an answer: a rich table in a terminal, `--json` for scripts.

`--json` prints the API's answer as it came (a list answer keeps its
`{"data", "meta"}`), so a script reads the same fields the API documents.
Otherwise lists are tables of chosen columns and single records two-column
tables; a piped table is as wide as it needs (no wrapping at 80 columns).
Values are shown as text: booleans as yes/no, None as "-", lists joined.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from typing import Any, Final

from rich import box
from rich.console import Console
from rich.table import Table

PIPE_WIDTH: Final = 250  # characters: a table written to a file or a pipe is not cut


Column = tuple[str, str]  # (field of the answer, header)


class Out:
    def __init__(self, as_json: bool) -> None:
        self.as_json = as_json
        terminal = sys.stdout.isatty()
        self.console = Console(width=None if terminal else PIPE_WIDTH, highlight=False,
                               soft_wrap=not terminal)  # fmt: skip

    def json(self, doc: Any) -> None:
        print(json.dumps(doc, indent=2, ensure_ascii=False))

    def rows(self, answer: Any, columns: Sequence[Column], title: str = "") -> None:
        """A list answer: paged (`{"data", "meta"}`) or a plain list."""
        if self.as_json:
            self.json(answer)
            return
        paged = isinstance(answer, dict) and "data" in answer
        items: list[dict[str, Any]] = answer["data"] if paged else list(answer or [])
        if not items:
            self.console.print(f"(no {title or 'items'})")
        else:
            table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
            for _, header in columns:
                table.add_column(header, overflow="fold")
            for item in items:
                table.add_row(*(text(item.get(field)) for field, _ in columns))
            self.console.print(table)
        if paged:
            meta = answer.get("meta", {})
            page, limit, count = meta.get("page", 1), meta.get("limit", 0), meta.get("count")
            more = f"; --page {page + 1} for more" if meta.get("hasnext") else ""
            if count is not None and (page > 1 or meta.get("hasnext")):
                self.console.print(f"page {page} ({limit} per page) of {count:,}{more}")
            elif count is not None:
                self.console.print(f"{count:,} in all")

    def record(self, doc: Any, skip: Sequence[str] = ()) -> None:
        """One object as field / value lines."""
        if self.as_json:
            self.json(doc)
            return
        table = Table(box=None, show_header=False, pad_edge=False)
        table.add_column(style="bold")
        table.add_column(overflow="fold")
        for field, value in doc.items():
            if field not in skip:
                table.add_row(field, text(value))
        self.console.print(table)

    def done(self, message: str, doc: Any = None) -> None:
        """A write's outcome: its answer under --json (`{}` for an empty one), else a line."""
        if self.as_json:
            self.json(doc if doc is not None else {})
        else:
            self.console.print(message)


def text(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int | float):
        return f"{value:,}" if abs(value) >= 10_000 else str(value)
    if isinstance(value, list):
        return ", ".join(text(v) for v in value) or "-"
    if isinstance(value, dict):
        return ", ".join(f"{k}={text(v)}" for k, v in value.items()) or "-"
    return str(value)
