"""The interop matrix: every client library runs every scenario it supports.

Clients (each version pinned): MQTT.js 5 under Node.js and in headless
Chromium (package-lock.json in tests/interop/js; Debian chromium),
mosquitto_pub / mosquitto_sub (Debian mosquitto-clients), paho-mqtt, gmqtt,
aiomqtt and amqtt's client (requirements.lock). A test id is
`client-scenario`; a failure names both; a combination the client cannot do
is skipped with the reason. scenarios.py says what each scenario checks;
docs/interop.md has the table.
"""

from __future__ import annotations

import asyncio
import itertools
import uuid
from collections.abc import Callable

import pytest

from tests.interop import browser, mosquitto_cli, mqttjs
from tests.interop.api import Broker, Client, Unsupported
from tests.interop.asyncio_clients import Amqtt, Gmqtt
from tests.interop.paho_clients import AioMqtt, Paho
from tests.interop.scenarios import SCENARIOS

pytestmark = [pytest.mark.redis, pytest.mark.kafka, pytest.mark.timeout(120)]

_RUN = uuid.uuid4().hex[:6]
_COUNT = itertools.count(1)


def _mqttjs() -> Client:
    why = mqttjs.missing()
    if why is not None:
        pytest.skip(why)
    return mqttjs.MqttJs()


def _mosquitto() -> Client:
    why = mosquitto_cli.missing()
    if why is not None:
        pytest.skip(why)
    return mosquitto_cli.MosquittoCli()


def _chromium() -> Client:
    why = browser.missing()
    if why is not None:
        pytest.skip(why)
    return browser.BrowserMqttJs()


CLIENTS: dict[str, Callable[[], Client]] = {
    "mqttjs": _mqttjs,
    "mosquitto": _mosquitto,
    "paho": Paho,
    "gmqtt": Gmqtt,
    "aiomqtt": AioMqtt,
    "amqtt": Amqtt,
    "chromium": _chromium,
}


async def _run(make: Callable[[], Client], scenario: str, broker: Broker) -> str | None:
    client = make()
    tag = f"io{_RUN}{next(_COUNT)}"
    try:
        return await SCENARIOS[scenario](client, broker, tag)
    finally:
        await client.close()


@pytest.mark.parametrize("scenario", list(SCENARIOS))
@pytest.mark.parametrize("client", list(CLIENTS))
def test_interop(
    client: str, scenario: str, broker: Broker, record_property: Callable[[str, object], None]
) -> None:
    try:
        note = asyncio.run(_run(CLIENTS[client], scenario, broker))
    except Unsupported as why:
        pytest.skip(f"{client} cannot run {scenario}: {why}")
    except Exception as exc:  # a failed check, a client's error or a time-out
        raise AssertionError(f"{client} / {scenario} against {broker.name}: {exc!r}") from exc
    if note:
        record_property("note", note)
