"""SCRAM-SHA-256 (services/auth/scram.py, scramauth.py): RFC 7677's test vector on
both sides (the server here, and the tests' own client, tests/support/scramclient.py),
the credential format, malformed messages, unknown users, and the two steps of
the `Scram` enhanced authenticator over a store."""

from __future__ import annotations

import asyncio
import base64
from pathlib import Path

import pytest

from services.auth.api import AuthAnswer, ClientInfo, Decision
from services.auth.scram import (
    METHOD,
    ScramCredentials,
    ScramError,
    client_final,
    client_first,
    server_first,
)
from services.auth.scramauth import Scram
from services.auth.scramkey import FileSecret, RedisSecret
from services.store.redis import connect
from tests.support.scramclient import ScramClient

# RFC 7677 section 3
CLIENT_FIRST = b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO"
SERVER_NONCE = "%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0"
SERVER_FIRST = (
    "r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096"
)
CLIENT_FINAL = (
    b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
    b"p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ="
)
SERVER_FINAL = b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="
SALT = base64.b64decode("W22ZaJ0SNY7soEsUEjb6gQ==")
PENCIL = ScramCredentials.from_password("pencil", 4096, SALT)
SECRET = b"s" * 32  # the cluster's secret behind unknown users' salts


def test_rfc7677_vector_server_side() -> None:
    conversation = server_first(client_first(CLIENT_FIRST), PENCIL, SECRET, SERVER_NONCE)
    assert conversation.server_first == SERVER_FIRST
    assert client_final(conversation, CLIENT_FINAL) == SERVER_FINAL


def test_rfc7677_vector_test_client() -> None:
    client = ScramClient("user", "pencil", nonce="rOprNGfwEbeRWgbNEkqO")
    assert client.first() == CLIENT_FIRST
    assert client.final(SERVER_FIRST.encode()) == CLIENT_FINAL
    assert client.verified(SERVER_FINAL)


def test_wrong_password_proof_is_refused() -> None:
    client = ScramClient("user", "pen", nonce="abc")
    conversation = server_first(client_first(client.first()), PENCIL, SECRET)
    assert client_final(conversation, client.final(conversation.server_first.encode())) is None


def test_credentials_round_trip_and_hold_no_password() -> None:
    encoded = PENCIL.encode()
    assert encoded.startswith("SCRAM-SHA-256$4096:W22ZaJ0SNY7soEsUEjb6gQ==$")
    assert "pencil" not in encoded
    assert ScramCredentials.decode(encoded) == PENCIL
    fresh = ScramCredentials.from_password("pencil")
    assert fresh.iterations == 4096 and fresh.salt != SALT and len(fresh.salt) == 16


@pytest.mark.parametrize(
    "text",
    ["SCRAM-SHA-1$4096:c2FsdA==$a:b", "SCRAM-SHA-256$x:c2FsdA==$a:b", "SCRAM-SHA-256$4096:c2F$",
     "SCRAM-SHA-256$4096:c2FsdA==$c2FsdA==:c2FsdA=="],
)  # fmt: skip
def test_bad_stored_credentials(text: str) -> None:
    with pytest.raises(ScramError):
        ScramCredentials.decode(text)


def test_saslname_unescaping() -> None:
    assert client_first(b"n,,n=a=2Cb=3Dc,r=x").user == "a,b=c"
    assert ScramClient("a,b=c", "p").first().startswith(b"n,,n=a=2Cb=3Dc,r=")


@pytest.mark.parametrize(
    "data",
    [None, b"", b"\xff", b"n,,r=x,n=u", b"p=tls-unique,,n=u,r=x", b"x,,n=u,r=x",
     b"n,,n=u=,r=x", b"n,,n=,r=x", b"n,a=other,n=u,r=x", b"n,,n=u"],
)  # fmt: skip
def test_malformed_client_first(data: bytes | None) -> None:
    with pytest.raises(ScramError):
        client_first(data)


@pytest.mark.parametrize(
    "data",
    [b"c=biws,r=wrong,p=AAAA", b"c=eSws,r=NONCE,p=AAAA", b"r=NONCE,c=biws,p=AAAA",
     b"c=biws,r=NONCE", b"c=biws,r=NONCE,p=!!"],
)  # fmt: skip
def test_malformed_client_final(data: bytes) -> None:
    conversation = server_first(client_first(b"n,,n=user,r=NON"), PENCIL, SECRET, "CE")
    with pytest.raises(ScramError):
        client_final(conversation, data)


def test_unknown_user_gets_a_stable_made_up_salt_and_fails_at_the_proof() -> None:
    first = client_first(b"n,,n=nobody,r=abc")
    one, two = server_first(first, None, SECRET), server_first(first, None, SECRET)
    salt = one.server_first.split(",")[1]
    assert salt == two.server_first.split(",")[1], "the same made-up salt each time"
    assert len(base64.b64decode(salt.removeprefix("s="))) == 16
    assert client_first(b"n,,n=other,r=abc").user == "other"
    other = server_first(client_first(b"n,,n=other,r=abc"), None, SECRET)
    assert other.server_first.split(",")[1] != salt
    client = ScramClient("nobody", "anything", nonce="abc")
    client.first()
    assert client_final(one, client.final(one.server_first.encode())) is None


class Store:
    name = "test store"

    def __init__(self, users: dict[str, ScramCredentials | Decision]) -> None:
        self.users = users

    async def scram_credentials(self, user: str) -> ScramCredentials | Decision | None:
        return self.users.get(user)


