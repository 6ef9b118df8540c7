"""A stand-in for a node that holds more sessions than one process has sockets.

    python -m bench.standin --redis URL --node-id A --sessions 50000 [--ttl 4]

Theory of operation. `bench.takeover --stand-in` runs this in place of node
A when A must hold more sessions than a process here can have connections
(about 19,900 open files). It does in Redis what A's CONNECTs would do, with
the node's own store classes and scripts: it joins the membership as A and
keeps beating, then for each session `tk-<run>-<i>` claims it (clean session
0, no expiry) and stores its QoS 1 will (`takeover/will/<i>`), as the
connection's open does (`SessionStore.claim`, `Wills.opened`'s
`WillStore.put`). It prints `ready <run>` when all are claimed and beats
until it is killed. The survivor then finds exactly what it finds after a
real node's death: a lapsed heartbeat, the node's session and will indexes,
and each session online there under its epoch. What it does not have: the
node's SessionOpened events in the log (the survivor's SessionClosed
versions are the store's, as after a real death) and the sockets (which die
with a node anyway).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys

from services.cluster.api import Member
from services.cluster.membership import RedisMembership, beat_interval
from services.mqtt.packets import Message
from services.session.redis import RedisSessionStore, RedisWillStore
from services.store import serial
from services.store.redis import connect
from services.tasks import each

NEVER_EXPIRES = 0xFFFFFFFF  # a 3.1.1 clean session 0: the session never expires
WIDTH = 64  # claims in flight at once
WILL_TOPIC = "takeover/will/"
UNREACHABLE = "127.0.0.1:9"  # the cluster-link address: nothing listens (discard port)


async def play(redis_url: str, node_id: str, sessions: int, ttl_s: float) -> None:
    run = os.urandom(3).hex()
    membership = RedisMembership.from_url(redis_url, ttl_s)
    await membership.join(Member(node_id, UNREACHABLE))
    beating = asyncio.ensure_future(_beat(membership, ttl_s))
    client = connect(redis_url, 30.0)
    store = RedisSessionStore(client, node=node_id)
    wills = RedisWillStore(client, node=node_id)

    async def open_one(i: int) -> bool:
        cid = f"tk-{run}-{i}"
        await store.claim(cid, node_id, False, NEVER_EXPIRES)
        blob = serial.dumps(Message(f"{WILL_TOPIC}{i}", cid.encode(), 1, sender=cid))
        await wills.put(cid, node_id, os.urandom(8).hex(), blob, 0, None, "127.0.0.2:1")
        return True

    opened = await each(range(sessions), open_one, WIDTH)
    print(f"ready {run} {opened}", flush=True)
    await beating  # until SIGKILL


async def _beat(membership: RedisMembership, ttl_s: float) -> None:
    while True:
        await membership.beat()
        await asyncio.sleep(beat_interval(ttl_s))  # the heartbeat period, as a node's


def main(argv: list[str] | None = None) -> None:
    doc = (__doc__ or "").split("\n")[0]
    parser = argparse.ArgumentParser(prog="python -m bench.standin", description=doc)
    parser.add_argument("--redis", required=True)
    parser.add_argument("--node-id", required=True)
    parser.add_argument("--sessions", type=int, required=True)
    parser.add_argument("--ttl", type=float, default=4.0)
    args = parser.parse_args(argv)
    if args.sessions < 1:
        parser.error("--sessions must be positive")
    try:
        asyncio.run(play(args.redis, args.node_id, args.sessions, args.ttl))
    except KeyboardInterrupt:
        sys.exit(130)


if __name__ == "__main__":
    main()
