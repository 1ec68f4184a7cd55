"""URLs: ``redis+cluster://`` and ``redis+sentinel://`` parsed without I/O, and the clients
made for a URL (both shells; a plain client made for a URL is kept, one per URL)."""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

import redis

_lock = threading.Lock()
_url_clients: Dict[str, redis.Redis] = {}


#: URL schemes that ask for a Redis Cluster: ``redis+cluster://host:port[,host:port...]/`` (and
#: ``rediss+cluster://`` over TLS). The rest of the URL is redis-py's own: its query options
#: (``?socket_timeout=5``, ``?password=...``) go to ``RedisCluster.from_url``.
CLUSTER_SCHEMES = ("redis+cluster://", "rediss+cluster://")


def cluster_url(url: str) -> Optional[Tuple[str, List[Tuple[str, int]]]]:
    """For a cluster URL: the plain URL of its first node for ``RedisCluster.from_url``, and
    every node it names as (host, port); None for any other URL. ValueError for a cluster URL
    without a node, or with a port that is not a number."""
    scheme = next((s for s in CLUSTER_SCHEMES if url.lower().startswith(s)), None)
    if scheme is None:
        return None
    rest = url[len(scheme):]
    cut = min([i for i in (rest.find("/"), rest.find("?")) if i >= 0], default=len(rest))
    hosts, tail = rest[:cut], rest[cut:]
    auth, _, hosts = hosts.rpartition("@")
    nodes: List[Tuple[str, int]] = []
    for part in hosts.split(","):
        host, sep, port = part.strip().rpartition(":")
        if not sep:
            host, port = port, "6379"
        if not host or not port.isdigit():
            raise ValueError(f"a cluster URL names its nodes as host:port[,host:port...], not {part!r} "
                             f"(in {url!r})")
        nodes.append((host, int(port)))
    if not nodes:
        raise ValueError(f"a cluster URL names at least one node: {url!r}")
    plain = scheme.replace("+cluster", "") + (auth + "@" if auth else "") + \
        f"{nodes[0][0]}:{nodes[0][1]}" + tail
    return plain, nodes


#: URL schemes that ask for a Sentinel-managed master:
#: ``redis+sentinel://[user:pass@]host[:port][,host[:port]...]/service_name[/db][?options]`` (and
#: ``rediss+sentinel://`` over TLS, to the sentinels and the data nodes). The spelling of the
#: Redis-Sentinel-Url package, Prefect and RedisVL; redis-py has none of its own. A sentinel's
#: port defaults to 26379. The credentials and the options are redis-py's own, for the data
#: nodes; ``sentinel_username`` / ``sentinel_password`` options authenticate to the sentinels,
#: which also get the ``socket_*`` (and, over TLS, ``ssl*``) options.
SENTINEL_SCHEMES = ("redis+sentinel://", "rediss+sentinel://")


SENTINEL_PORT = 26379


@dataclass(frozen=True)
class SentinelURL:
    """A parsed sentinel URL (``sentinel_url``): what ``Sentinel(sentinels,
    sentinel_kwargs=...).master_for(service, **kwargs)`` takes."""

    sentinels: List[Tuple[str, int]]
    service: str
    kwargs: Dict[str, Any]
    sentinel_kwargs: Dict[str, Any]


def sentinel_url(url: str) -> Optional[SentinelURL]:
    """For a sentinel URL (``SENTINEL_SCHEMES``): its parts, parsed without I/O; None for any
    other URL. ValueError for a sentinel URL without a sentinel or a service name, with a port
    or db that is not a number, or with options redis-py cannot parse."""
    scheme = next((s for s in SENTINEL_SCHEMES if url.lower().startswith(s)), None)
    if scheme is None:
        return None
    rest, _, query = url[len(scheme):].partition("?")
    hosts, _, path = rest.partition("/")
    auth, _, hosts = hosts.rpartition("@")
    sentinels: List[Tuple[str, int]] = []
    for part in hosts.split(","):
        host, sep, port = part.strip().rpartition(":")
        if not sep:
            host, port = port, str(SENTINEL_PORT)
        if not host or not port.isdigit():
            raise ValueError(f"a sentinel URL names its sentinels as host[:port][,host[:port]...], "
                             f"not {part!r} (in {url!r})")
        sentinels.append((host, int(port)))
    service, _, db = path.strip("/").partition("/")
    if not service:
        raise ValueError(f"a sentinel URL names its service: "
                         f"redis+sentinel://host:port/service_name[/db], not {url!r}")
    if db and not db.isdigit():
        raise ValueError(f"a sentinel URL's db is a number: .../service_name/db, not {db!r} (in {url!r})")
    from urllib.parse import parse_qsl, urlencode

    options = parse_qsl(query, keep_blank_values=True)
    to_sentinels = {k: v for k, v in options if k in ("sentinel_username", "sentinel_password")}
    query = urlencode([(k, v) for k, v in options if k not in to_sentinels])
    tls = scheme.startswith("rediss")
    plain = ("rediss://" if tls else "redis://") + (auth + "@" if auth else "") + "localhost" + \
        (f"/{db}" if db else "") + (f"?{query}" if query else "")
    kwargs = redis.connection.parse_url(plain)  # type: ignore[no-untyped-call]
    for key in ("host", "port", "path", "connection_class"):
        kwargs.pop(key, None)
    if tls:
        kwargs["ssl"] = True
    sentinel_kwargs = {k: v for k, v in kwargs.items() if k.startswith(("socket_", "ssl"))}
    sentinel_kwargs.update((k[len("sentinel_"):], v) for k, v in to_sentinels.items())
    return SentinelURL(sentinels, service, kwargs, sentinel_kwargs)


