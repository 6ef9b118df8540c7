"""`[[bridge.kafka_out]]` tables: read into settings; a bad one is one line, exit 2."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from services.config import SettingsError, load
from services.config.bridges import ASYNC_TIMEOUT_S, DEFAULT_KEY, SYNC_TIMEOUT_S, Mode

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
