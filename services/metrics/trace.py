"""Per-client and per-topic packet traces (EMQX's trace), on demand and bounded.

Theory of operation. `Tracer` is one object per node (the node builds it
and hands it to the broker; the management API calls its methods). A trace
is started with a name, a kind and a value:

- `clientid`: every packet of that client id, both directions (CONNECT,
  CONNACK, SUBSCRIBE, PUBLISH, PUBACK, PINGREQ, DISCONNECT, ...);
- `topic`: every PUBLISH, in or out, whose topic the value (a topic
  filter) matches. A 5.0 PUBLISH that names its topic by alias only is
  matched on the topic the alias stands for on its connection (the
  connection passes its channel's `aliased_topic`), and its line says it
  (`alias_topic`).

Each trace writes JSON lines to `<directory>/<name>.log` (the node's data
dir, `trace/`): `ts` (UTC, microseconds), `node`, `dir` (`in`: from the
client, `out`: to it), `clientid`, `peer`, `packet` (the type's name) and
`fields` (the decoded packet: payloads as UTF-8 text, bytes that are not
as `\\x..` escapes, cut at `payload_bytes`; passwords and authentication
data are never written). A trace ends by itself at `duration_s` after its
start (a loop timer), or when its file reaches `max_bytes` (the record
that would pass the bound is not written), or by `stop`; its file stays
until `delete`. Lines are buffered and flushed every FLUSH_S while any trace
runs, and at once by `stop`, `path` and `read`.

Cost when nothing is traced: the connection checks `tracer.on` (one
attribute) per packet read and per packet written, and calls nothing. With
a trace running, every packet costs one call here: a dict look-up by client
id, and a filter match per topic trace for a PUBLISH.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Final, Literal

from services.mqtt import codec
from services.mqtt.errors import MQTTError
from services.mqtt.packets import Connect, Publish
from services.mqtt.topics import matches, validate_topic_filter

Aliased = Callable[[bool, int], str | None]  # Channel.aliased_topic: (inbound, alias)
Kind = Literal["clientid", "topic"]
KINDS: Final = ("clientid", "topic")
MAX_TRACES: Final = 30  # traces kept at once, running or ended (EMQX's limit)
MAX_DURATION_S: Final = 7 * 24 * 3600.0  # a week: a trace left running is still bounded
DEFAULT_DURATION_S: Final = 600.0  # EMQX's console default is minutes, not hours
DEFAULT_MAX_BYTES: Final = 64 * 1024 * 1024  # one trace's file; a hot topic fills it quickly
DEFAULT_PAYLOAD_BYTES: Final = 1024  # of each payload written; the size is always given
FLUSH_S: Final = 1.0  # a running trace's lines reach the file within this
READ_MAX: Final = 1024 * 1024  # bytes one `read` returns at most
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")  # a file name, nothing to escape
SECRET: Final = frozenset({"password", "authentication_data"})  # never written


class TraceError(ValueError):
    """A trace request that cannot be done; the message is one line for the user."""


@dataclass(frozen=True, slots=True)
class TraceInfo:
    """What `list` and `start` tell of one trace."""

    name: str
    kind: Kind
    value: str  # the client id, or the topic filter
    started_at: float  # seconds since the epoch
    ends_at: float  # when it stops by itself (seconds since the epoch)
    status: Literal["running", "stopped"]
    stopped_by: str | None  # "time", "size", "user", "node" (the node stopped), or None
    bytes: int  # written to its file so far
    path: str


class _Trace:
    __slots__ = ("file", "info", "limit", "payload_bytes", "size", "timer")

    def __init__(self, info: TraceInfo, file: IO[str], limit: int, payload_bytes: int,
                 timer: asyncio.TimerHandle) -> None:  # fmt: skip
        self.info = info
        self.file = file
        self.limit = limit
        self.payload_bytes = payload_bytes
        self.size = 0
        self.timer = timer


class Tracer:
    """The node's traces. Start, list, stop, delete and read them from the
    event loop's thread (the management API's handlers run there); `on` is
    the one attribute the connections check per packet.

    - `start(name, kind, value, duration_s, max_bytes, payload_bytes)`:
      a new running trace (`TraceError`: a bad or taken name, a bad kind,
      client id, filter or bound, MAX_TRACES already kept);
    - `list()`: every trace, running or ended, in start order;
    - `stop(name)`: end a running one now (its file stays);
    - `delete(name)`: end it if it runs and remove it and its file;
    - `path(name)`: its file, flushed (to download it whole);
    - `read(name, offset, limit)`: up to `limit` bytes of its file from `offset`;
    - `close()`: the node stops: every running trace ends (`stopped_by` "node").
    """

    def __init__(
        self,
        directory: Path,
        node: str,
        clock: Callable[[], float] | None = None,
    ) -> None:
        self.directory = directory
        self.node = node
        self._clock = clock
        self.on = False  # some trace runs: the connections call `received` / `sent`
        self._traces: dict[str, _Trace] = {}
        self._clients: dict[str, list[_Trace]] = {}  # running clientid traces by client id
        self._topics: list[_Trace] = []  # running topic traces
        self._flusher: asyncio.TimerHandle | None = None

    # -- the management side ------------------------------------------------------

    def start(
        self,
        name: str,
        kind: str,
        value: str,
        duration_s: float = DEFAULT_DURATION_S,
        max_bytes: int = DEFAULT_MAX_BYTES,
        payload_bytes: int = DEFAULT_PAYLOAD_BYTES,
    ) -> TraceInfo:
        self._check(name, kind, value, duration_s, max_bytes, payload_bytes)
        loop = asyncio.get_running_loop()
        self.directory.mkdir(parents=True, exist_ok=True)
        path = self.directory / f"{name}.log"
        file = path.open("w", encoding="utf-8")
        now = self._now()
        timer = loop.call_later(duration_s, self._end, name, "time")
        info = TraceInfo(name, kind, value, now, now + duration_s, "running", None, 0,  # type: ignore[arg-type]
                         str(path))  # fmt: skip
        trace = _Trace(info, file, max_bytes, payload_bytes, timer)
        self._traces[name] = trace
        if kind == "clientid":
            self._clients.setdefault(value, []).append(trace)
        else:
            self._topics.append(trace)
        self.on = True
        if self._flusher is None:
            self._flusher = loop.call_later(FLUSH_S, self._flush_all)
        return info

    def _check(self, name: str, kind: str, value: str, duration_s: float, max_bytes: int,
               payload_bytes: int) -> None:  # fmt: skip
        if not NAME.fullmatch(name):
            raise TraceError(f"trace name {name!r}: 1-64 letters, digits, '_', '.' or '-', "
                             "not starting with '.', '_' or '-'")  # fmt: skip
        if name in self._traces:
            raise TraceError(f"trace {name!r} exists (delete it first)")
        if kind not in KINDS:
            raise TraceError(f"trace kind {kind!r}: clientid or topic")
        if not value:
            raise TraceError(f"trace {name!r}: an empty {kind}")
        if kind == "topic":
            try:
                validate_topic_filter(value)
            except MQTTError as exc:
                raise TraceError(f"trace {name!r}: topic filter {value!r}: {exc}") from None
        if not 0 < duration_s <= MAX_DURATION_S:
            raise TraceError(f"trace {name!r}: duration {duration_s} s is not in "
                             f"(0, {MAX_DURATION_S:.0f}]")  # fmt: skip
        if max_bytes <= 0 or payload_bytes < 0:
            raise TraceError(f"trace {name!r}: max_bytes must be > 0, payload_bytes >= 0")
        if len(self._traces) >= MAX_TRACES:
            raise TraceError(f"{MAX_TRACES} traces kept already: delete one first")

    def list(self) -> list[TraceInfo]:
        return [self._info(t) for t in self._traces.values()]

    def get(self, name: str) -> TraceInfo:
        return self._info(self._trace(name))

    def stop(self, name: str) -> TraceInfo:
        trace = self._trace(name)
        self._end(name, "user")
        return self._info(trace)

    def delete(self, name: str) -> None:
        trace = self._trace(name)
        self._end(name, "user")
        del self._traces[name]
        Path(trace.info.path).unlink(missing_ok=True)

    def path(self, name: str) -> Path:
        trace = self._trace(name)
        if not trace.file.closed:
            trace.file.flush()
        return Path(trace.info.path)

    def read(self, name: str, offset: int = 0, limit: int = READ_MAX) -> bytes:
        with self.path(name).open("rb") as file:
            file.seek(max(0, offset))
            return file.read(max(0, min(limit, READ_MAX)))

    def close(self) -> None:
        for name in list(self._traces):
            self._end(name, "node")

    def _trace(self, name: str) -> _Trace:
        trace = self._traces.get(name)
        if trace is None:
            raise TraceError(f"no trace {name!r}")
        return trace

    def _info(self, trace: _Trace) -> TraceInfo:
        return dataclasses.replace(trace.info, bytes=trace.size)

    def _end(self, name: str, why: str) -> None:
        trace = self._traces.get(name)
        if trace is None or trace.info.status != "running":
            return
        trace.timer.cancel()
        trace.info = dataclasses.replace(trace.info, status="stopped", stopped_by=why)
        trace.file.close()
        info = trace.info
        if info.kind == "clientid":
            same = [t for t in self._clients.get(info.value, ()) if t is not trace]
            if same:
                self._clients[info.value] = same
            else:
                self._clients.pop(info.value, None)
        else:
            self._topics = [t for t in self._topics if t is not trace]
        self.on = bool(self._clients or self._topics)
        if not self.on and self._flusher is not None:
            self._flusher.cancel()
            self._flusher = None

    def _flush_all(self) -> None:
        for trace in self._traces.values():
            if not trace.file.closed:
                trace.file.flush()
        self._flusher = asyncio.get_running_loop().call_later(FLUSH_S, self._flush_all)

    def _now(self) -> float:
        if self._clock is not None:
            return self._clock()
        return datetime.datetime.now(datetime.UTC).timestamp()

    # -- the connections' side (only while `on`) ------------------------------------

    def received(self, client_id: str | None, peer: str, packet: object,
                 aliased: Aliased | None = None) -> None:  # fmt: skip
        """A packet read from a client (its CONNECT names the client id itself)."""
        if client_id is None and type(packet) is Connect:
            client_id = packet.client_id
        self._record(client_id, peer, "in", packet, aliased)

    def sent(self, client_id: str | None, peer: str, data: bytes, protocol_level: int,
             aliased: Aliased | None = None) -> None:  # fmt: skip
        """Bytes written to a client: its packets, decoded again (only while tracing)."""
        if client_id not in self._clients and not self._topics:
            return
        view, used = memoryview(data), 0
        try:
            while used < len(data):
                result = codec.decode(view[used:], protocol_level or 5, len(data))
                if result is None:
                    break
                packet, size = result
                used += size
                self._record(client_id, peer, "out", packet, aliased)
        except MQTTError:
            self._record(client_id, peer, "out", {"undecoded": data[used:].hex()}, None)
        finally:
            view.release()

    def _record(self, client_id: str | None, peer: str, direction: str, packet: object,
                aliased: Aliased | None) -> None:  # fmt: skip
        traces = self._clients.get(client_id, []) if client_id is not None else []
        by_alias = None  # the topic an alias-only PUBLISH stands for
        if type(packet) is Publish and not packet.topic and aliased is not None:
            alias = packet.properties.topic_alias
            by_alias = aliased(direction == "in", alias) if alias is not None else None
        if self._topics and type(packet) is Publish:
            topic = by_alias or packet.topic
            traces = traces + [t for t in self._topics if matches(t.info.value, topic)]
        if not traces:
            return
        stamp = datetime.datetime.now(datetime.UTC).isoformat(timespec="microseconds")
        for trace in traces:
            record = {
                "ts": stamp, "node": self.node, "dir": direction, "clientid": client_id,
                "peer": peer, "packet": _kind(packet),
                "fields": _fields(packet, trace.payload_bytes),
            }  # fmt: skip
            if by_alias is not None:
                record["alias_topic"] = by_alias
            line = json.dumps(record, ensure_ascii=False) + "\n"
            size = len(line.encode())
            if trace.size + size > trace.limit:
                self._end(trace.info.name, "size")
                continue
            trace.file.write(line)
            trace.size += size


def _kind(packet: object) -> str:
    if isinstance(packet, dict):
        return "?"
    return type(packet).__name__.upper()


def _fields(packet: object, payload_bytes: int) -> Any:
    if isinstance(packet, dict):
        return packet
    return _plain(packet, payload_bytes)


def _plain(value: object, payload_bytes: int) -> Any:
    """A packet's fields as JSON values: nested dataclasses as objects, bytes as
    text cut at `payload_bytes`, secrets left out, default properties left out."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        out: dict[str, Any] = {}
        for f in dataclasses.fields(value):
            item = getattr(value, f.name)
            if f.name in SECRET:
                if item is not None:
                    out[f.name] = "******"
                continue
            if item is None or item == () or (f.name == "properties" and item == f.default):
                continue
            out[f.name] = _plain(item, payload_bytes)
            if isinstance(item, bytes):
                out[f.name + "_size"] = len(item)
        return out
    if isinstance(value, bytes):
        return value[:payload_bytes].decode("utf-8", "backslashreplace")
    if isinstance(value, tuple):
        return [_plain(v, payload_bytes) for v in value]
    return value
