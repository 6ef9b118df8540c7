"""The authentication the settings ask for: the chain of backends, built here.

`authenticator(settings, redis)` turns `settings.auth` (services.config.auth)
into a `services.auth.chain.Chain` of backends in that order, or `AllowAll`
when none is configured (the loopback default: `exposure_error` has already
refused a listener beyond loopback without authentication or
allow_anonymous) unless a listener says `allow_anonymous = false`: then a
chain without backends, which lets in on that listener only the clients
its verified certificates name, and everyone elsewhere. The Redis users
backend needs the node's Redis: without one (`redis` None, as when `weir
up` checks the settings before starting anything) it is left out here, and
`weir up` refuses it with --backend memory. A listener's own
allow_anonymous overrides the node's for its clients. A key file or
password file that cannot be used is a SettingsError (one line, exit 2).

`enhanced(chain)`: MQTT 5 enhanced authentication with SCRAM-SHA-256 over
the chain's backends that hold SCRAM credentials (the password file, the
Redis users), or None (every Authentication Method refused 0x8C); the
secret behind unknown users' salts is the cluster's (`services.auth.scramkey`).
"""

from __future__ import annotations

from typing import Any

from services.auth.api import AllowAll, Authenticator, EnhancedAuthenticator
from services.auth.chain import Backend, Chain
from services.auth.jwtauth import Jwt, JwtError
from services.auth.passwd import PasswordFile, PasswordFileError
from services.auth.scramauth import Scram, ScramStore
from services.auth.scramkey import MockSecret
from services.config import Settings, SettingsError, is_loopback
from services.config.auth import AuthBackend


def authenticator(settings: Settings, redis: Any = None) -> Authenticator:
    listeners = {listener.name: listener.allow_anonymous for listener in settings.listeners.all()
                 if listener.allow_anonymous is not None}  # fmt: skip
    if not settings.auth:
        if all(listeners.values()):
            return AllowAll()
        return Chain((), True, listeners)  # those listeners take certificate-named users only
    backends: list[Backend] = []
    try:
        for config in settings.auth:
            backend = _backend(config, redis)
            if backend is not None:
                backends.append(backend)
    except (PasswordFileError, JwtError) as exc:
        raise SettingsError(str(exc)) from None
    return Chain(backends, settings.allow_anonymous, listeners)


def enhanced(authn: Authenticator, mock: MockSecret | None = None) -> EnhancedAuthenticator | None:
    """SCRAM over the chain's SCRAM stores; `mock`: the cluster's secret for
    unknown users' salts (None: this process's own, for tests)."""
    backends = authn.backends if isinstance(authn, Chain) else ()
    stores = [backend for backend in backends if isinstance(backend, ScramStore)]
    return Scram(stores, mock) if stores else None


def _backend(config: AuthBackend, redis: Any) -> Backend | None:
    if config.backend == "password_file":
        assert config.path is not None  # services.config.auth requires it
        return PasswordFile(config.path)
    if config.backend == "redis":
        from services.auth.redisusers import RedisUsers

        return RedisUsers(redis) if redis is not None else None
    if config.backend == "jwt":
        return Jwt(
            secret=config.secret,
            public_key=config.public_key,
            jwks=config.jwks,
            username_claim=config.username_claim,
            clientid_claim=config.clientid_claim,
        )
    from services.auth.webhook import HttpWebhook

    assert config.url is not None  # services.config.auth requires it
    return HttpWebhook(config.url, config.timeout_s, config.cache_s, config.on_error)


def who_gets_in(settings: Settings) -> str:
    """`weir up`'s line about authentication: the chain, or who the default lets in."""
    host = settings.listeners.host
    anonymous = "anonymous clients allowed" if settings.allow_anonymous else "anonymous refused"
    if settings.auth:
        chain = ", then ".join(config.describe() for config in settings.auth)
        return f"clients authenticate with {chain}; {anonymous}"
    if is_loopback(host):
        return f"anonymous clients allowed on {host} (loopback only)"
    return f"anonymous clients allowed on {host} (allow_anonymous)"
