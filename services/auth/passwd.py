"""The password file: users with argon2id hashes, and `weir passwd FILE USER`.

Theory of operation. The file holds one `user:hash` line per user (`#`
comments and blank lines allowed); hashes are argon2id in the PHC string
format (argon2-cffi), never plain text. A user may also have a second line,
`user:SCRAM-SHA-256$<iterations>:<salt>$<StoredKey>:<ServerKey>`
(`services.auth.scram`; `weir passwd FILE USER --scram` writes both lines
from one password), for MQTT 5 enhanced authentication
(`scram_credentials`, a `services.auth.scramauth.ScramStore`). `PasswordFile.check` is one backend
of the authentication chain (`services.auth.chain`):
- a CONNECT without a user name, or with a user the file does not name, is
  not this backend's to decide: it answers "ignore" (the next backend, or
  the chain's anonymous rules, decide);
- a user of the file without a password or with a wrong one is refused
  with 0x86 bad user name or password (3.1.1: 4);
- the password is verified by `services.auth.argon` (worker threads; a
  verified (user, hash, password) digest is remembered for a while).
The file is read at start (a missing or malformed file stops `weir up` with
one line) and again when its modification time changes (looked at no more
than once a second, and at once before a user is refused or ignored, so
a user `weir passwd` or the API has just added or changed can connect
straight away; a deleted user may still connect for up to a second); a
file that became bad keeps the users read before and logs why. Reloading
clears the cache.
"""

from __future__ import annotations

import getpass
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

import click

from services.auth.api import ClientInfo
from services.auth.argon import CACHE_TTL_S, HASHER, check_hash
from services.auth.cache import CredentialCache, Verdict
from services.auth.scram import METHOD, ScramCredentials, ScramError
from services.auth.watched import CHECK_S, Watched
from services.cli import CONTEXT, Command, fail, run
from services.config import load
from services.config.flags import given, settings_flags, some

log = logging.getLogger("weir.auth")

RELOAD_CHECK_S: Final = CHECK_S  # the file's mtime is looked at no more often than this


class PasswordFileError(Exception):
    """The file cannot be read or has a malformed line; the message is one line."""


Users = tuple[dict[str, str], dict[str, ScramCredentials]]  # argon2 hashes, SCRAM credentials


def parse_users(text: str, source: str) -> Users:
    users: dict[str, str] = {}
    scram: dict[str, ScramCredentials] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        user, sep, hashed = line.partition(":")
        try:
            if sep and user and hashed.startswith(f"{METHOD}$"):
                scram[user] = ScramCredentials.decode(hashed)
                continue
        except ScramError as exc:
            raise PasswordFileError(f"{source} line {number}: {exc}") from None
        if not sep or not user or not hashed.startswith("$argon2"):
            raise PasswordFileError(
                f"{source} line {number}: expected user:argon2-hash (weir passwd writes them)"
            )
        users[user] = hashed
    return users, scram


def parse(text: str, source: str) -> dict[str, str]:
    return parse_users(text, source)[0]


