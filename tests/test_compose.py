"""docker-compose.yml, checked without a Docker engine: services, ports, env.

Every WEIR_* variable the file sets must be one `services.config` reads,
and must load through it into the settings the node will run with.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
NODES = ("weir1", "weir2")


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    doc = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    assert isinstance(doc, dict)
    return doc


def env_of(service: dict[str, Any]) -> dict[str, str]:
    env = service.get("environment", {})
    if isinstance(env, list):
        env = dict(item.split("=", 1) for item in env)
    return {str(k): str(v) for k, v in env.items()}


def port_pairs(service: dict[str, Any]) -> list[tuple[int, int]]:
    pairs = []
    for spec in service.get("ports", []):
        host, _, container = str(spec).rpartition(":")
        pairs.append((int(host.rpartition(":")[2]), int(container.split("/")[0])))
    return pairs


def test_services_present(compose: dict[str, Any]) -> None:
    assert set(compose["services"]) == {"kafka", "redis", *NODES, "streams-state"}


def test_kafka_is_apache_kafka_in_kraft_mode(compose: dict[str, Any]) -> None:
    kafka = compose["services"]["kafka"]
    env = env_of(kafka)
    assert kafka["image"].startswith("apache/kafka:")
    assert set(env["KAFKA_PROCESS_ROLES"].split(",")) == {"broker", "controller"}
    assert env["KAFKA_CONTROLLER_QUORUM_VOTERS"].startswith(f"{env['KAFKA_NODE_ID']}@kafka:")
    assert not any("ZOOKEEPER" in k for k in env)
    assert env["KAFKA_AUTO_CREATE_TOPICS_ENABLE"] == "false"  # Weir creates its topics
    assert "PLAINTEXT://kafka:9092" in env["KAFKA_ADVERTISED_LISTENERS"].split(",")
    assert "healthcheck" in kafka


def test_redis_has_aof(compose: dict[str, Any]) -> None:
    redis = compose["services"]["redis"]
    command = redis["command"]
    assert command[command.index("--appendonly") + 1] == "yes"
    assert any(v.endswith(":/data") for v in redis["volumes"])
    assert port_pairs(redis) == [(6379, 6379)]


def test_nodes_build_from_the_dockerfile(compose: dict[str, Any]) -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert "FROM python:3.11-slim" in dockerfile
    assert "pip install --no-cache-dir -r requirements.lock" in dockerfile
    assert "pip install --no-cache-dir --no-deps ." in dockerfile
    for name in NODES:
        node = compose["services"][name]
        assert node["build"]["dockerfile"] == "Dockerfile"
        assert node["command"] == ["weir", "up"]
        assert node["depends_on"]["kafka"]["condition"] == "service_healthy"
        assert node["depends_on"]["redis"]["condition"] == "service_healthy"


def test_node_env_vars_are_ones_settings_reads(compose: dict[str, Any]) -> None:
    from services.config import ENV_VARS

    for name in NODES:
        env = env_of(compose["services"][name])
        weir = {k for k in env if k.startswith("WEIR_")}
        assert weir, name
        assert weir <= ENV_VARS, f"{name} sets unknown {sorted(weir - ENV_VARS)}"


def test_node_env_loads_into_settings(compose: dict[str, Any]) -> None:
    from services.config import exposure_error, load

    ids = set()
    for name in NODES:
        env = env_of(compose["services"][name])
        s = load(env=env)
        ids.add(s.node_id)
        assert s.kafka_bootstrap == "kafka:9092"
        assert urlsplit(s.redis_url or "").hostname == "redis"
        assert s.kafka_topic_prefix == "weir."
        published = {container for _, container in port_pairs(compose["services"][name])}
        assert {s.listeners.mqtt_port, s.listeners.ws_port} <= published
        assert exposure_error(s) is None  # 0.0.0.0 in a container: allow_anonymous said so
    assert len(ids) == len(NODES)


def test_host_ports_do_not_collide(compose: dict[str, Any]) -> None:
    host_ports = [h for svc in compose["services"].values() for h, _ in port_pairs(svc)]
    assert len(host_ports) == len(set(host_ports))
    assert {1883, 1884, 8083, 8084} <= set(host_ports)


def test_the_state_job_runs_on_sparks_kafka_connector(compose: dict[str, Any]) -> None:
    """spark-submit with the connector of the locked PySpark, the job's entry,
    settings from WEIR_* variables, checkpoints in a volume."""
    import re

    from services.config import load

    job = compose["services"]["streams-state"]
    assert job["build"]["dockerfile"] == "Dockerfile.spark"
    assert "openjdk-17-jre-headless" in (ROOT / "Dockerfile.spark").read_text()
    command = job["command"]
    assert command[0] == "spark-submit"
    assert command[-3:] == ["/app/streams/__main__.py", "run", "state"]
    locked = re.search(r"^pyspark==(\S+)$", (ROOT / "requirements.lock").read_text(), re.M)
    assert locked is not None
    package = command[command.index("--packages") + 1]
    assert package == f"org.apache.spark:spark-sql-kafka-0-10_2.13:{locked[1]}"
    settings = load(env=env_of(job))
    assert settings.kafka_bootstrap == "kafka:9092" and settings.redis_url
    assert any(v.endswith(":" + settings.data_dir) for v in job["volumes"])
