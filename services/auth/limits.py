"""Rate limits and address rules at a node's edge (issue 11), on the `limits` package.

Theory of operation. Three kinds of limit, each counted where it is cheap enough:

- `ConnectRates`: CONNECTs per listener and per client address, in
  sliding windows (`limits`' sliding window counter: a refused CONNECT is not
  counted) in memory, or in Redis when `rate_storage = "redis"` so the
  whole cluster shares one window. Over: the CONNECT is refused with 0x9F
  Connection Rate Exceeded (3.x: CONNACK 3, server unavailable).
- `ClientRates` / `Budget`: PUBLISHes and bytes read per client, in fixed
  windows in this node's memory (a client is connected to one node; a Redis
  round trip per read would cost more than the read). A connection asks its
  `Budget` what it may still read before a batch of packets, takes packets
  until the budget is spent, and charges what it took after the batch: two
  window reads and two writes per batch, not per packet. Over: the packet
  stays in the buffer and the connection stops reading until the window
  refills, then goes on; nothing is dropped. A packet larger than what is
  left of the byte budget waits for the next window, unless the window is
  whole: a packet larger than a whole window goes alone (it is never stuck),
  and the window after it is waited out. While a connection waits, its keep
  alive is not checked (it is sending; we are not reading).

`Flapping` counts CONNECTs per client id (and, when asked, per address) in
moving windows in the same storage as the connection rates; one CONNECT too
many within the window gets its client id (or address) banned for a while
(`services.auth.banned`). This is the one flapping rule: a client flaps when
more than `max_connects` of its CONNECTs fall within one window of
`window_s` (the connects at (t - window, t]). The log's analytics
(`streams.analytics.flapping` in Spark, `streams.report.flapping` in pandas)
find flapping clients after the fact with the same rule and the same
defaults (services.config.settings); tests/auth/test_flapping_rule.py holds the
three to the same answers.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import limits
from limits.aio.storage import MemoryStorage as AsyncMemoryStorage
from limits.aio.storage import RedisStorage as AsyncRedisStorage
from limits.aio.strategies import MovingWindowRateLimiter, SlidingWindowCounterRateLimiter
from limits.storage import MemoryStorage
from limits.strategies import FixedWindowRateLimiter

from services.auth.banned import Ban
from services.mqtt.packets import Publish

log = logging.getLogger("weir.limits")

UNLIMITED = 1 << 62
CALL_S = 2.0  # seconds a count in Redis may take; past it the CONNECT is let in (logged)
MIN_WAIT_S = 0.01  # seconds: a window about to refill is waited for at least this long


def storage(kind: str, redis: Any = None) -> Any:
    """`limits`' async storage: this node's memory, or the node's Redis pool."""
    if kind == "redis" and redis is not None:
        return AsyncRedisStorage(
            "async+redis://", implementation="redispy", connection_pool=redis.connection_pool
        )
    return AsyncMemoryStorage()


class ConnectRates:
    def __init__(self, per_listener: str | None, per_ip: str | None, store: Any) -> None:
        self.per_listener = limits.parse(per_listener) if per_listener else None
        self.per_ip = limits.parse(per_ip) if per_ip else None
        self._limiter = SlidingWindowCounterRateLimiter(store)

    async def over(self, listener: str, host: str) -> str | None:
        """The rule this CONNECT is over (counting it if it is not), or None."""
        try:
            async with asyncio.timeout(CALL_S):
                if self.per_listener and not await self._limiter.test(
                    self.per_listener, "conn", listener
                ):
                    return f"connection rate {self.per_listener} of listener {listener}"
                if self.per_ip and not await self._limiter.hit(self.per_ip, "conn-ip", host):
                    return f"connection rate {self.per_ip} of address {host}"
                if self.per_listener:
                    await self._limiter.hit(self.per_listener, "conn", listener)
        except Exception as exc:  # a rate that cannot be counted does not refuse anyone
            log.warning("connection rate not counted (%s: %s): CONNECT let in",
                        type(exc).__name__, exc)  # fmt: skip
        return None