def read_users(path: Path) -> Users:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise PasswordFileError(f"password file {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise PasswordFileError(f"password file {path}: not UTF-8") from None
    return parse_users(text, f"password file {path}")


def read(path: Path) -> dict[str, str]:
    return read_users(path)[0]


class PasswordFile:
    def __init__(self, path: str | Path, reload_check_s: float = RELOAD_CHECK_S) -> None:
        self.path = Path(path)
        self.name = f"password file {self.path}"
        self.users, self.scram = read_users(self.path)  # PasswordFileError: the node stops
        self.file = Watched(self.path, reload_check_s)
        self.cache = CredentialCache(CACHE_TTL_S)

    def _maybe_reload(self, at_once: bool = False) -> bool:
        """Reread the file if it changed; whether it did."""
        if not self.file.changed(at_once):
            return False
        try:
            self.users, self.scram = read_users(self.path)
        except PasswordFileError as exc:
            log.warning("%s; keeping the %d users read before", exc, len(self.users))
            return False
        self.cache.clear()
        log.info("password file %s reloaded: %d users", self.path, len(self.users))
        return True

    async def check(self, client: ClientInfo, password: bytes | None) -> Verdict:
        self._maybe_reload()
        verdict = await self._check(client, password)
        refused = verdict is None or not verdict.ok
        if refused and client.username is not None and self._maybe_reload(at_once=True):
            verdict = await self._check(client, password)  # a user added or changed just now
        return verdict

    async def _check(self, client: ClientInfo, password: bytes | None) -> Verdict:
        user = client.username
        hashed = self.users.get(user) if user is not None else None
        if user is None or hashed is None:
            return None  # not a user of this file
        return await check_hash(self.cache, user, hashed, password)

    async def scram_credentials(self, user: str) -> ScramCredentials | None:
        self._maybe_reload()
        return self.scram.get(user)


# -- weir passwd ------------------------------------------------------------------


def set_user(path: Path, user: str, password: str | None, scram: bool = False) -> None:
    """Add or change `user` (None: delete it), keeping every other line; with
    `scram` its SCRAM-SHA-256 credentials too (a second line). The file is
    written whole (a temporary file renamed over it), mode 0600."""
    lines = path.read_text(encoding="utf-8").splitlines() if path.exists() else []
    parse("\n".join(lines), f"password file {path}")  # refuse to rewrite a broken file
    kept = [line for line in lines if line.strip().partition(":")[0] != user]
    if password is not None:
        kept.append(f"{user}:{HASHER.hash(password)}")
        if scram:
            kept.append(f"{user}:{ScramCredentials.from_password(password).encode()}")
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        out.write("\n".join(kept) + ("\n" if kept else ""))
    os.replace(tmp, path)


@click.command(
    "passwd", cls=Command, context_settings=CONTEXT,
    help="Add or change a user of a password file, FILE USER (argon2id hashes), or a user in "
    "Redis, --redis URL USER (for --auth-redis); --redis USER: the Redis of the weir up "
    "running on the data dir.",
)  # fmt: skip
@click.argument("names", nargs=-1, metavar="[FILE] USER")
@settings_flags(some("redis_url", "data_dir"))
@click.option("--delete", is_flag=True, help="remove the user")
@click.option("--password-stdin", is_flag=True, help="read the password from stdin, one line")
@click.option("--scram", is_flag=True, help="also keep SCRAM-SHA-256 credentials (MQTT 5 "
              "enhanced authentication)")  # fmt: skip
def passwd(names: tuple[str, ...], delete: bool, password_stdin: bool, scram: bool,
           **flags: Any) -> int:  # fmt: skip
    redis_url = given(flags).get("redis_url")
    if redis_url is not None and "://" not in redis_url and not names:
        # `--redis USER`: the Redis of the weir up running on the data dir
        if redis_url.startswith("-"):  # `--redis --password-stdin`: an option, not a user
            fail("give --redis URL USER, or --redis USER for the running weir up")
        names, redis_url = (redis_url,), _running_redis(given(flags).get("data_dir"))
    if redis_url is not None:
        redis_url = load({"redis_url": redis_url}, env={}).redis_url  # checked as weir up does
    if len(names) != (1 if redis_url else 2):
        fail("give FILE USER, or --redis URL USER")
    user = names[-1]
    if ":" in user or not user.strip() or user != user.strip():
        fail("a user name cannot contain ':' or surrounding spaces")
    password = None
    if not delete:
        password = _read_password(user, password_stdin)
        if password is None:
            return 2
    try:
        if redis_url is None:
            set_user(Path(names[0]), user, password, scram)
        else:
            from redis import RedisError

            from services.auth.redisusers import set_user as set_redis_user

            try:
                set_redis_user(redis_url, user, password, scram)
            except RedisError as exc:
                raise OSError(f"redis {redis_url}: {exc}") from None
    except (PasswordFileError, OSError) as exc:
        print(f"weir passwd: {exc}", file=sys.stderr)
        return 1
    return 0


def _running_redis(data_dir: str | None) -> str:
    from services.embedded import endpoints

    return endpoints.backends(load({"data_dir": data_dir}).data_dir, "weir passwd")[0]


def main(argv: Sequence[str]) -> int:
    return run(passwd, argv, "weir passwd")


def _read_password(user: str, from_stdin: bool) -> str | None:
    """The new password (None, with one line on stderr, when it cannot be had)."""
    if from_stdin:
        password = sys.stdin.readline().rstrip("\n")
    else:
        password = getpass.getpass(f"password for {user}: ")
        if getpass.getpass("again: ") != password:
            print("weir passwd: the passwords differ", file=sys.stderr)
            return None
    if not password:
        print("weir passwd: empty password", file=sys.stderr)
        return None
    return password
