"""Fixtures shared by every test layer live in tests/fixtures/*, one module per service."""

import os

# Every node a test starts as a process (weir up, the nodes of a supervisor)
# takes a free HTTP port instead of 18083, so two of them (one test's
# cluster, or test runs side by side) never meet there. In-process nodes get
# no HTTP port unless a test asks (tests/integration/conftest.node_settings).
os.environ["WEIR_HTTP_PORT"] = "0"

pytest_plugins = [
    "tests.fixtures.containers",
    "tests.fixtures.redis_server",
    "tests.fixtures.kafka_broker",
    "tests.support.parallel",  # --part and the xdist groups of scripts/test.sh
]
