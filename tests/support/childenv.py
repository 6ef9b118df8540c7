"""The environment of a `weir` process a test starts."""

from __future__ import annotations

import os


def weir_env() -> dict[str, str]:
    """Ours without WEIR_* (they would change the process's settings), but with
    a free HTTP port: two nodes of one test, or of test runs side by side,
    never meet on 18083."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("WEIR_")}
    env["WEIR_HTTP_PORT"] = "0"
    return env
