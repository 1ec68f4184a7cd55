"""The servers a command reads: one, or every master of a Redis Cluster.

A keyspace lives on one server, or is split over the masters of a Redis Cluster by slot. The
helpers below never send a keyless or multi-key command through a RedisCluster: they SCAN
each master (a SCAN sees one node's keys only), and read each primitive's keys on the master
of their slot, in one plain pipeline per master, with that master's own TIME (the deadlines
in a primitive's keys are that master's clock). On one server, ``servers`` is that server.

``distlock status``, ``list`` and ``release`` (``state``) and ``distlock top`` (``top``) read
through these: ``servers`` to SCAN, ``by_server`` to group reads by the master of their slot,
``execute`` to run a pipeline of reads, and ``routed`` to read again on a fresh slot map when a
slot moved meanwhile.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Dict, Iterator, List, Sequence, Set, Tuple, TypeVar

import redis
from redis.exceptions import AskError, ClusterDownError, RedisClusterException, TryAgainError

from .._redis import is_cluster
from .inspect import pipeline_reply

__all__ = ["servers", "server_of", "by_server", "scan_keys", "execute", "routed", "time_ms",
           "SCAN_COUNT", "READ_AGAIN_BOUND"]

#: keys per SCAN call: a hint to the server, which walks about that many buckets per call
SCAN_COUNT = 1000

T = TypeVar("T")

#: How long (seconds) the reads of one command are done again on a cluster whose slot map
#: changed under them (a redirection, a master replaced), each time on a fresh slot map.
READ_AGAIN_BOUND = 2.0

#: replies that mean "not on this node (now)": the slot moved, is moving, or the cluster is
#: reconfiguring; the reads are done again on a fresh slot map (``routed``)
_REDIRECTS = (AskError, TryAgainError, ClusterDownError)


def servers(client: Any) -> List[Any]:
    """Every server whose keys together are the keyspace: ``client`` itself, or for a
    ``redis.RedisCluster`` a ``redis.Redis`` per master, as its slot map knows them."""
    if is_cluster(client):
        return [client.get_redis_connection(node) for node in client.get_primaries()]
    return [client]


def server_of(client: Any, key: Any) -> Any:
    """The server that holds ``key``: ``client`` itself, or the master of its slot."""
    if is_cluster(client):
        return client.get_redis_connection(client.get_node_from_key(key))
    return client


def by_server(client: Any, keys: Sequence[Any]) -> List[Tuple[Any, List[int]]]:
    """The indexes of ``keys`` grouped by the server that holds each: (server, indexes), in
    the order of each server's first key; one group on one server."""
    groups: Dict[int, Tuple[Any, List[int]]] = {}
    for i, key in enumerate(keys):
        server = server_of(client, key)
        groups.setdefault(id(server), (server, []))[1].append(i)
    return list(groups.values())


def time_ms(reply: Any) -> int:
    """A TIME reply, in ms."""
    seconds, micros = reply
    return int(seconds) * 1000 + int(micros) // 1000


def execute(pipe: Any) -> List[Any]:
    """Run a pipeline of reads: a redirection (MOVED, ASK, TRYAGAIN, CLUSTERDOWN) raises, for
    ``routed`` to read again; otherwise each reply as ``pipeline_reply`` reads it."""
    replies = pipe.execute(raise_on_error=False)
    for reply in replies:
        if isinstance(reply, _REDIRECTS):
            raise reply
    return [pipeline_reply(r) for r in replies]


def routed(client: Any, work: Callable[[], T]) -> T:
    """``work()``, which only reads (safe to do again). On a cluster, when a node redirects
    one of its reads (MOVED, ASK, TRYAGAIN, CLUSTERDOWN), the slot map is read again and
    ``work()`` done again; so too when a node cannot be reached and the fresh slot map names
    other masters (a failover): for at most ``READ_AGAIN_BOUND`` seconds. An unreachable node
    that is still a master of the slot map is an error at once, as on one server."""
    give_up = time.monotonic() + READ_AGAIN_BOUND
    pause = 0.01
    while True:
        try:
            return work()
        except _REDIRECTS:
            if not is_cluster(client) or time.monotonic() + pause > give_up:
                raise
            _read_slot_map(client)
        except (redis.ConnectionError, redis.TimeoutError):
            if not is_cluster(client):
                raise
            before = _master_names(client)
            _read_slot_map(client)
            if _master_names(client) == before or time.monotonic() + pause > give_up:
                raise  # no other master to read from (yet)
        time.sleep(pause)
        pause = min(pause * 2, 0.2)


def _master_names(client: Any) -> Set[str]:
    return {node.name for node in client.get_primaries()}


def _read_slot_map(client: Any) -> None:
    try:
        client.nodes_manager.initialize()
    except (redis.RedisError, RedisClusterException):
        pass  # the next try meets the same trouble, and raises it


def scan_keys(server: Any, match: str, count: int = SCAN_COUNT) -> Iterator[Any]:
    """Every key of one server that matches ``match``: SCAN to the end, never KEYS."""
    cursor: Any = 0
    while True:
        cursor, keys = server.scan(cursor=cursor, match=match, count=count)
        yield from keys
        if int(cursor) == 0:
            return
