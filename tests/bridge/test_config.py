"""`[[bridge.kafka_out]]` and `[[bridge.kafka_in]]` tables: read into settings;
a bad one is one line, exit 2."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from services.config import SettingsError, load
from services.config.bridges import (
    ASYNC_LINGER_MS,
    ASYNC_TIMEOUT_S,
    DEFAULT_INFLIGHT,
    DEFAULT_KEY,
    SYNC_LINGER_MS,
    SYNC_TIMEOUT_S,
    Mode,
    OffsetReset,
)

GOOD = """
[[bridge.kafka_out]]
name = "telemetry"
filter = "tele/+/#"
topic = "mqtt-telemetry"
value = "${payload}"
headers = { device = "${clientid}", via = "weir" }
mode = "async"
bootstrap = "127.0.0.1:9092"

[[bridge.kafka_out]]
name = "alarms"
filter = "alarm"
topic = "alarms"
"""


def write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "weir.toml"
    path.write_text(text)
    return str(path)


def test_tables_are_read_with_their_defaults(tmp_path: Path) -> None:
    telemetry, alarms = load({"config": write(tmp_path, GOOD)}, env={}).bridge.kafka_out
    assert telemetry.mode == Mode.ASYNC and telemetry.key == DEFAULT_KEY
    assert telemetry.headers == (("device", "${clientid}"), ("via", "weir"))
    assert telemetry.delivery_timeout_s == ASYNC_TIMEOUT_S
    assert alarms.mode == Mode.SYNC and alarms.value is None and alarms.bootstrap is None
    assert alarms.delivery_timeout_s == SYNC_TIMEOUT_S
    # A sync PUBACK waits for the linger: shorter by default than an async record's.
    assert (alarms.batch_linger_ms, telemetry.batch_linger_ms) == (SYNC_LINGER_MS, ASYNC_LINGER_MS)
    assert SYNC_LINGER_MS < ASYNC_LINGER_MS


TABLE = '[[bridge.kafka_out]]\nname = "b"\nfilter = "t/#"\ntopic = "k"\n'

BAD = [
    ('filter = "t/#/x"', "bridge 'b': filter: filter 't/#/x': '#' must be the last level"),
    ('filter = "t/a+"', "bridge 'b': filter: filter 't/a+': a wildcard must be a whole level"),
    ('filter = "$share/g/t"', "bridge 'b': filter: filter '$share/g/t': give the plain filter"),
    ('key = "${client}"', "bridge 'b': key: unknown template variable ${client}"),
    ('headers = { h = "${x}" }', "bridge 'b': headers: unknown template variable ${x}"),
    ('value = "${payload"', "bridge 'b': value: unclosed ${"),
    ('mode = "later"', "bridge 'b': mode: must be one of 'sync' or 'async'"),
    ('topic2 = "x"', "bridge 'b': unknown key 'topic2'"),
    ('compression = "rar"', "bridge 'b': compression: must be one of"),
    ('bootstrap = "nowhere"', "bridge 'b': bootstrap: expected HOST:PORT"),
    ('linger_ms = -1', "bridge 'b': linger_ms: Input should be greater than or equal to 0"),
]


def _table(extra: str) -> str:
    key = extra.partition(" = ")[0]
    lines = [line for line in TABLE.splitlines() if not line.startswith(f"{key} =")]
    return "\n".join([*lines, extra]) + "\n"


@pytest.mark.parametrize(("extra", "error"), BAD)
def test_a_bad_table_is_one_line(tmp_path: Path, extra: str, error: str) -> None:
    with pytest.raises(SettingsError) as caught:
        load({"config": write(tmp_path, _table(extra))}, env={})
    message = str(caught.value)
    assert "\n" not in message
    assert error in message, message


def test_two_bridges_of_one_name_and_a_nameless_one(tmp_path: Path) -> None:
    with pytest.raises(SettingsError, match="two bridges are named 'b'"):
        load({"config": write(tmp_path, TABLE + TABLE)}, env={})
    with pytest.raises(SettingsError, match=r"bridge\.kafka_out 1: needs a name"):
        load({"config": write(tmp_path, TABLE.replace('name = "b"\n', ""))}, env={})


def test_a_memory_node_needs_a_bootstrap_for_its_bridges(tmp_path: Path) -> None:
    with pytest.raises(SettingsError, match="bridge 'b' needs a bootstrap"):
        load({"config": write(tmp_path, TABLE), "backend": "memory"}, env={})
    with_bootstrap = TABLE + 'bootstrap = "127.0.0.1:9092"\n'
    assert load({"config": write(tmp_path, with_bootstrap), "backend": "memory"}, env={})


@pytest.mark.parametrize("command", [["config", "check"], ["up", "--config"]])
def test_the_command_line_says_one_line_and_exits_2(tmp_path: Path, command: list[str]) -> None:
    path = write(tmp_path, _table('mode = "later"'))
    done = subprocess.run([sys.executable, "-m", "services", *command, path], check=False,
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 2, done
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "bridge 'b': mode: must be one of" in lines[0], done.stderr


IN_TABLE = '[[bridge.kafka_in]]\nname = "c"\ntopics = ["cmds"]\nmqtt_topic = "d/${key}/cmd"\n'


def test_an_in_table_is_read_with_its_defaults(tmp_path: Path) -> None:
    text = IN_TABLE + 'payload = "${header.verb}:${value}"\nqos = 2\nretain = true\n'
    (table,) = load({"config": write(tmp_path, text)}, env={}).bridge.kafka_in
    assert table.topics == ("cmds",) and table.mqtt_topic == "d/${key}/cmd"
    assert table.qos == 2 and table.retain and table.payload == "${header.verb}:${value}"
    assert table.group_id == "weir-bridge-c" and table.bootstrap is None
    assert table.offset_reset == OffsetReset.EARLIEST and table.max_inflight == DEFAULT_INFLIGHT
    (plain,) = load({"config": write(tmp_path, IN_TABLE)}, env={}).bridge.kafka_in
    assert plain.payload == "${value}" and plain.qos == 1 and not plain.retain


BAD_IN = [
    ('mqtt_topic = "d/${clientid}"', "bridge 'c': mqtt_topic: unknown template variable "
     "${clientid} (known: key, value, payload, topic, partition, offset, timestamp, header.NAME)"),
    ('mqtt_topic = "d/+/${key}"', "bridge 'c': mqtt_topic: mqtt_topic 'd/+/${key}': a topic "
     "name has no wildcard"),
    ('mqtt_topic = "$SYS/${key}"', "bridge 'c': mqtt_topic: mqtt_topic '$SYS/${key}': $ topics "
     "are the broker's"),
    ('mqtt_topic = ""', "bridge 'c': mqtt_topic: String should have at least 1 character"),
    ('payload = "${value"', "bridge 'c': payload: unclosed ${"),
    ('topics = []', "bridge 'c': topics: Tuple should have at least 1 item"),
    ('topics = ["a b"]', "bridge 'c': topics: topic 'a b': a Kafka topic is 1-249 of"),
    ('qos = 3', "bridge 'c': qos: Input should be less than or equal to 2"),
    ('offset_reset = "middle"', "bridge 'c': offset_reset: must be one of 'earliest' or 'latest'"),
    ('bootstrap = "nowhere"', "bridge 'c': bootstrap: expected HOST:PORT"),
    ('filter = "t/#"', "bridge 'c': unknown key 'filter'"),
    ('max_inflight = 0', "bridge 'c': max_inflight: Input should be greater than or equal to 1"),
]  # fmt: skip


@pytest.mark.parametrize(("extra", "error"), BAD_IN)
def test_a_bad_in_table_is_one_line(tmp_path: Path, extra: str, error: str) -> None:
    key = extra.partition(" = ")[0]
    lines = [line for line in IN_TABLE.splitlines() if not line.startswith(f"{key} =")]
    with pytest.raises(SettingsError) as caught:
        load({"config": write(tmp_path, "\n".join([*lines, extra]) + "\n")}, env={})
    message = str(caught.value)
    assert "\n" not in message
    assert error in message, message


def test_in_tables_are_named_once_across_both_kinds(tmp_path: Path) -> None:
    with pytest.raises(SettingsError, match=r"bridge\.kafka_in 1: needs a name"):
        load({"config": write(tmp_path, IN_TABLE.replace('name = "c"\n', ""))}, env={})
    with pytest.raises(SettingsError, match="two bridges are named 'c'"):
        load({"config": write(tmp_path, IN_TABLE + IN_TABLE)}, env={})
    out = TABLE.replace('name = "b"', 'name = "c"')
    with pytest.raises(SettingsError, match="two bridges are named 'c'") as caught:
        load({"config": write(tmp_path, out + IN_TABLE)}, env={})
    assert "\n" not in str(caught.value)
    with pytest.raises(SettingsError, match="bridge 'c' needs a bootstrap"):
        load({"config": write(tmp_path, IN_TABLE), "backend": "memory"}, env={})
