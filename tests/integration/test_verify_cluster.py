"""The state store and `weir streams verify` on a Redis Cluster.

Two nodes on the fixture's 3-primary cluster take test_verify's workload;
the state store is filled by the job's fold and writer (or the job itself,
where Spark's Kafka source is there) through a cluster client, and verify,
given the cluster URL, finds the store, the replay and both nodes agreeing.
Before, the job and verify refused a `redis+cluster://` URL in one line.
The store's keys share one hash tag, so each of its calls is one slot's."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.test_verify import agreeing
from tests.support.childenv import weir_env

pytestmark = [pytest.mark.redis, pytest.mark.kafka, pytest.mark.timeout(600)]


def test_the_state_store_and_verify_run_on_a_redis_cluster(
    redis_cluster_url: str, kafka_bootstrap: str, tmp_path: Path
) -> None:
    with agreeing(redis_cluster_url, kafka_bootstrap, tmp_path / "spark") as up:
        result = subprocess.run(
            [sys.executable, "-m", "services", "streams", "verify", *up.args()],
            capture_output=True, text=True, timeout=180, env=weir_env(), check=False,
        )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert "no differences" in result.stdout, result.stdout
    assert "2 live nodes (n1, n2)" in result.stdout, result.stdout
