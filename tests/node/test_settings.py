from __future__ import annotations

from pathlib import Path

import pytest

import services.config as settings
from services.config import ENV_VARS, SettingsError, load


def test_defaults() -> None:
    s = load({}, env={})
    assert s.listeners.mqtt_port == 1883
    assert s.listeners.ws_port == 8083
    assert s.listeners.host == "127.0.0.1"  # loopback, as Mosquitto 2 without a listener
    assert s.allow_anonymous is False
    assert s.limits.queue_limit == 1000
    assert s.kafka_topic_prefix == "weir."
    assert s.redis_url is None and s.kafka_bootstrap is None


def test_env_vars_are_the_fixed_names() -> None:
    assert {
        "WEIR_NODE_ID",
        "WEIR_MQTT_HOST",
        "WEIR_MQTT_PORT",
        "WEIR_WS_PORT",
        "WEIR_DATA_DIR",
        "WEIR_REDIS_URL",
        "WEIR_KAFKA_BOOTSTRAP",
        "WEIR_KAFKA_TOPIC_PREFIX",
        "WEIR_ALLOW_ANONYMOUS",
        "WEIR_PASSWORD_FILE",
        "WEIR_ACL_FILE",
        "WEIR_ACL_NO_MATCH",
        "WEIR_ACL_REDIS",
        "WEIR_AUTH_REDIS",
        "WEIR_AUTH_HTTP",
        "WEIR_JWT_SECRET",
        "WEIR_JWT_PUBLIC_KEY",
        "WEIR_JWT_JWKS",
        "WEIR_HTTP_PORT",
        "WEIR_HTTP_HOST",
        "WEIR_HTTP_CERTFILE",
        "WEIR_HTTP_KEYFILE",
        "WEIR_HTTP_ALLOW_INSECURE",
        "WEIR_API_KEY_FILE",
        "WEIR_REDIS_WAIT",  # main's --redis-wait and --sys-client-events
        "WEIR_SYS_CLIENT_EVENTS",
        "WEIR_LOG_LEVEL",
        "WEIR_CONFIG",
    } == ENV_VARS
    read = {o.env for o in settings.OPTIONS if o.env} | {"WEIR_CONFIG"}
    assert read == ENV_VARS


def test_env_values_are_read() -> None:
    env = {
        "WEIR_NODE_ID": "n7",
        "WEIR_MQTT_HOST": "127.0.0.1",
        "WEIR_MQTT_PORT": "2883",
        "WEIR_WS_PORT": "off",
        "WEIR_DATA_DIR": "/tmp/x",
        "WEIR_REDIS_URL": "redis://127.0.0.1:6379/0",
        "WEIR_KAFKA_BOOTSTRAP": "127.0.0.1:9092",
        "WEIR_KAFKA_TOPIC_PREFIX": "t.",
    }
    s = load({}, env=env)
    assert s.node_id == "n7"
    assert s.listeners.host == "127.0.0.1"
    assert s.listeners.mqtt_port == 2883
    assert s.listeners.ws_port is None
    assert s.data_dir == "/tmp/x"
    assert s.redis_url == "redis://127.0.0.1:6379/0"
    assert s.kafka_bootstrap == "127.0.0.1:9092"
    assert s.kafka_topic_prefix == "t."


def test_precedence_cli_over_env_over_file(tmp_path: Path) -> None:
    config = tmp_path / "weir.toml"
    config.write_text(
        'node_id = "from-file"\n[listeners]\nmqtt_port = 1001\nws_port = 1002\n'
        "[limits]\nqueue_limit = 5\n"
    )
    env = {"WEIR_CONFIG": str(config), "WEIR_MQTT_PORT": "2001"}
    s = load({"listeners.mqtt_port": "3001", "node_id": None}, env=env)
    assert s.listeners.mqtt_port == 3001
    assert s.listeners.ws_port == 1002
    assert s.node_id == "from-file"
    assert s.limits.queue_limit == 5
    assert load({}, env=env).listeners.mqtt_port == 2001


@pytest.mark.parametrize(
    ("cli", "env", "needle"),
    [
        ({"listeners.mqtt_port": "70000"}, {}, "listeners.mqtt_port"),
        ({}, {"WEIR_MQTT_PORT": "abc"}, "WEIR_MQTT_PORT"),
        ({}, {"WEIR_REDIS_URL": "http://x"}, "redis_url"),
        ({}, {"WEIR_KAFKA_BOOTSTRAP": "nohostport"}, "kafka_bootstrap"),
        ({"config": "/nonexistent/weir.toml"}, {}, "config file"),
    ],
)
def test_bad_values_name_the_option(cli: dict[str, str], env: dict[str, str], needle: str) -> None:
    with pytest.raises(SettingsError, match=needle) as info:
        load(cli, env=env)
    assert "\n" not in str(info.value)


def test_unknown_file_key_and_bad_toml(tmp_path: Path) -> None:
    config = tmp_path / "weir.toml"
    config.write_text("[limits]\nfrobs = 3\n")
    with pytest.raises(SettingsError, match=r"limits\.frobs"):
        load({"config": str(config)}, env={})
    config.write_text("[limits\n")
    with pytest.raises(SettingsError, match="config file"):
        load({"config": str(config)}, env={})


