"""Everything that talks to Redis: the scripts (``lua/``), the clients and their URLs, one
executor per topology for threads, one port per topology for asyncio, and pub/sub per topology.

This ``__init__`` is the one place where topologies are told apart. ``topology`` names a
client's; ``executor_for`` picks the blocking executor and ``async_port_class`` the asyncio
port, and each brings its topology's dispatcher (``Executor.dispatcher``, ``AsyncPort._attach``).
A variant imports its base (``executor_cluster`` imports ``executor``), never the other way:
the variants are imported here, lazily, so that a program that never meets a cluster never
imports redis-py's cluster code.

Nothing above this package looks at a client's class to learn its topology: it asks
``topology``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional

import redis

from .._core.quorum import Quorum

if TYPE_CHECKING:
    from .aport import AsyncPort
    from .executor import Executor

__all__ = ["SINGLE", "CLUSTER", "QUORUM", "topology", "executor_for", "async_port_class"]

#: One server, or Sentinel's current master: scripts go to it as they are.
SINGLE = "single"
#: Redis Cluster (``redis.RedisCluster``, ``redis.asyncio.RedisCluster``): routed by slot.
CLUSTER = "cluster"
#: Independent masters (a list given as ``client``, or the ``Quorum`` it becomes): Redlock.
QUORUM = "quorum"


def topology(client: Any) -> str:
    """``SINGLE``, ``CLUSTER`` or ``QUORUM`` for ``client``: a client of either shell, or a
    ``client=`` argument (a list or tuple of masters is a quorum; a URL or ``None`` names one
    server or cluster, which only making its client tells, so it is ``SINGLE`` here)."""
    if isinstance(client, (list, tuple, Quorum)):
        return QUORUM
    cluster = getattr(redis, "RedisCluster", None)
    if cluster is not None and isinstance(client, cluster):
        return CLUSTER
    import sys

    aredis = sys.modules.get("redis.asyncio")  # nobody holds one unless it was imported
    if aredis is not None and isinstance(client, aredis.RedisCluster):
        return CLUSTER
    return SINGLE


def executor_for(client: Any, real: Any = None, own_pool: bool = False) -> Executor:
    """The blocking executor for ``client`` (perhaps a weak proxy of the user's client
    ``real``): the Cluster executor, the Redlock executor, or the standalone one (``own_pool``:
    the session made ``client``'s pool itself)."""
    kind = topology(client if real is None else real)
    if kind == CLUSTER:
        from .executor_cluster import ClusterExecutor
        return ClusterExecutor(client, real)
    if kind == QUORUM:
        from .executor_quorum import QuorumExecutor
        return QuorumExecutor(client, real)
    from .executor import Executor
    return Executor(client, real, own_pool)


def async_port_class(client: Any) -> type[AsyncPort]:
    """The asyncio port class for an asyncio ``client`` (see ``aport``)."""
    kind = topology(client)
    if kind == CLUSTER:
        from .aport_cluster import AsyncClusterPort
        return AsyncClusterPort
    if kind == QUORUM:
        from .aport_quorum import AsyncQuorumPort
        return AsyncQuorumPort
    from .aport import AsyncPort
    return AsyncPort


def is_cluster(client: Optional[Any]) -> bool:
    """``topology(client) == CLUSTER``."""
    return topology(client) == CLUSTER
