"""Helpers shared by test modules: no tests and no fixtures (those stay in conftest.py).

- `wait`: wait for a condition with a deadline (blocking, and in asyncio);
- `ports`: a free loopback TCP port.
"""
