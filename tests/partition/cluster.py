"""Two nodes, Redis and the embedded Kafka, each in a network namespace of its own.

Parties and links (tests.partition.netns): nodes `a` and `b` each linked to
`redis`, to `kafka` and to each other, and the clients' namespace `clients`
linked to each node (not to the backends). Redis (appendfsync always) and
Tansu listen on their identity addresses, each node on its own (MQTT on
1883 and its cluster link beside it); ports are fixed, the namespaces being
private. Clients reach a node through `Node` (a `tests.chaos.harness.Dialer`),
which keeps its open connections so a test can drop them the way a client's
keep-alive would notice a dead link.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from services.embedded.kafka import broker_binary
from tests.chaos.harness import REPO
from tests.partition.netns import Topology, reachable, socket_in, stop

MQTT_PORT = 1883
REDIS_PORT = 6379
KAFKA_PORT = 9092
CLUSTER_TTL_S = 2.0  # short, so a partition longer than it is a death the suite can afford
START_TIMEOUT_S = 30.0  # a node's start (Kafka topics, replay) takes 1-3 s here; 2 busy cores
NODES = ("a", "b")


@dataclass(eq=False)
class Node:
    """One node as the clients see it: dial it from the clients' namespace."""

    name: str
    topology: Topology
    log_path: Path
    process_args: list[str]
    links: set[asyncio.StreamWriter] = field(default_factory=set)
    process: subprocess.Popen[bytes] | None = None

    @property
    def host(self) -> str:
        return self.topology.address(self.name)

    async def dial(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        sock = socket_in(self.topology.ns("clients"))
        try:
            await asyncio.get_running_loop().sock_connect(sock, (self.host, MQTT_PORT))
        except BaseException:
            sock.close()
            raise
        reader, writer = await asyncio.open_connection(sock=sock)
        self.links = {w for w in self.links if not w.is_closing()}
        self.links.add(writer)
        return reader, writer

    def drop_clients(self) -> int:
        """Abort every connection to this node on the clients' side (what a client
        does when its keep-alive finds the link dead); how many there were."""
        live = [w for w in self.links if not w.is_closing()]
        for writer in live:
            writer.transport.abort()
        self.links.clear()
        return len(live)

    def ready(self) -> bool:
        if self.process is not None and self.process.poll() is not None:
            raise RuntimeError(f"node {self.name} exited; log tail:\n{self.log_tail()}")
        return reachable(self.topology.ns("clients"), self.host, MQTT_PORT)

    def log_tail(self, lines: int = 30) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        return "(no log)"


@dataclass
class Cluster:
    topology: Topology
    nodes: dict[str, Node]
    work: Path
    ttl_s: float = CLUSTER_TTL_S

    @property
    def redis_url(self) -> str:
        return f"redis://{self.topology.address('redis')}:{REDIS_PORT}/0"

    @property
    def bootstrap(self) -> str:
        return f"{self.topology.address('kafka')}:{KAFKA_PORT}"

    def verify(self) -> list[str]:
        """`weir streams verify` from node a's namespace: the differences between the
        log's replay and the live nodes' views. The state store is left out: no store
        job runs here (its Spark JVM would cost more than the whole suite)."""
        code, out = self.weir(
            "a", "streams", "verify", "--redis", self.redis_url, "--kafka", self.bootstrap,
            "--timeout", "2",
        )  # fmt: skip
        lines = out.splitlines()
        own = [ln for ln in lines if ln.startswith("weir streams verify:")]  # its progress too
        summary = [ln for ln in own if "live node" in ln]
        assert code in (0, 1) and summary, out
        assert "2 live nodes (a, b)" in summary[-1], out
        return [ln for ln in lines if ln not in own and not ln.startswith("state store")]

    def keep_logs(self) -> Path:
        """Copy the processes' logs where pytest's temp-dir rotation leaves them."""
        kept = Path(tempfile.mkdtemp(prefix="weir-partition-"))
        for log in self.work.glob("*.log"):
            shutil.copy(log, kept / log.name)
        return kept

    def weir(self, party: str, *args: str, timeout: float = 60.0) -> tuple[int, str]:
        """`python -m services ARGS` inside a party's namespace: exit code, stdout + stderr."""
        done = self.topology.run_in(
            party, [sys.executable, "-m", "services", *args], timeout=timeout
        )
        return done.returncode, done.stdout + done.stderr


def build(work: Path) -> Cluster:
    """Namespaces, links, backends and both nodes, ready for clients (raises
    NetnsUnavailable where namespaces cannot be made); on any failure what was made is gone."""
    topology = Topology()
    try:
        return _build(Cluster(topology, {}, work))
    except BaseException:
        topology.close()
        raise


def _build(cluster: Cluster) -> Cluster:
    topology, work = cluster.topology, cluster.work
    for party in ("redis", "kafka", *NODES, "clients"):
        topology.add_party(party)
    for node in NODES:
        topology.connect(node, "redis")
        topology.connect(node, "kafka")
        topology.connect("clients", node)
    topology.connect(*NODES)

    redis_dir = work / "redis"
    redis_dir.mkdir(parents=True)
    address = topology.address
    topology.spawn("redis", [
        "redis-server", "--bind", address("redis"), "--port", str(REDIS_PORT),
        # fsync every second, not every write: the faults here are links, not crashes,
        # and an fsync stall on this shared machine's disk fenced both nodes once
        "--dir", str(redis_dir), "--save", "", "--appendonly", "yes",
        "--appendfsync", "everysec",
        "--protected-mode", "no",  # reached over the test's veths only, in private namespaces
    ], (work / "redis.log").open("ab"))  # fmt: skip
    kafka_url = f"tcp://{cluster.bootstrap}"
    topology.spawn("kafka", [
        broker_binary(), "broker", "--listener-url", kafka_url,
        "--advertised-listener-url", kafka_url, "--storage-engine", "memory://tansu/",
    ], (work / "kafka.log").open("ab"))  # fmt: skip
    for party, port in (("redis", REDIS_PORT), ("kafka", KAFKA_PORT)):
        _wait(lambda party=party, port=port: reachable(topology.ns("a"), address(party), port),
              f"{party} to listen")  # fmt: skip

    for name in NODES:
        args = [
            "--host", address(name), "--mqtt-port", str(MQTT_PORT), "--ws-port", "off",
            "--http-port", "off", "--node-id", name, "--data-dir", str(work / name),
            "--redis", cluster.redis_url, "--kafka", cluster.bootstrap,
            "--cluster-ttl", str(CLUSTER_TTL_S), "--allow-anonymous",
        ]  # fmt: skip
        node = Node(name, topology, work / f"{name}.log", args)
        cluster.nodes[name] = node
        start_node(cluster, node)
    for node in cluster.nodes.values():
        _wait(node.ready, f"node {node.name} to accept MQTT", node)
    return cluster


def start_node(cluster: Cluster, node: Node) -> None:
    argv = [sys.executable, "-m", "services", "up", *node.process_args]
    node.process = cluster.topology.spawn(node.name, argv, node.log_path.open("ab"), cwd=REPO)


def _wait(check: object, what: str, node: Node | None = None) -> None:
    assert callable(check)
    deadline = time.monotonic() + START_TIMEOUT_S
    while not check():
        if time.monotonic() > deadline:
            tail = f"; log tail:\n{node.log_tail()}" if node else ""
            raise RuntimeError(f"timed out waiting for {what}{tail}")
        time.sleep(0.05)


__all__ = ["CLUSTER_TTL_S", "Cluster", "Node", "build", "stop"]
