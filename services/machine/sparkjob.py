"""`weir up --spark`: the state-store Spark job beside the embedded default.

Theory of operation. After the node is ready (it has loaded the state
store and, after an embedded Kafka restart, re-seeded the log from it),
`start` runs `python -m streams run state` as a child process on the same
Redis and Kafka, with its checkpoint under the data dir and its output in
`<data dir>/streams/state.log`. `stop` comes after the node has stopped, so
the node's last events (its sessions' closes) are in the log: SIGTERM makes
the job fold what the log holds, then exit; past the bound it is killed
(the store then lags, and a restart of the embedded Kafka loses those last
events; real Kafka keeps them and the job catches up when it runs again).
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
from pathlib import Path
from typing import Final

from services.config import Settings
from services.embedded.process import child_options

STOP_TIMEOUT_S: Final = 120.0  # the final fold: a Spark batch over what is left, plus shutdown


def log_path(settings: Settings) -> Path:
    return Path(settings.data_dir).resolve() / "streams" / "state.log"


def start(settings: Settings, redis_url: str, bootstrap: str) -> subprocess.Popen[bytes]:
    path = log_path(settings)
    path.parent.mkdir(parents=True, exist_ok=True)
    args = [
        sys.executable, "-m", "streams", "run", "state",
        "--redis", redis_url, "--kafka", bootstrap,
        "--data-dir", str(Path(settings.data_dir).resolve()),
        "--kafka-topic-prefix", settings.kafka_topic_prefix,
    ]  # fmt: skip
    with path.open("ab") as out:
        # If `weir up` dies, even by SIGKILL, the job gets SIGTERM: it folds what it can.
        return subprocess.Popen(
            args, stdout=out, stderr=subprocess.STDOUT, **child_options(signal.SIGTERM)
        )


def stop(proc: subprocess.Popen[bytes], timeout_s: float = STOP_TIMEOUT_S) -> int | None:
    """SIGTERM, wait for the final fold (bounded), then kill; the exit code."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        proc.wait()
        return None
