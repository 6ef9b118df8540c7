"""Run `weir bench` (python -m services bench) as a subprocess and parse its JSON lines."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from typing import Any

# Not a terminal: a plain progress line every few seconds (services.cli.Progress)
PROGRESS = re.compile(r"weir bench: messages received: [\d,]+( of [\d,]+)?")


def bench(*args: str) -> list[dict[str, Any]]:
    """The JSON lines of one bounded `weir bench` run, which must exit 0 and print no
    errors (progress lines aside)."""
    result = subprocess.run(
        [sys.executable, "-m", "services", "bench", *args],
        check=False,
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert result.returncode == 0, result.stderr
    errors = [line for line in result.stderr.splitlines() if not PROGRESS.fullmatch(line)]
    assert errors == [], result.stderr
    return [json.loads(line) for line in result.stdout.splitlines()]
