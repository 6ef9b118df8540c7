"""`weir config`: the example file, show, check; and the declarations behind them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from services.config import OPTIONS, load
from services.config.commands import example_toml
from services.config.loader import read_file

ROOT = Path(__file__).resolve().parents[2]


def weir(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "services", *args], check=False,
                          capture_output=True, text=True, timeout=60, env=env)  # fmt: skip


def test_the_committed_example_is_what_the_declarations_give() -> None:
    committed = (ROOT / "weir.example.toml").read_text()
    assert committed == example_toml(), (
        "weir.example.toml is out of date: python -m services config example > weir.example.toml"
    )


def test_the_example_names_every_option_and_uncommented_is_the_defaults(tmp_path: Path) -> None:
    text = example_toml()
    for option in OPTIONS:
        if option.path not in ("listeners.tables", "auth", "listeners.ports", "bridge.kafka_out",
                               "bridge.kafka_in", "rule", "plugin"):
            assert f"# {option.name} = " in text, option.path
    # Every key line uncommented, but node_id and the unset ones: the file loads as the defaults.
    options = text.partition("\n# [[listener]] tables")[0]  # then the tables' examples
    names = {option.name for option in OPTIONS}
    lines = [line[2:] if line.startswith("# ") and line[2:].partition(" = ")[0] in names
             and "(not set)" not in line and "node_id" not in line
             else line for line in options.splitlines()]  # fmt: skip
    config = tmp_path / "weir.toml"
    config.write_text("\n".join(lines))
    assert len(read_file(str(config))) > 30  # the options really were uncommented
    assert load({"config": str(config)}, env={}) == load({}, env={})


def test_check_says_ok_or_one_line_naming_the_option_and_exit_2(tmp_path: Path) -> None:
    good = tmp_path / "good.toml"
    good.write_text("[listeners]\nmqtt_port = 2883\n[limits]\nqueue_full = \"drop_oldest\"\n")
    ok = weir("config", "check", str(good))
    assert ok.returncode == 0 and "ok" in ok.stdout, ok.stderr
    bad = tmp_path / "bad.toml"
    for text, needle in (
        ("[limits]\nqueue_full = \"sometimes\"\n", "limits.queue_full"),
        ("[limits]\nmax_conn_rate = \"fast\"\n", "expected a rate"),
        ("backend = \"memory\"\nacl_redis = true\n", "--backend memory has none"),
        ("[listeners]\nhost = \"0.0.0.0\"\n", "not loopback"),
        ("[[listener]]\nname = \"x\"\ntype = \"tcp\"\nport = 70000\n", "listener 'x': port:"),
        ("[[auth]]\nbackend = \"jwt\"\n", "give one of secret, public_key, jwks"),
    ):
        bad.write_text(text)
        result = weir("config", "check", str(bad))
        assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
        assert result.stderr.count("\n") == 1 and needle in result.stderr, result.stderr
        assert result.stderr.startswith(f"weir config check: config file {bad}"), result.stderr


def test_show_says_where_each_value_came_from(tmp_path: Path) -> None:
    config = tmp_path / "weir.toml"
    config.write_text("[limits]\nqueue_limit = 5\nmax_connections = 7\n")
    env = {"PATH": "/usr/bin:/bin", "WEIR_CONFIG": str(config), "WEIR_MQTT_PORT": "2001",
           "WEIR_JWT_SECRET": "hush"}  # fmt: skip
    result = weir("config", "show", "--max-connections", "9", env=env)
    assert result.returncode == 0, result.stderr
    rows = {line.split()[0]: line for line in result.stdout.splitlines()}
    assert rows["limits.queue_limit"].endswith(f"5  [config file {config}]")
    assert rows["listeners.mqtt_port"].endswith("2001  [WEIR_MQTT_PORT]")
    assert rows["limits.max_connections"].endswith("9  [--max-connections]")
    assert rows["limits.max_packet_size"].endswith("1048576  [default]")
    assert "hush" not in result.stdout and "(secret)" in rows["jwt_secret"]


@pytest.mark.parametrize(
    ("kind", "values"),
    [
        ("enum", {"limits.queue_full": "drop_oldest"}),
        ("rate", {"limits.max_conn_rate": "5/second"}),
    ],
)
def test_enums_and_rates_are_typed_values_that_still_compare_as_text(
    kind: str, values: dict[str, str]
) -> None:
    limits = load(values, env={}).limits
    if kind == "enum":
        assert limits.queue_full == "drop_oldest" and type(limits.queue_full) is not str
    else:
        assert limits.max_conn_rate == "5/second"
        assert limits.max_conn_rate is not None and limits.max_conn_rate.item.amount == 5  # type: ignore[attr-defined]
