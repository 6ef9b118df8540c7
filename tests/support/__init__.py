"""Helpers shared by test modules: no tests and no fixtures (those stay in conftest.py).

- `wait`: wait for a condition with a deadline (blocking, and in asyncio);
- `ports`: a free loopback TCP port;
- `backend_node`: a node on real Redis and Kafka, in its own thread;
- `eventlog`: read a Kafka event log back.
"""
