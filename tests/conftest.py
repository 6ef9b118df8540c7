"""Fixtures shared by every test layer live in tests/fixtures/*, one module per service."""

pytest_plugins = [
    "tests.fixtures.containers",
    "tests.fixtures.redis_server",
    "tests.fixtures.kafka_broker",
]
