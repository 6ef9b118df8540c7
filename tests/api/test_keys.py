"""API keys: the store contract over the data-dir file and real Redis, the
header forms, the bootstrap file's lines."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from services.api.keys import (
    ApiKey,
    FileKeyStore,
    KeyStore,
    RedisKeyStore,
    bootstrap,
    credentials,
    read_key_file,
)
from services.config import SettingsError
from services.store.redis import connect


@pytest.fixture(params=["file", "redis"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[KeyStore]:
    made: KeyStore
    if request.param == "file":
        made = FileKeyStore(str(tmp_path))
    else:
        made = RedisKeyStore(connect(request.getfixturevalue("redis_url")))
    try:
        yield made
    finally:
        await made.close()


async def test_put_get_list_delete(store: KeyStore) -> None:
    assert await store.get("a") is None and await store.all() == []
    key = ApiKey("a", "$argon2id$x", name="A", desc="d", created_at=1.5)
    await store.put(key)
    await store.put(ApiKey("b", "$argon2id$y"))
    assert await store.get("a") == key
    assert [k.api_key for k in await store.all()] == ["a", "b"]
    assert await store.delete("a") is True and await store.delete("a") is False
    assert await store.get("a") is None and [k.api_key for k in await store.all()] == ["b"]


async def test_bootstrap_stores_once_and_replaces_a_changed_secret(store: KeyStore) -> None:
    assert await bootstrap(store, [("ops", "one")]) == 1
    first = await store.get("ops")
    assert first is not None and "one" not in first.secret_hash
    assert await bootstrap(store, [("ops", "one")]) == 0  # the same secret: kept as is
    assert await store.get("ops") == first
    assert await bootstrap(store, [("ops", "two")]) == 1
    second = await store.get("ops")
    assert second is not None and second.secret_hash != first.secret_hash


def test_the_file_store_survives_a_new_process(tmp_path: Path) -> None:
    import asyncio

    asyncio.run(FileKeyStore(str(tmp_path)).put(ApiKey("k", "$argon2id$z")))
    assert (tmp_path / "apikeys.json").stat().st_mode & 0o077 == 0
    assert asyncio.run(FileKeyStore(str(tmp_path)).get("k")) == ApiKey("k", "$argon2id$z")


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        ("Basic k:s", ("k", "s")),
        ("basic  k:s:with:colons", ("k", "s:with:colons")),
        ("Basic azpz", ("k", "s")),  # base64("k:s")
        (None, None),
        ("Bearer k:s", None),
        ("Basic k:", None),
        ("Basic :s", None),
        ("Basic !!!", None),
        ("Basic", None),
    ],
)
def test_credentials(header: str | None, expected: tuple[str, str] | None) -> None:
    assert credentials(header) == expected


def test_the_key_file(tmp_path: Path) -> None:
    path = tmp_path / "keys"
    path.write_text("# comment\n\nops:s1\nci:s2:administrator\n")
    assert read_key_file(str(path)) == [("ops", "s1"), ("ci", "s2")]
    for bad, says in [("ops", "expected key:secret"), ("ops:", "expected key:secret"),
                      ("a:b:root", "unknown role"), ("a b:c", "API key")]:  # fmt: skip
        path.write_text(bad + "\n")
        with pytest.raises(SettingsError, match=says) as err:
            read_key_file(str(path))
        assert "line 1" in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(SettingsError, match="No such file"):
        read_key_file(str(tmp_path / "missing"))


def test_weir_up_with_a_bad_key_file_exits_2_with_one_line(tmp_path: Path) -> None:
    import subprocess
    import sys

    from tests.support.childenv import weir_env

    path = tmp_path / "keys"
    path.write_text("no-secret-here\n")
    done = subprocess.run(
        [sys.executable, "-m", "services", "up", "--backend", "memory", "--api-key-file",
         str(path)], check=False, capture_output=True, text=True, env=weir_env(), timeout=60,
    )  # fmt: skip
    assert done.returncode == 2
    assert done.stderr.strip().count("\n") == 0 and "expected key:secret" in done.stderr
