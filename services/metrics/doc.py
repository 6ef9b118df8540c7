"""The README's list of metric families, made from their declarations.

`python -m services.metrics.doc README.md` rewrites the lines between
`<!-- metrics:begin -->` and `<!-- metrics:end -->`; a test keeps the
README in step with `services.metrics.registry`.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Final

from services.metrics.registry import FAMILIES

BEGIN: Final = "<!-- metrics:begin -->"
END: Final = "<!-- metrics:end -->"


def table() -> str:
    rows = ["| name | type | labels | meaning |", "|---|---|---|---|"]
    for f in FAMILIES:
        name = f.name + ("_total" if f.kind == "counter" else "")
        labels = f"`{f.label}`: " + ", ".join(f"`{v}`" for v in f.values) if f.label else ""
        rows.append(f"| `{name}` | {f.kind} | {labels} | {f.help} |")
    return "\n".join(rows)


def block(text: str) -> str:
    """What `text` holds between the markers (ValueError without them)."""
    start, end = text.index(BEGIN) + len(BEGIN), text.index(END)
    return text[start:end].strip("\n")


def rewrite(text: str) -> str:
    start, end = text.index(BEGIN) + len(BEGIN), text.index(END)
    return f"{text[:start]}\n{table()}\n{text[end:]}"


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m services.metrics.doc README.md", file=sys.stderr)
        return 2
    path = Path(argv[0])
    try:
        path.write_text(rewrite(path.read_text(encoding="utf-8")), encoding="utf-8")
    except (OSError, ValueError) as exc:
        print(f"services.metrics.doc: {path}: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
