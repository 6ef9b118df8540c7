"""The event log's appends in a burst: what N at once cost the event loop.

    python -m bench.appends [--appends 19000] [--rounds 3] [--bootstrap HOST:PORT]

N `Appender.append` calls at once (as N clients leaving together append
their sessions' ends), on uvloop, against the embedded Kafka (started here)
or `--bootstrap`. Per round one JSON line: the wall time until all were
acknowledged, the loop thread's CPU per append, the process's, and how late
a 10 ms timer ran at worst meanwhile (`max_lag_ms`: what a heartbeat or any
other timer waits). The records go to topics under a fresh prefix.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
import uuid

from bench.onkafka import on_kafka
from services.event.kafka import KafkaEventLog, KafkaSettings
from services.event.schema import SessionClosed

TICK_S = 0.01  # the lag probe's period


async def _lag(worst: list[float]) -> None:
    loop = asyncio.get_running_loop()
    while True:
        began = loop.time()
        await asyncio.sleep(TICK_S)
        worst[0] = max(worst[0], time.perf_counter() - began - TICK_S)


async def run(bootstrap: str, appends: int, rounds: int) -> list[dict[str, float]]:
    prefix = f"bench-{uuid.uuid4().hex[:8]}."
    log = KafkaEventLog(KafkaSettings(bootstrap=bootstrap, topic_prefix=prefix))
    await log.warm()
    lines = []
    try:
        for round_ in range(rounds):
            events = [
                SessionClosed(client_id=f"c{round_}-{i}", version=1, node="b", ts_ms=0,
                              reason="normal")
                for i in range(appends)
            ]
            worst = [0.0]
            probe = asyncio.create_task(_lag(worst))
            await asyncio.sleep(0)  # the probe's first timer is set
            began, cpu, process = time.perf_counter(), time.thread_time(), time.process_time()
            await asyncio.gather(*(log.append(event) for event in events))
            wall = time.perf_counter() - began
            cpu, process = time.thread_time() - cpu, time.process_time() - process
            probe.cancel()
            lines.append({
                "round": round_ + 1, "appends": appends, "wall_ms": round(wall * 1e3, 1),
                "loop_cpu_us_per_append": round(cpu / appends * 1e6, 1),
                "process_cpu_us_per_append": round(process / appends * 1e6, 1),
                "max_lag_ms": round(worst[0] * 1e3, 1),
            })  # fmt: skip
    finally:
        await log.close()
    return lines


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.appends", description=__doc__)
    parser.add_argument("--appends", type=int, default=19_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--bootstrap", help="a Kafka to use (default: the embedded one)")
    args = parser.parse_args(argv)
    if args.appends < 1 or args.rounds < 1:
        parser.error("--appends and --rounds must be at least 1")
    lines = on_kafka(args.bootstrap, lambda bootstrap: run(bootstrap, args.appends, args.rounds))
    for line in lines:
        print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main()
