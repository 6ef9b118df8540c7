"""The protocol core's cost per PUBLISH, pure Python against mypyc-compiled.

    python -m bench.corebench [--rounds 5] [--n 50000]

Times, in CPU microseconds per operation (process time, so a busy shared
machine inflates it less than wall time), the three steps a node makes per
inbound message in services/mqtt: `codec.decode` of a QoS 0 and a QoS 1
PUBLISH (MQTT 5, a 20-byte topic, a 64-byte payload), `channel.receive` of
the decoded packet on a connected channel, and `encoding.encode` of it.
Each round runs one child process per core (WEIR_PURE=1 makes
services/mqtt import its sources; without it the compiled modules
scripts/setup.sh built), alternating, and keeps each figure's best round.
Prints a table and one JSON object on stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from functools import partial

TOPIC = "bench/device-0001/tx"
PAYLOAD = b"x" * 64


def _per_op_us(work: Callable[[], object], n: int) -> float:
    start = time.process_time()
    for _ in range(n):
        work()
    return (time.process_time() - start) / n * 1e6


def measure(n: int) -> dict[str, object]:
    """In this process: each step's CPU us per operation, and where the core came from."""
    from services.mqtt import codec
    from services.mqtt.channel import Channel
    from services.mqtt.channel_config import ChannelConfig
    from services.mqtt.encoding import encode
    from services.mqtt.packets import Connect, Publish

    level = 5
    ch = Channel(ChannelConfig(), "bench", wall_ms=lambda: 0)
    ch.receive(Connect(client_id="c1", protocol_level=level, protocol_name="MQTT"), 0.0)
    ch.session_opened(False, frozenset())
    out: dict[str, object] = {"codec": os.path.basename(codec.__file__ or "?")}
    for qos in (0, 1):
        frame = encode(Publish(TOPIC, PAYLOAD, qos=qos, packet_id=7 if qos else None), level)
        view = memoryview(frame)
        decoded = codec.decode(view, level)
        assert decoded is not None
        packet = decoded[0]
        out[f"decode_qos{qos}"] = _per_op_us(partial(codec.decode, view, level), n)
        # QoS 1 leaves a packet id in flight until routed: a fresh channel
        # per call would time its making, so QoS 0 only for the channel.
        if not qos:
            out["receive_qos0"] = _per_op_us(partial(ch.receive, packet, 1.0), n)
        out[f"encode_qos{qos}"] = _per_op_us(partial(encode, packet, level), n)
    return out


def _child(pure: bool, n: int) -> dict[str, object]:
    env = dict(os.environ)
    env.pop("WEIR_PURE", None)
    if pure:
        env["WEIR_PURE"] = "1"
    done = subprocess.run(
        [sys.executable, "-m", "bench.corebench", "--child", "--n", str(n)],
        env=env, capture_output=True, text=True, check=True,
    )
    result: dict[str, object] = json.loads(done.stdout)
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.corebench", description=__doc__)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--n", type=int, default=50_000, help="operations per figure per round")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(measure(args.n)))
        return 0
    best: dict[str, dict[str, float]] = {"pure": {}, "compiled": {}}
    origin: dict[str, object] = {}
    for _ in range(args.rounds):
        for core in ("pure", "compiled"):
            got = _child(core == "pure", args.n)
            origin[core] = got.pop("codec")
            for k, v in got.items():
                assert isinstance(v, float)
                best[core][k] = min(best[core].get(k, v), v)
    if origin["compiled"] == origin["pure"]:
        print(f"corebench: no compiled core ({origin['compiled']}); run scripts/setup.sh",
              file=sys.stderr)
        return 1
    print(f"{'CPU us per op':<16}{'pure':>8}{'compiled':>10}{'speed-up':>10}", file=sys.stderr)
    for k, pure in best["pure"].items():
        comp = best["compiled"][k]
        print(f"{k:<16}{pure:>8.2f}{comp:>10.2f}{pure / comp:>9.2f}x", file=sys.stderr)
    print(json.dumps({"rounds": args.rounds, "n": args.n, "origin": origin, "best_us": best}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
