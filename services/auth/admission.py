"""Who may connect: the checks a CONNECT passes before it is authenticated.

Theory of operation. `Admission.admit` runs once per valid CONNECT, before
the authenticator (so a banned or flooding client costs no password hash),
in this order, the first refusal winning:

1. bans (`banned`): 0x8A Banned (3.x: 5, not authorized);
2. flapping (`limits.Flapping`): the CONNECT that is one too many bans its
   client id (or address) for the ban period, logged once, and is refused
   as banned; later ones meet the ban in step 1;
3. connection rates (`limits.ConnectRates`): 0x9F Connection Rate Exceeded
   (3.x: 3, server unavailable), counted only when not refused before.

(Address rules and connection counts per listener are the listener's, at
accept: `services.listener.listeners`.)

A refusal names its rule and the reason it is counted under (`weir_connections_refused_total`);
the node logs and counts it (`services.broker.seams`). An admitted client gets
its read `Budget` when per-client rates are configured. The node builds it
from its settings (`services.broker.seams.admitting`), starts and stops it
(the Redis ban table follows a channel and polls).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

from services.auth.api import ClientInfo
from services.auth.banned import Ban, BanStore, peer_host
from services.auth.limits import Budget, ClientRates, ConnectRates, Flapping
from services.mqtt.packets import ReasonCode

log = logging.getLogger("weir.auth")


@dataclass(frozen=True, slots=True)
class Refusal:
    reason_code: int
    rule: str  # in words, for the log line
    reason: str  # its label in services.metrics.registry.REFUSE_REASONS


class Admission:
    def __init__(
        self,
        bans: BanStore,
        flapping: Flapping | None = None,
        rates: ConnectRates | None = None,
        client_rates: ClientRates | None = None,
    ) -> None:
        self.bans = bans
        self.flapping = flapping
        self.rates = rates
        self.client_rates = client_rates

    async def start(self) -> None:
        await self.bans.start()

    async def stop(self) -> None:
        await self.bans.stop()

    async def admit(self, client: ClientInfo, listener: str) -> Refusal | None:
        """None if `client` may go on to authentication; else why not."""
        ban = self.bans.match(client.client_id, client.username, client.peer)
        if ban is not None:
            return Refusal(ReasonCode.BANNED, f"banned: {ban.describe()}", "banned")
        host = peer_host(client.peer)
        if self.flapping is not None:
            ban = await self.flapping.ban_for(client.client_id, host)
            if ban is not None:
                await self._ban_flapping(client, ban)
                return Refusal(ReasonCode.BANNED, f"flapping: {ban.describe()}",
                               "flapping")  # fmt: skip
        if self.rates is not None and (rule := await self.rates.over(listener, host)):
            return Refusal(ReasonCode.CONNECTION_RATE_EXCEEDED, rule, "rate_limited")
        return None

    async def _ban_flapping(self, client: ClientInfo, ban: Ban) -> None:
        log.warning(
            "flapping: client %s, user %s, peer %s: %s; %s %s banned for %.0f s",
            client.client_id, client.username, client.peer, ban.reason, ban.kind, ban.who,
            (ban.until or 0.0) - time.time(),
        )  # fmt: skip
        try:
            await self.bans.add(ban)
        except Exception as exc:  # the CONNECT is refused anyway; the ban retried next time
            log.warning("flapping ban of %s not stored: %s", ban.who, exc)

    def budget(self, client_id: str, on_paused: Any) -> Budget | None:
        """The read budget of an admitted client, if per-client rates are set."""
        if self.client_rates is None:
            return None
        return self.client_rates.budget(client_id, on_paused)
