"""SCRAM-SHA-256 as MQTT 5 enhanced authentication: the stores and the steps.

Theory of operation. `Scram` is the node's `EnhancedAuthenticator` for the
method "SCRAM-SHA-256" (`services.auth.scram` does the messages and the
crypto). Its credentials come from the same places as the argon2id users:
every backend of the chain that is a `ScramStore` (the password file, the
Redis users), asked in the chain's order; the first that knows the user
answers, and one that cannot be read refuses (0x88 server unavailable).
Two steps:
1. the client-first-message (`context` None): parsed, its user must be the
   CONNECT's User Name when one was given (re-authentication: the
   connection's user), the credentials are looked up and the
   server-first-message goes back with the `Conversation` as context;
2. the client-final-message: a proof that holds ends it allowed, with the
   server-final-message and the user name (which the node gives the
   connection: ACL, bans and the session's events see it).
Every store is asked for every user (concurrently), so the first step takes
as long for a user early in the chain as for one nobody knows; an unknown
user's made-up salt comes from a secret the cluster shares
(`services.auth.scramkey`: in Redis, or in the data directory), refused
0x88 while it cannot be read.
Every refusal is 0x86 bad user name or password: a wrong proof, an unknown
user (found out only at the proof, see `scram`), a malformed message, a
user other than the CONNECT's. Its decision says why, for the log line.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Final, Protocol, runtime_checkable

from services.auth.api import AuthAnswer, ClientInfo, Decision
from services.auth.scram import (
    METHOD,
    Conversation,
    ScramCredentials,
    ScramError,
    client_final,
    client_first,
    server_first,
)
from services.auth.scramkey import MockSecret, ProcessSecret

NAME: Final = "scram"
BAD: Final = 0x86  # bad user name or password
UNAVAILABLE: Final = 0x88  # server unavailable


@runtime_checkable
class ScramStore(Protocol):
    name: str

    async def scram_credentials(self, user: str) -> ScramCredentials | Decision | None:
        """`user`'s SCRAM credentials; None if this store has none for it; a
        refusal (0x88) if it cannot tell now. Never raises."""
        ...


def _refused(why: str) -> AuthAnswer:
    return AuthAnswer(Decision(False, BAD, f"{NAME}: {why}"))


class Scram:
    methods: frozenset[str] = frozenset({METHOD})

    def __init__(self, stores: Sequence[ScramStore], mock: MockSecret | None = None) -> None:
        self.stores = tuple(stores)
        self.mock = mock if mock is not None else ProcessSecret()

    def claimed_user(self, method: str, data: bytes | None) -> str | None:
        try:
            return client_first(data).user
        except ScramError:
            return None

    async def step(
        self, client: ClientInfo, method: str, data: bytes | None, context: object
    ) -> AuthAnswer:
        if isinstance(context, Conversation):
            return self._final(context, data)
        try:
            first = client_first(data)
        except ScramError as exc:
            return _refused(str(exc))
        if client.username is not None and first.user != client.username:
            return _refused(f"user {first.user!r} is not the connection's {client.username!r}")
        # Every store is asked, at once, whoever the user is: stopping at the
        # first that knows it would answer sooner for users early in the chain
        # than for unknown ones, and the time would tell who exists.
        answers = await asyncio.gather(*(s.scram_credentials(first.user) for s in self.stores))
        mock = await self.mock.secret()  # asked for every user too, known or not
        if mock is None:
            why = f"{NAME}: the made-up salts' secret cannot be read now"
            return AuthAnswer(Decision(False, UNAVAILABLE, why))
        found: ScramCredentials | None = None
        for answer in answers:
            if isinstance(answer, Decision):
                return AuthAnswer(answer)
            if answer is not None:
                found = answer
                break
        conversation = server_first(first, found, mock)
        return AuthAnswer(None, conversation.server_first.encode(), conversation)

    def _final(self, conversation: Conversation, data: bytes | None) -> AuthAnswer:
        user = conversation.client.user
        try:
            last = client_final(conversation, data)
        except ScramError as exc:
            return _refused(str(exc))
        if last is None:
            known = conversation.credentials is not None
            return _refused(f"wrong proof for {user!r}" if known else f"unknown user {user!r}")
        return AuthAnswer(Decision(True, 0, NAME), last, None, user)
