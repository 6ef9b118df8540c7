"""What a Redis URL names: one Redis (`redis://`, `rediss://`, `unix://`,
redis-py's own forms) or a Redis Cluster, `redis+cluster://HOST:PORT[,HOST:PORT...]`
(`redis-cluster://` too): seed nodes, any of the cluster's, from which the
client reads the slot map. `user:password@` before the first node applies to
every node; no database number (a cluster has only 0) and no TLS (yet).
"""

from __future__ import annotations

from typing import cast

import redis
import redis.cluster

CLUSTER_SCHEMES = ("redis+cluster://", "redis-cluster://")


def is_cluster_url(url: str) -> bool:
    return url.startswith(CLUSTER_SCHEMES)


def cluster_nodes(url: str) -> tuple[list[tuple[str, int]], str | None, str | None]:
    """The seed nodes, user name and password of a `redis+cluster://` URL;
    ValueError (one line) when it names none or a port is not a number."""
    rest = url.split("://", 1)[1].split("/", 1)[0].split("?", 1)[0]
    user = password = None
    if "@" in rest:
        auth, rest = rest.rsplit("@", 1)
        user, sep, password = auth.partition(":")
        if not sep:
            user, password = None, user
        user = user or None
    nodes: list[tuple[str, int]] = []
    for part in rest.split(","):
        host, sep, port = part.strip().rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65_536:
            raise ValueError(f"expected redis+cluster://HOST:PORT[,HOST:PORT...], got {url!r}")
        nodes.append((host.strip("[]"), int(port)))
    return nodes, user, password


def connect_sync(url: str, timeout: float) -> redis.Redis:
    """A blocking client on `url` for the command-line tools (`weir passwd
    --redis`): a cluster client for `redis+cluster://`, else one on one Redis;
    typed as the latter, as `connect`'s is."""
    if is_cluster_url(url):
        nodes, user, password = cluster_nodes(url)
        seeds = [redis.cluster.ClusterNode(h, p) for h, p in nodes]  # type: ignore[no-untyped-call]
        return cast(redis.Redis, redis.cluster.RedisCluster(
            startup_nodes=seeds, username=user, password=password,
            socket_timeout=timeout, socket_connect_timeout=timeout,
        ))  # fmt: skip
    return redis.Redis.from_url(url, socket_timeout=timeout, socket_connect_timeout=timeout)