def _sentinel_from_url(module: Any, parsed: SentinelURL, **kwargs: Any) -> Any:
    """``module.sentinel.Sentinel(...).master_for(...)`` (``module``: ``redis`` or
    ``redis.asyncio``) for a parsed sentinel URL; ``kwargs`` go to ``master_for``, and their
    ``socket_*`` timeouts to the sentinels too where the URL sets none. Nothing connects: the
    master is looked up on the first command."""
    import importlib

    sentinel = importlib.import_module(module.__name__ + ".sentinel")
    options = dict(parsed.kwargs)
    options.update(kwargs)
    sentinel_kwargs = dict(parsed.sentinel_kwargs)
    for key, value in kwargs.items():
        if key.startswith("socket_"):
            sentinel_kwargs.setdefault(key, value)
    manager = sentinel.Sentinel(parsed.sentinels, sentinel_kwargs=sentinel_kwargs)
    client = manager.master_for(parsed.service, **options)
    if module.__name__ == "redis.asyncio":
        # the manager's connections to the sentinels are the client's too: closed with it
        # (an asyncio connection left open warns when it is collected)
        name = "aclose" if hasattr(client, "aclose") else "close"
        setattr(client, name, _closing_sentinels(getattr(client, name), manager))
    return client


def _closing_sentinels(close: Any, manager: Any) -> Any:
    async def closing(*args: Any, **kwargs: Any) -> Any:
        try:
            return await close(*args, **kwargs)
        finally:
            for node in manager.sentinels:
                await getattr(node, "aclose", node.close)()
    return closing


def check_url(url: str) -> None:
    """ValueError for a URL redis-py cannot parse. A cluster URL is only parsed (making its
    client would connect, to read the slot map), and so is a sentinel URL; any other makes its
    client, which does not connect."""
    if sentinel_url(url) is not None:
        return
    parsed = cluster_url(url)
    if parsed is None:
        _client_for_url(url)
    else:
        redis.connection.parse_url(parsed[0])  # type: ignore[no-untyped-call]


def _cluster_from_url(module: Any, url: str, parsed: Tuple[str, List[Tuple[str, int]]],
                      **kwargs: Any) -> Any:
    """``module.RedisCluster`` (``redis`` or ``redis.asyncio``) for a parsed cluster URL, with
    every node it names as a startup node; ``kwargs`` go to redis-py."""
    plain, nodes = parsed
    if len(nodes) > 1:
        kwargs["startup_nodes"] = [module.cluster.ClusterNode(host, port) for host, port in nodes]
    return module.RedisCluster.from_url(plain, **kwargs)


def client_from_url(url: str, **kwargs: Any) -> Any:
    """A new blocking client for ``url`` (``kwargs`` go to redis-py): a ``redis.RedisCluster``
    for a cluster URL (it connects now, to read the slot map), a Sentinel's ``master_for``
    client for a sentinel URL, else a ``redis.Redis``."""
    sentinel = sentinel_url(url)
    if sentinel is not None:
        return _sentinel_from_url(redis, sentinel, **kwargs)
    parsed = cluster_url(url)
    if parsed is None:
        return redis.Redis.from_url(url, **kwargs)
    return _cluster_from_url(redis, url, parsed, **kwargs)


def _client_for_url(url: str) -> Any:
    with _lock:
        client = _url_clients.get(url)
        if client is None:
            # a plain client only parses; a cluster one connects now, to read the slot map
            client = client_from_url(url)
            _url_clients[url] = client
        return client


def async_client_from_url(url: str, **kwargs: Any) -> Any:
    """``client_from_url`` for the asyncio shell: a ``redis.asyncio.RedisCluster`` for a
    cluster URL (it reads the slot map on first use), ``redis.asyncio.sentinel``'s
    ``master_for`` client for a sentinel URL, else a ``redis.asyncio.Redis``."""
    import redis.asyncio as aredis

    sentinel = sentinel_url(url)
    if sentinel is not None:
        return _sentinel_from_url(aredis, sentinel, **kwargs)
    parsed = cluster_url(url)
    if parsed is None:
        return aredis.Redis.from_url(url, **kwargs)
    return _cluster_from_url(aredis, url, parsed, **kwargs)


def _after_fork_in_child() -> None:
    global _lock
    _lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
