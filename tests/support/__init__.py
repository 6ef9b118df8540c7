"""Helpers shared by test modules: no tests and no fixtures (those stay in conftest.py).

A test module imports from here, never from another test module.

- `wait`: wait for a condition with a deadline (blocking, and in asyncio);
- `ports`: a free loopback TCP port;
- `backend_node`: a node on real Redis and Kafka, in its own thread;
- `eventlog`: read a Kafka event log back;
- `channel`: building blocks of the pure Channel tests;
- `codec_golden`: golden bytes for every control packet at every level;
- `bench_cli`: run `weir bench` and parse its JSON lines;
- `live_node`: `weir up --backend memory` as a process, with its RSS and open files.
"""
