"""The password file: users with argon2id hashes, and `weir passwd FILE USER`.

Theory of operation. The file holds one `user:hash` line per user (`#`
comments and blank lines allowed); hashes are argon2id in the PHC string
format (argon2-cffi), never plain text. `PasswordFile.authenticate`:
- a CONNECT without a user name is anonymous: allowed only with
  `allow_anonymous` (Mosquitto 2's rule once a password file is set), else
  refused with 0x87 not authorized (3.1.1: 5);
- an unknown user or a wrong password is refused with 0x86 bad user name
  or password (3.1.1: 4), the same answer for both;
- argon2id is slow on purpose (about 80 ms a verify here), so it runs in a
  worker thread, never on the event loop, and a verified (user, password)
  pair is remembered for `CACHE_TTL_S` as a SHA-256 digest of the two (the
  password itself is never kept), so a reconnect storm of a fleet does not
  cost each device a verify. Refusals are not cached: a wrong password
  costs its verify every time, which is what slows guessing down.
The file is read at start (a missing or malformed file stops `weir up` with
one line) and again when its modification time changes (looked at no more
than once a second); a file that became bad keeps the users read before
and logs why. Reloading clears the cache.
"""

from __future__ import annotations

import asyncio
import getpass
import hashlib
import logging
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Final

from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError, VerifyMismatchError

from services.auth.api import ALLOW, ClientInfo, Decision

log = logging.getLogger("weir.auth")

BAD_USER_OR_PASSWORD: Final = Decision(False, 0x86)
NOT_AUTHORIZED: Final = Decision(False, 0x87)
CACHE_TTL_S: Final = 300.0  # a verified (user, password) pair skips argon2 for this long
CACHE_ENTRIES: Final = 100_000  # about 10 MiB at most; past it the cache starts over
RELOAD_CHECK_S: Final = 1.0  # the file's mtime is looked at no more often than this


class PasswordFileError(Exception):
    """The file cannot be read or has a malformed line; the message is one line."""


def parse(text: str, source: str) -> dict[str, str]:
    users: dict[str, str] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        user, sep, hashed = line.partition(":")
        if not sep or not user or not hashed.startswith("$argon2"):
            raise PasswordFileError(
                f"{source} line {number}: expected user:argon2-hash (weir passwd writes them)"
            )
        users[user] = hashed
    return users


def read(path: Path) -> dict[str, str]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise PasswordFileError(f"password file {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise PasswordFileError(f"password file {path}: not UTF-8") from None
    return parse(text, f"password file {path}")


class PasswordFile:
    def __init__(
        self,
        path: str | Path,
        allow_anonymous: bool = False,
        reload_check_s: float = RELOAD_CHECK_S,
    ) -> None:
        self.path = Path(path)
        self.allow_anonymous = allow_anonymous
        self.reload_check_s = reload_check_s
        self.hasher = PasswordHasher()
        self.users = read(self.path)  # raises PasswordFileError: the node does not start
        self._mtime = self._stat()
        self._checked = time.monotonic()
        self._verified: dict[bytes, float] = {}

    def _stat(self) -> float | None:
        try:
            return self.path.stat().st_mtime
        except OSError:
            return None

    def _maybe_reload(self) -> None:
        now = time.monotonic()
        if now - self._checked < self.reload_check_s:
            return
        self._checked = now
        mtime = self._stat()
        if mtime == self._mtime:
            return
        self._mtime = mtime
        try:
            self.users = read(self.path)
        except PasswordFileError as exc:
            log.warning("%s; keeping the %d users read before", exc, len(self.users))
            return
        self._verified.clear()
        log.info("password file %s reloaded: %d users", self.path, len(self.users))

    async def authenticate(self, client: ClientInfo, password: bytes | None) -> Decision:
        self._maybe_reload()
        user = client.username
        if user is None:
            return ALLOW if self.allow_anonymous else NOT_AUTHORIZED
        hashed = self.users.get(user)
        if hashed is None or password is None:
            return BAD_USER_OR_PASSWORD
        key = hashlib.sha256(user.encode() + b"\0" + hashed.encode() + b"\0" + password).digest()
        now = time.monotonic()
        if self._verified.get(key, 0.0) > now:
            return ALLOW
        if not await asyncio.to_thread(self._verify, hashed, password):
            return BAD_USER_OR_PASSWORD
        if len(self._verified) >= CACHE_ENTRIES:
            self._verified.clear()
        self._verified[key] = now + CACHE_TTL_S
        return ALLOW

    def _verify(self, hashed: str, password: bytes) -> bool:
        try:
            return self.hasher.verify(hashed, password)
        except (VerifyMismatchError, VerificationError, InvalidHashError):
            return False


# -- weir passwd ------------------------------------------------------------------

USAGE: Final = "usage: weir passwd FILE USER [--delete] [--password-stdin]"


def set_user(path: Path, user: str, password: str | None) -> None:
    """Add or change `user` (None: delete it), keeping every other line;
    the file is written whole (a temporary file renamed over it), mode 0600."""
    lines = path.read_text(encoding="utf-8").splitlines() if path.exists() else []
    parse("\n".join(lines), f"password file {path}")  # refuse to rewrite a broken file
    kept = [line for line in lines if line.strip().partition(":")[0] != user]
    if password is not None:
        kept.append(f"{user}:{PasswordHasher().hash(password)}")
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        out.write("\n".join(kept) + ("\n" if kept else ""))
    os.replace(tmp, path)


def main(argv: Sequence[str]) -> int:
    args = [a for a in argv if not a.startswith("--")]
    flags = {a for a in argv if a.startswith("--")}
    if len(args) != 2 or flags - {"--delete", "--password-stdin"}:
        print(USAGE, file=sys.stderr)
        return 2
    path, user = Path(args[0]), args[1]
    if ":" in user or not user.strip() or user != user.strip():
        print("weir passwd: a user name cannot contain ':' or surrounding spaces", file=sys.stderr)
        return 2
    try:
        if "--delete" in flags:
            set_user(path, user, None)
            return 0
        if "--password-stdin" in flags:
            password = sys.stdin.readline().rstrip("\n")
        else:
            password = getpass.getpass(f"password for {user}: ")
            if getpass.getpass("again: ") != password:
                print("weir passwd: the passwords differ", file=sys.stderr)
                return 2
        if not password:
            print("weir passwd: empty password", file=sys.stderr)
            return 2
        set_user(path, user, password)
    except (PasswordFileError, OSError) as exc:
        print(f"weir passwd: {exc}", file=sys.stderr)
        return 1
    return 0