def run(scram: Scram, user: str | None, steps: list[bytes]) -> AuthAnswer:
    """Feed the client's messages to `scram` (server answers go to the next step)."""
    client = ClientInfo("c1", user, "127.0.0.1:1", 5)
    answer = asyncio.run(scram.step(client, "SCRAM-SHA-256", steps[0], None))
    for data in steps[1:]:
        assert answer.decision is None, answer
        answer = asyncio.run(scram.step(client, "SCRAM-SHA-256", data, answer.context))
    return answer


def login(scram: Scram, connect_user: str | None, user: str, password: str) -> AuthAnswer:
    client = ScramClient(user, password)
    info = ClientInfo("c1", connect_user, "127.0.0.1:1", 5)
    first = asyncio.run(scram.step(info, "SCRAM-SHA-256", client.first(), None))
    if first.decision is not None:
        return first
    assert first.data is not None
    last = asyncio.run(scram.step(info, "SCRAM-SHA-256", client.final(first.data), first.context))
    if last.decision is not None and last.decision.ok:
        assert client.verified(last.data)
    return last


def test_scram_authenticator_steps() -> None:
    alice = ScramCredentials.from_password("alice-pw")
    scram = Scram([Store({}), Store({"alice": alice, "down": Decision(False, 0x88, "down")})])
    ok = login(scram, None, "alice", "alice-pw")
    assert ok.decision is not None and ok.decision.ok and ok.username == "alice"
    assert login(scram, "alice", "alice", "alice-pw").username == "alice"
    for answer, why in [
        (login(scram, None, "alice", "wrong"), "scram: wrong proof for 'alice'"),
        (login(scram, None, "bob", "x"), "scram: unknown user 'bob'"),
        (login(scram, "bob", "alice", "alice-pw"), "scram: user 'alice' is not the connection's"),
        (run(scram, None, [b"garbage"]), "scram: client-first-message has no gs2 header"),
    ]:
        assert answer.decision is not None and answer.decision.reason_code == 0x86
        assert answer.decision.by.startswith(why), answer.decision.by
    down = login(scram, None, "down", "x").decision
    assert down == Decision(False, 0x88, "down")
    assert scram.claimed_user("SCRAM-SHA-256", b"n,,n=carol,r=x") == "carol"
    assert scram.claimed_user("SCRAM-SHA-256", b"junk") is None


def test_every_store_is_asked_whoever_the_user_is() -> None:
    """Before: the lookup stopped at the first store that knew the user, so a
    user of the first store was answered sooner than an unknown one."""
    asked: list[str] = []

    class Counting(Store):
        async def scram_credentials(self, user: str) -> ScramCredentials | Decision | None:
            asked.append(user)
            return await super().scram_credentials(user)

    alice = ScramCredentials.from_password("alice-pw")
    scram = Scram([Counting({"alice": alice}), Counting({})])
    assert login(scram, None, "alice", "alice-pw").username == "alice"
    assert asked == ["alice", "alice"]
    login(scram, None, "nobody", "x")
    assert asked[2:] == ["nobody", "nobody"]


def first_answer(scram: Scram, user: str) -> str:
    """The salt and iteration count `scram` answers `user`'s first step with."""
    client = ScramClient(user, "x", nonce="abc")
    info = ClientInfo("c1", None, "127.0.0.1:1", 5)
    answer = asyncio.run(scram.step(info, METHOD, client.first(), None))
    assert answer.data is not None, answer.decision
    return ",".join(answer.data.decode().split(",")[1:])


def test_an_unknown_users_salt_is_the_same_in_every_process(tmp_path: Path) -> None:
    """Two processes (workers, nodes, a restart) answer an unknown user alike, as
    they do a known one (before: each process made its own secret, so a salt
    that changed between two asks showed the user did not exist)."""
    alice = ScramCredentials.from_password("alice-pw")
    one = Scram([Store({"alice": alice})], FileSecret(tmp_path))
    two = Scram([Store({"alice": alice})], FileSecret(tmp_path))
    assert first_answer(one, "nobody") == first_answer(two, "nobody")
    assert first_answer(one, "alice") == first_answer(two, "alice")
    assert first_answer(one, "nobody").endswith(f"i={alice.iterations}")  # as a real user
    assert (tmp_path / "scram-mock-key").stat().st_mode & 0o777 == 0o600


@pytest.mark.redis
def test_an_unknown_users_salt_is_the_cluster_s_with_redis(redis_url: str) -> None:
    async def answers() -> tuple[str, str]:
        a, b = connect(redis_url), connect(redis_url)
        try:
            one = await Scram([Store({})], RedisSecret(a)).step(
                ClientInfo("c1", None, "x:1", 5), METHOD, b"n,,n=nobody,r=abc", None
            )
            two = await Scram([Store({})], RedisSecret(b)).step(
                ClientInfo("c2", None, "x:2", 5), METHOD, b"n,,n=nobody,r=abc", None
            )
        finally:
            await a.aclose()
            await b.aclose()
        assert one.data is not None and two.data is not None
        return one.data.decode().split(",")[1], two.data.decode().split(",")[1]

    salt_one, salt_two = asyncio.run(answers())
    assert salt_one == salt_two


def test_no_secret_refuses_the_first_step_for_everyone() -> None:
    class Down:
        async def secret(self) -> bytes | None:
            return None

    alice = ScramCredentials.from_password("alice-pw")
    scram = Scram([Store({"alice": alice})], Down())
    for user in ("alice", "nobody"):
        answer = asyncio.run(
            scram.step(ClientInfo("c1", None, "x:1", 5), METHOD, f"n,,n={user},r=a".encode(), None)
        )
        assert answer.decision is not None and answer.decision.reason_code == 0x88
