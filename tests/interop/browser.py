"""MQTT.js in headless Chromium over WebSocket (Debian chromium + chromium-driver, Selenium).

A page loads MQTT.js's browser bundle (tests/interop/js/node_modules/mqtt/dist)
and tests/interop/js/browser.js, which offers driver.mjs's operations to
Selenium's execute_async_script. WebSocket is a page's only transport: the
scenarios' TCP connections go over it, and TLS is not tried (the test CA
would have to be trusted by the browser).
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from pathlib import Path
from typing import Any

from tests.interop.api import Broker, ClientFailed, ConnectSpec, Unsupported
from tests.interop.mqttjs import JS, JsDriver, MqttJs
from tests.interop.mqttjs import missing as mqttjs_missing

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
)
CALL = """
const [op, args, done] = arguments;
window.weirOps[op](args).then(
  (ok) => done({ ok }),
  (err) => done({ error: String((err && err.message) || err) }),
);
"""


def missing() -> str | None:
    why = mqttjs_missing()
    if why is not None:
        return why
    if shutil.which(CHROMIUM) is None or shutil.which(CHROMEDRIVER) is None:
        return "chromium / chromium-driver are not installed (scripts/setup.sh installs them)"
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed (requirements.lock)"
    return None


class BrowserDriver:
    """One headless Chromium (fresh profile) with the page loaded."""

    def __init__(self, driver: Any, profile: tempfile.TemporaryDirectory[str]) -> None:
        self.driver = driver
        self.profile = profile

    @classmethod
    def open(cls) -> BrowserDriver:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service

        profile = tempfile.TemporaryDirectory(prefix="weir-chromium-")
        options = webdriver.ChromeOptions()
        options.binary_location = CHROMIUM
        for flag in (*FLAGS, f"--user-data-dir={profile.name}"):
            options.add_argument(flag)
        page = Path(profile.name) / "page.html"
        bundle = JS / "node_modules" / "mqtt" / "dist" / "mqtt.min.js"
        page.write_text(
            f'<!doctype html><script src="{bundle.as_uri()}"></script>'
            f'<script src="{(JS / "browser.js").as_uri()}"></script>'
        )
        driver = webdriver.Chrome(options=options, service=Service(CHROMEDRIVER))
        driver.set_script_timeout(90)
        driver.get(page.as_uri())
        return cls(driver, profile)

    async def call(self, op: str, timeout: float = 60.0, **args: Any) -> dict[str, Any]:
        answer: dict[str, Any] = await asyncio.to_thread(
            self.driver.execute_async_script, CALL, op, args
        )
        if "error" in answer:
            raise ClientFailed(f"MQTT.js (Chromium) {op}: {answer['error']}")
        result: dict[str, Any] = answer["ok"]
        return result

    async def stop(self) -> None:
        await asyncio.to_thread(self.driver.quit)
        self.profile.cleanup()


class BrowserMqttJs(MqttJs):
    """MQTT.js 5 in headless Chromium, over WebSocket only."""

    name = "chromium"

    async def _start(self) -> JsDriver:
        return await asyncio.to_thread(BrowserDriver.open)

    def _where(self, broker: Broker, spec: ConnectSpec) -> tuple[str, str | None]:
        if spec.transport == "tls":
            raise Unsupported("a page's TLS would need the test CA trusted by Chromium")
        return broker.url("ws"), None


__all__ = ["BrowserMqttJs", "missing"]