def test_the_http_port_and_sys_interval(tmp_path: Path) -> None:
    s = load({}, env={})
    assert (s.http_port, s.http_host, s.sys_interval_s) == (18083, "127.0.0.1", 10.0)
    assert load({}, env={"WEIR_HTTP_PORT": "0"}).http_port == 0
    assert load({"http_port": "off", "sys_interval_s": "0"}, env={}).http_port is None
    config = tmp_path / "weir.toml"
    config.write_text('http_port = 9100\nhttp_host = "0.0.0.0"\nsys_interval_s = 2.5\n')
    s = load({"config": str(config)}, env={})
    assert (s.http_port, s.http_host, s.sys_interval_s) == (9100, "0.0.0.0", 2.5)
    with pytest.raises(SettingsError, match="http_port"):
        load({"http_port": "70000"}, env={})
    with pytest.raises(SettingsError, match="sys_interval_s"):
        load({"sys_interval_s": "-1"}, env={})


@pytest.mark.parametrize(
    ("host", "allow", "refused"),
    [
        ("127.0.0.1", False, False),
        ("127.0.0.2", False, False),
        ("::1", False, False),
        ("localhost", False, False),
        ("0.0.0.0", False, True),
        ("::", False, True),
        ("10.1.2.3", False, True),
        ("broker.example", False, True),
        ("0.0.0.0", True, False),
    ],
)
def test_a_listener_beyond_loopback_needs_allow_anonymous(
    host: str, allow: bool, refused: bool
) -> None:
    s = load({"listeners.host": host, "allow_anonymous": allow}, env={})
    error = settings.exposure_error(s)
    assert (error is not None) == refused
    if error is not None:
        assert host in error and "allow_anonymous" in error and "\n" not in error
    with_users = load({"listeners.host": host, "password_file": "/etc/weir/passwd"}, env={})
    assert settings.exposure_error(with_users) is None  # clients authenticate


def test_allow_anonymous_from_env_file_and_cli(tmp_path: Path) -> None:
    assert load({}, env={"WEIR_ALLOW_ANONYMOUS": "true"}).allow_anonymous is True
    assert load({}, env={"WEIR_ALLOW_ANONYMOUS": "0"}).allow_anonymous is False
    config = tmp_path / "weir.toml"
    config.write_text("allow_anonymous = true\n")
    assert load({"config": str(config)}, env={}).allow_anonymous is True
    with pytest.raises(SettingsError, match="WEIR_ALLOW_ANONYMOUS"):
        load({}, env={"WEIR_ALLOW_ANONYMOUS": "maybe"})


def test_shared_subscription_settings_follow_emqx(tmp_path: Path) -> None:
    """EMQX's name and default (broker.shared_subscription_strategy = round_robin);
    the local preference is off unless asked for, from the file or the command line."""
    from services.node.app import parse_args

    s = load({}, env={})
    assert (s.shared_subscription_strategy, s.shared_local) == ("round_robin", False)
    config = tmp_path / "weir.toml"
    config.write_text('shared_subscription_strategy = "sticky"\nshared_local = true\n')
    s = load({"config": str(config)}, env={})
    assert (s.shared_subscription_strategy, s.shared_local) == ("sticky", True)
    args = parse_args(["--shared-subscription-strategy", "hash_clientid", "--shared-local"])
    s = load(args, env={})
    assert (s.shared_subscription_strategy, s.shared_local) == ("hash_clientid", True)
    with pytest.raises(SettingsError, match="shared_subscription_strategy") as info:
        load({"shared_subscription_strategy": "fastest"}, env={})
    assert "\n" not in str(info.value) and "round_robin_per_group" in str(info.value)


def test_plugin_tables_and_the_log_level(tmp_path: Path) -> None:
    path = tmp_path / "weir.toml"
    path.write_text('log_level = "debug"\n[[plugin]]\nname = "a"\n[plugin.config]\nk = 1\n'
                    '[[plugin]]\nname = "b:c"\n')  # fmt: skip
    s = load({"config": str(path)}, env={})
    assert [(p.name, p.config) for p in s.plugin] == [("a", {"k": 1}), ("b:c", {})]
    assert s.log_level == "debug"
    assert load({"config": str(path)}, env={"WEIR_LOG_LEVEL": "error"}).log_level == "error"
    path.write_text('[[plugin]]\nname = "a"\n[[plugin]]\nname = "a"\n')
    with pytest.raises(SettingsError, match="plugin 'a' is named by two"):
        load({"config": str(path)}, env={})
    path.write_text('log_level = "loud"\n')
    with pytest.raises(SettingsError, match="log_level"):
        load({"config": str(path)}, env={})


def test_a_supervised_nodes_snapshot_keeps_plugins_and_the_log_level(tmp_path: Path) -> None:
    """`--nodes` / `--workers` children read a snapshot of the settings: they load
    the same plugins with the same config sections."""
    from services.config.loader import write_snapshot

    path = tmp_path / "weir.toml"
    path.write_text('log_level = "error"\n[[plugin]]\nname = "a"\n[plugin.config]\n'
                    'rules = [{ filter = "x/#" }]\n')  # fmt: skip
    s = load({"config": str(path)}, env={})
    write_snapshot(s, tmp_path / "snap.json")
    back = load({"config": str(tmp_path / "snap.json")}, env={})
    assert back.plugin == s.plugin and back.plugin[0].config == {"rules": [{"filter": "x/#"}]}
    assert back.log_level == "error"
