"""Launchers of the embedded default's processes (a redis-server, the embedded
Kafka-protocol broker) on free loopback ports; used by `weir up` and by the
test fixtures. They import nothing else of services."""
