"""A local Redis Cluster: 3 primaries and 3 replicas on free loopback ports.

For the tests and `weir bench` only (a deployment runs its own cluster):
six `redis-server --cluster-enabled yes` processes, then `redis-cli --cluster
create ... --cluster-replicas 1`, then a wait until every node reports
`cluster_state:ok` and knows all six. The node timeout is short
(`NODE_TIMEOUT_MS`) so a killed primary's replica takes over within a
couple of seconds, which the chaos test relies on.

`failover(port)` promotes a replica by hand (CLUSTER FAILOVER on it: the
primary hands over its slots without losing a write); `kill(port)` SIGKILLs
a node, after which its replica is elected once the node timeout passes.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import redis

from services.embedded.redis_server import RedisServer, RedisServerError
from services.ports import free_port

NODE_TIMEOUT_MS = 1000  # a dead primary is failed over about 2 timeouts later
READY_TIMEOUT_S = 30.0  # create + gossip on a loaded 2-core machine
PRIMARIES = 3


@dataclass
class LocalRedisCluster:
    data_dir: Path
    profile: str = "default"
    nodes: list[RedisServer] = field(default_factory=list)

    @property
    def url(self) -> str:
        seeds = ",".join(f"127.0.0.1:{n.port}" for n in self.nodes[:PRIMARIES])
        return f"redis+cluster://{seeds}"

    @property
    def ports(self) -> list[int]:
        return [n.port for n in self.nodes]

    def start(self) -> LocalRedisCluster:
        cli = shutil.which("redis-cli")
        if cli is None:
            raise RedisServerError("redis-cli not found on PATH: install Redis 7")
        extra = (
            "cluster-enabled yes",
            "cluster-config-file nodes.conf",
            f"cluster-node-timeout {NODE_TIMEOUT_MS}",
            "cluster-require-full-coverage no",  # the other shards answer during a failover
            "repl-diskless-sync-delay 0",  # a replica's first sync at once, not 5 s later
        )
        try:
            for i in range(2 * PRIMARIES):
                # the bus port defaults to port + 10000, past 65535 for many free ports
                bus = (f"cluster-port {free_port()}",)
                node = RedisServer(self.data_dir / f"node{i}", self.profile, extra=extra + bus)
                self.nodes.append(node.start())
            create = [cli, "--cluster", "create",
                      *(f"127.0.0.1:{p}" for p in self.ports),
                      "--cluster-replicas", "1", "--cluster-yes"]  # fmt: skip
            done = subprocess.run(create, capture_output=True, text=True, timeout=60, check=False)
            if done.returncode != 0:
                raise RedisServerError(f"redis-cli --cluster create: {done.stdout[-400:]}")
            self.wait_ok()
        except BaseException:
            self.stop()
            raise
        return self

    def _client(self, port: int) -> redis.Redis:
        return redis.Redis(port=port, socket_timeout=2, socket_connect_timeout=2)

    def _info(self, port: int) -> dict[str, str]:
        with self._client(port) as client:
            text = client.execute_command("CLUSTER", "INFO")
        text = text.decode() if isinstance(text, bytes) else str(text)
        return dict(line.split(":", 1) for line in text.split() if ":" in line)

    def _replicated(self, port: int) -> bool:
        """The primary on `port` has a replica whose link is up (a primary
        whose replica was killed counts as replicated: nothing to wait for)."""
        with self._client(port) as client:
            info = client.info("replication")
        if info.get("role") != "master":
            return True
        live = sum(1 for n in self.nodes if n.process is not None)
        if live < len(self.nodes):
            return True
        slaves = [v for k, v in info.items() if k.startswith("slave") and isinstance(v, dict)]
        return any(s.get("state") == "online" for s in slaves)

    def wait_ok(self, timeout_s: float = READY_TIMEOUT_S) -> None:
        """Until every live node says the cluster is whole (state ok, all slots
        served, every live node known) and every primary's replica is in sync
        (so `--redis-wait 1` is met from the first write)."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                live = [n.port for n in self.nodes if n.process is not None]
                infos = [self._info(p) for p in live]
                if all(i.get("cluster_state") == "ok" and i.get("cluster_slots_ok") == "16384"
                       and int(i.get("cluster_known_nodes", 0)) >= len(live)
                       for i in infos) and all(self._replicated(p) for p in live):  # fmt: skip
                    return
            except (redis.RedisError, OSError):
                pass
            if time.monotonic() > deadline:
                raise RedisServerError(f"redis cluster not ok within {timeout_s} s")
            time.sleep(0.05)

    def primaries(self) -> list[int]:
        """The ports of the live nodes that are primaries now."""
        out = []
        for node in self.nodes:
            if node.process is None:
                continue
            with self._client(node.port) as client:
                role = client.execute_command("ROLE")
            if role[0] in (b"master", "master"):
                out.append(node.port)
        return out

    def replica_of(self, primary: int) -> int:
        """The port of a live replica of the primary on `primary`."""
        for node in self.nodes:
            if node.process is None or node.port == primary:
                continue
            with self._client(node.port) as client:
                role = client.execute_command("ROLE")
            if role[0] in (b"slave", "slave") and int(role[2]) == primary:
                return node.port
        raise RedisServerError(f"no live replica of 127.0.0.1:{primary}")

    def failover(self, replica: int) -> None:
        """CLUSTER FAILOVER on `replica` once its link to its primary is up,
        then wait until it is a primary. A manual failover that does not
        complete (Redis gives up after a few node timeouts, e.g. when the
        replica had just been resynced) is asked for again."""
        deadline = time.monotonic() + READY_TIMEOUT_S
        asked = 0.0
        while replica not in self.primaries():
            if time.monotonic() > deadline:
                raise RedisServerError(f"127.0.0.1:{replica} not promoted in {READY_TIMEOUT_S} s")
            with self._client(replica) as client:
                linked = client.info("replication").get("master_link_status") == "up"
                if linked and time.monotonic() - asked > 4 * NODE_TIMEOUT_MS / 1000:
                    client.execute_command("CLUSTER", "FAILOVER")
                    asked = time.monotonic()
            time.sleep(0.05)

    def kill(self, port: int) -> None:
        """SIGKILL the node on `port` (its replica takes over after the node timeout)."""
        for node in self.nodes:
            if node.port == port:
                node.kill()
                return
        raise RedisServerError(f"no node on 127.0.0.1:{port}")

    def flush(self) -> None:
        for port in self.primaries():
            with self._client(port) as client:
                client.flushall()

    def stop(self) -> None:
        for node in reversed(self.nodes):
            node.stop()

    def __enter__(self) -> LocalRedisCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
