"""The HTTP port off loopback needs TLS or an explicit flag, as the MQTT
listeners need authentication; with TLS the API answers over HTTPS only."""

from __future__ import annotations

import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from services.config import SettingsError, exposure_error, load
from tests.listeners.conftest import make_pki
from tests.support.api_node import KEY, SECRET, ApiNode
from tests.support.childenv import weir_env


def test_a_non_loopback_http_port_needs_tls_or_the_flag(tmp_path: Path) -> None:
    pki = make_pki(tmp_path)
    exposed = exposure_error(load({"http_host": "0.0.0.0"}, env={}))
    assert exposed is not None and "--http-allow-insecure" in exposed and "\n" not in exposed
    assert exposure_error(load({"http_host": "0.0.0.0", "http_allow_insecure": True}, env={})) \
        is None  # fmt: skip
    tls = {"http_host": "0.0.0.0", "http_certfile": pki.certfile, "http_keyfile": pki.keyfile}
    assert exposure_error(load(tls, env={})) is None
    assert exposure_error(load({"http_host": "0.0.0.0", "http_port": "off"}, env={})) is None
    assert exposure_error(load({"http_host": "::1"}, env={})) is None
    with pytest.raises(SettingsError, match="go together"):
        load({"http_certfile": pki.certfile}, env={})
    with pytest.raises(SettingsError, match="http-certfile"):
        load({"http_certfile": pki.cafile, "http_keyfile": pki.cafile}, env={})


def test_weir_up_refuses_it_with_one_line() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "services", "up", "--backend", "memory", "--http-host", "0.0.0.0"],
        check=False, capture_output=True, text=True, env=weir_env(), timeout=60,
    )  # fmt: skip
    assert done.returncode == 2
    assert "HTTP port" in done.stderr and done.stderr.strip().count("\n") == 0


def test_the_api_over_tls(tmp_path: Path) -> None:
    pki = make_pki(tmp_path)
    node = ApiNode(tmp_path / "n", "--backend", "memory", "--http-certfile", pki.certfile,
                   "--http-keyfile", pki.keyfile)  # fmt: skip
    try:
        request = urllib.request.Request(f"https://127.0.0.1:{node.http_port}/api/v5/nodes")
        request.add_header("Authorization", f"Basic {KEY}:{SECRET}")
        with urllib.request.urlopen(request, timeout=10, context=pki.client()) as answer:
            assert answer.status == 200
        with pytest.raises(OSError):  # plain HTTP is not spoken there (reset, or no answer)
            urllib.request.urlopen(f"http://127.0.0.1:{node.http_port}/api/v5/status", timeout=5)
    finally:
        node.stop()
