"""MQTT over WebSocket: wsproto (sans-IO) framing under the same `Connection`.

`WebSocketProtocol` owns the socket. After the HTTP upgrade (subprotocol
"mqtt", or "mqttv3.1" for old clients) it creates an ordinary `Connection`
and hands it `_FramedTransport`, a transport that wraps every write in one
binary frame. Binary message payloads are fed to the connection as a byte
stream: MQTT packets may span frames and frames may hold several packets.
On a wss listener the socket under it is the TLS transport
(`services.listener.listeners`), which `_FramedTransport.get_extra_info` shows
the connection (its client certificate).
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from wsproto import ConnectionType, WSConnection
from wsproto.connection import ConnectionState
from wsproto.events import (
    AcceptConnection,
    BytesMessage,
    CloseConnection,
    Message,
    Ping,
    RejectConnection,
    Request,
    TextMessage,
)
from wsproto.utilities import LocalProtocolError, RemoteProtocolError

from services.listener.connection import Connection

if TYPE_CHECKING:
    from services.broker.broker import Broker
    from services.listener.listeners import Listener

SUBPROTOCOLS = ("mqtt", "mqttv3.1")
CLOSE_NORMAL = 1000
CLOSE_UNSUPPORTED_DATA = 1003


class _FramedTransport(asyncio.Transport):
    __slots__ = ("_outer",)

    def __init__(self, outer: WebSocketProtocol) -> None:
        super().__init__()
        self._outer = outer

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self._outer.send_binary(bytes(data))

    def close(self) -> None:
        self._outer.close(CLOSE_NORMAL)

    def abort(self) -> None:
        self._outer.abort()

    def is_closing(self) -> bool:
        return self._outer.closing

    def pause_reading(self) -> None:
        self._outer.transport.pause_reading()

    def resume_reading(self) -> None:
        self._outer.transport.resume_reading()

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        self._outer.transport.set_write_buffer_limits(high, low)

    def get_write_buffer_size(self) -> int:
        return self._outer.transport.get_write_buffer_size()

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self._outer.transport.get_extra_info(name, default)


class WebSocketProtocol(asyncio.Protocol):
    __slots__ = ("broker", "closing", "listener", "mqtt", "transport", "ws")

    def __init__(self, broker: Broker, listener: Listener | None = None) -> None:
        self.broker = broker
        self.listener = listener
        self.ws = WSConnection(ConnectionType.SERVER)
        self.mqtt: Connection | None = None
        self.closing = False
        self.transport: asyncio.Transport = None  # type: ignore[assignment]

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is no subclass

    def data_received(self, data: bytes) -> None:
        try:
            self.ws.receive_data(data)
            for event in self.ws.events():
                if isinstance(event, Request):
                    self._handshake(event)
                elif isinstance(event, BytesMessage):
                    if self.mqtt is not None:
                        self.mqtt.data_received(bytes(event.data))
                elif isinstance(event, TextMessage):
                    self.close(CLOSE_UNSUPPORTED_DATA)
                elif isinstance(event, CloseConnection):
                    if self.ws.state is ConnectionState.REMOTE_CLOSING:
                        self.transport.write(self.ws.send(event.response()))
                    self.closing = True
                    self.transport.close()
                elif isinstance(event, Ping):
                    self.transport.write(self.ws.send(event.response()))
        except (LocalProtocolError, RemoteProtocolError):
            self.abort()

    def _handshake(self, request: Request) -> None:
        offered = [p for p in SUBPROTOCOLS if p in request.subprotocols]
        if request.subprotocols and not offered:
            self.transport.write(self.ws.send(RejectConnection(status_code=400)))
            self.closing = True
            self.transport.close()
            return
        subprotocol = offered[0] if offered else None
        self.transport.write(self.ws.send(AcceptConnection(subprotocol=subprotocol)))
        self.mqtt = Connection(self.broker, self.listener)
        self.mqtt.connection_made(_FramedTransport(self))

    def send_binary(self, data: bytes) -> None:
        if not self.closing and self.ws.state is ConnectionState.OPEN:
            self.transport.write(self.ws.send(Message(data=data)))

    def close(self, code: int) -> None:
        if self.closing:
            return
        self.closing = True
        if self.ws.state is ConnectionState.OPEN:
            self.transport.write(self.ws.send(CloseConnection(code=code)))
        self.transport.close()

    def abort(self) -> None:
        self.closing = True
        self.transport.abort()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closing = True
        if self.mqtt is not None:
            self.mqtt.connection_lost(exc)

    def pause_writing(self) -> None:
        if self.mqtt is not None:
            self.mqtt.pause_writing()

    def resume_writing(self) -> None:
        if self.mqtt is not None:
            self.mqtt.resume_writing()
