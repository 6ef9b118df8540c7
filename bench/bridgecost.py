"""A Kafka bridge's cost to the event loop, per bridged message.

    python -m bench.bridgecost [--mode async|sync] [--publishes 20000] [--rounds 12]
                               [--bootstrap HOST:PORT]

`KafkaBridges.publish` of a 64-byte QoS 1 message (topic `t/<n>`, four
publishers' client ids, the default key `${clientid}` and JSON envelope),
called in turns of 64 as a busy node calls it, on uvloop, against the
embedded Kafka (started here) or `--bootstrap`. Per round one JSON line: the
loop thread's CPU per publish and the process's (librdkafka's threads
included); then the rounds' minimum and median. Every record must reach
Kafka: sync waits for the turns' futures, async for nothing left buffered,
and a round with a failed or dropped record stops the run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
import uuid

from bench.onkafka import on_kafka
from services.bridge.kafka import KafkaBridges
from services.config.bridges import KafkaOut, Mode
from services.mqtt.packets import Message

TURN = 64  # publishes per loop turn
SETTLE_S = 30.0  # a round's wait for Kafka to acknowledge everything
CHECK_S = 0.01  # async: how often the buffered count is read meanwhile


async def run(bootstrap: str, mode: Mode, publishes: int, rounds: int) -> list[dict[str, float]]:
    loop = asyncio.get_running_loop()
    table = KafkaOut(name="cost", filter="t/#", topic=f"bench-{uuid.uuid4().hex[:8]}", mode=mode)
    bridges = KafkaBridges.build([table], bootstrap, loop)
    await bridges.start()
    messages = [Message(f"t/{i % 100}", bytes(64), 1, sender=f"pub-{i % 4}") for i in range(1000)]
    lines = []
    try:
        for round_ in range(rounds):
            waits: list[asyncio.Future[bool]] = []
            cpu, process = time.thread_time(), time.process_time()
            for i in range(publishes):
                answer = bridges.publish(messages[i % 1000], None)
                if isinstance(answer, asyncio.Future):
                    waits.append(answer)
                if i % TURN == TURN - 1:
                    await asyncio.sleep(0)
            cpu, process = time.thread_time() - cpu, time.process_time() - process
            await _settled(bridges, waits)
            lines.append({
                "round": round_ + 1, "publishes": publishes,
                "loop_cpu_us_per_publish": round(cpu / publishes * 1e6, 2),
                "process_cpu_us_per_publish": round(process / publishes * 1e6, 2),
            })  # fmt: skip
    finally:
        await bridges.close()
    return lines


async def _settled(bridges: KafkaBridges, waits: list[asyncio.Future[bool]]) -> None:
    """Until Kafka acknowledged the round's records (async: none left buffered)."""
    if not all(await asyncio.wait_for(asyncio.gather(*waits), SETTLE_S)):
        raise RuntimeError("Kafka refused records")
    for _ in range(round(SETTLE_S / CHECK_S)):
        stats = bridges.stats()[0]
        if not stats.buffered_records:
            break
        await asyncio.sleep(CHECK_S)  # librdkafka's count: nothing to wait on
    else:
        raise RuntimeError(f"records still buffered after {SETTLE_S:.0f} s")
    if stats.failures or stats.dropped:
        raise RuntimeError(f"{stats.failures} records failed, {stats.dropped} dropped")


def summary(lines: list[dict[str, float]]) -> dict[str, float]:
    loop = [line["loop_cpu_us_per_publish"] for line in lines]
    return {"loop_cpu_us_min": min(loop), "loop_cpu_us_median": round(statistics.median(loop), 2)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.bridgecost", description=__doc__)
    parser.add_argument("--mode", choices=[m.value for m in Mode], default=Mode.ASYNC.value)
    parser.add_argument("--publishes", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--bootstrap", help="a Kafka to use (default: the embedded one)")
    args = parser.parse_args(argv)
    if args.publishes < 1 or args.rounds < 1:
        parser.error("--publishes and --rounds must be at least 1")
    mode = Mode(args.mode)
    lines = on_kafka(args.bootstrap,
                     lambda bootstrap: run(bootstrap, mode, args.publishes, args.rounds))
    for line in lines:
        print(json.dumps(line), flush=True)
    print(json.dumps(summary(lines)), flush=True)


if __name__ == "__main__":
    main()
