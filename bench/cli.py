"""`weir bench` (being built: issue 2)."""

from __future__ import annotations

import sys
from collections.abc import Sequence


def main(argv: Sequence[str]) -> int:
    print("weir bench: the load generator is not built yet", file=sys.stderr)
    return 1