class Flapping:
    def __init__(
        self, max_connects: int, max_connects_ip: int, window_s: float, ban_s: float, store: Any
    ) -> None:
        window = max(1, round(window_s))
        self.by_client = limits.RateLimitItemPerSecond(max_connects, window)
        self.by_ip = limits.RateLimitItemPerSecond(max_connects_ip, window) if max_connects_ip \
            else None  # fmt: skip
        self.window_s = window
        self.ban_s = ban_s
        self._limiter = MovingWindowRateLimiter(store)

    async def ban_for(self, client_id: str, host: str) -> Ban | None:
        """Count this CONNECT; the ban it earns if it is one too many, else None."""
        until = time.time() + self.ban_s
        try:
            async with asyncio.timeout(CALL_S):
                if not await self._limiter.hit(self.by_client, "flap", client_id):
                    reason = f"more than {self.by_client.amount} connects in {self.window_s} s"
                    return Ban("clientid", client_id, until, reason, "flapping")
                if self.by_ip and not await self._limiter.hit(self.by_ip, "flap-ip", host):
                    reason = f"more than {self.by_ip.amount} connects in {self.window_s} s"
                    return Ban("peerhost", host, until, reason, "flapping")
        except Exception as exc:
            log.warning("flapping not counted (%s: %s)", type(exc).__name__, exc)
        return None


class ClientRates:
    """Per-client read rates in this node's memory (module docstring)."""

    def __init__(self, messages: str | None, nbytes: str | None) -> None:
        self.messages = limits.parse(messages) if messages else None
        self.bytes = limits.parse(nbytes) if nbytes else None
        self._limiter = FixedWindowRateLimiter(MemoryStorage())

    def budget(self, client_id: str, on_paused: Any) -> Budget:
        return Budget(self, client_id, on_paused)

    def left(self, item: limits.RateLimitItem | None, client_id: str) -> tuple[int, float]:
        if item is None:
            return UNLIMITED, 0.0
        reset, remaining = self._limiter.get_window_stats(item, client_id)
        return remaining, reset

    def charge(self, item: limits.RateLimitItem | None, client_id: str, cost: int) -> None:
        if item is not None and cost:
            self._limiter.hit(item, client_id, cost=cost)


class Budget:
    """What one connection may still read in its windows; see the module docstring."""

    __slots__ = ("bytes", "client_id", "messages", "on_paused", "paused", "rates", "spent",
                 "spent_bytes", "waiting", "whole")  # fmt: skip

    def __init__(self, rates: ClientRates, client_id: str, on_paused: Any) -> None:
        self.rates = rates
        self.client_id = client_id
        self.on_paused = on_paused  # called with the rule on each pause (log once, count)
        self.messages = self.bytes = UNLIMITED
        self.whole = rates.bytes.amount if rates.bytes is not None else UNLIMITED
        self.spent = self.spent_bytes = 0
        self.paused = 0  # times reading was paused for this connection
        self.waiting = False  # paused now: its keep alive is not checked meanwhile

    def refresh(self) -> None:
        """Before a batch: what the windows have left."""
        rates, cid = self.rates, self.client_id
        self.messages = rates.left(rates.messages, cid)[0]
        self.bytes = rates.left(rates.bytes, cid)[0]
        self.spent = self.spent_bytes = 0
        self.waiting = False

    def take(self, packet: object, size: int) -> bool:
        """May this packet be read now? If so it is counted."""
        if size > self.bytes and (self.bytes < self.whole or self.spent_bytes):
            return False  # does not fit: the next window (or a whole one) takes it
        if type(packet) is Publish:
            if self.messages <= 0:
                return False
            self.messages -= 1
            self.spent += 1
        self.bytes -= size
        self.spent_bytes += size
        return True

    def settle(self, over: bool) -> float:
        """After a batch: charge what was read; the seconds until reading may go
        on if the budget ran out (`over`), else 0."""
        rates, cid = self.rates, self.client_id
        rates.charge(rates.messages, cid, self.spent)
        rates.charge(rates.bytes, cid, self.spent_bytes)
        self.spent = self.spent_bytes = 0
        if not over:
            return 0.0
        now, wait, rule = time.time(), 0.0, ""
        for item, left in ((rates.messages, self.messages), (rates.bytes, self.bytes)):
            if item is not None and left <= 0:
                remaining, reset = rates.left(item, cid)
                if remaining <= 0 and reset - now > wait:
                    wait, rule = reset - now, f"{'messages' if item is rates.messages else 'bytes'}"
                    rule += f" {item}"
        self.paused += 1
        self.waiting = True
        self.on_paused(self, rule or "rate")
        return max(wait, MIN_WAIT_S)
