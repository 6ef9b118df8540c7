"""Run `weir bench` (python -m services bench) as a subprocess and parse its JSON lines."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any


def bench(*args: str) -> list[dict[str, Any]]:
    """The JSON lines of one bounded `weir bench` run, which must exit 0 and print no errors."""
    result = subprocess.run(
        [sys.executable, "-m", "services", "bench", *args],
        check=False,
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    return [json.loads(line) for line in result.stdout.splitlines()]
