"""Process-wide settings and the default Redis client.

Nothing here connects: clients are created lazily and redis-py only opens a socket on the first
command. ``configure()`` may be called at any time; a lock resolves its default client on first
use, not at construction.
"""

from __future__ import annotations

import math
import os
import sys
import threading
import weakref
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Dict, List, Optional, Tuple, Union

import redis

from ._logic import check_retention, check_seconds
from ._replicas import DEFAULT_REPLICA_TIMEOUT, check_min_replicas, check_replica_timeout

#: ``Settings.barge_limit``'s default, seconds: see docs/guides/locks.rst, "Even shares"
DEFAULT_BARGE_LIMIT = 0.05

__all__ = ["Settings", "configure", "settings", "resolve_client", "ClientArg"]

ClientArg = Union["redis.Redis", "redis.RedisCluster", str, "List[Any]", "Tuple[Any, ...]", None]

DEFAULT_URL = "redis://localhost:6379/0"


@dataclass(frozen=True)
class Settings:
    """Tunables shared by every primitive of this process.

    - ``prefix``: the start of every key and channel (``distlock:``).
    - ``lease``: the internal lease of watchdog holds, in seconds (30).
    - ``renew_interval``: how often the watchdog renews those holds, in seconds (10); must be
      shorter than ``lease``.
    - ``wait_cap``: the longest a waiter at the head of its process' queue sleeps before it
      tries again, whatever pub/sub says (3 s). Other waiters of the same lock in the same
      process sleep at most ``wait_cap * queue_cap_factor``.
    - ``fence_retention``: how long a name's fencing-token counter outlives its last hold, at
      least, in seconds (3600; at most one lease more); 0: it lives at most as long as the
      last hold's lease (a release does not shorten it). See docs/safety.rst.
    - ``metric_group``: how a name is grouped in the metrics (``distlock.metrics()``): a
      function of the name returning a short label; None (the default) takes the name's
      first ``:``-separated segment (``orders:42`` -> ``orders``). See docs/guides/operating.rst.
    - ``min_replicas``: how many replicas must acknowledge a grant of a lock or a semaphore
      made without its own ``min_replicas`` (0: none, nothing is waited for); and
      ``replica_timeout``: how long a grant waits for them, in seconds (0.5). See
      docs/guides/replicas.rst.
    - ``barge_limit``: about how long one round of the processes contending for a default
      (not fair) DistLock or DistRLock lasts, in seconds (0.05): each process that got the lock
      by waiting keeps it for this over the number of processes taking turns, then yields it to
      the one that has waited longest; 0: it yields at every contended release; ``math.inf``:
      never (pure barging). See docs/guides/locks.rst, "Even shares under contention".
    """

    prefix: str = "distlock:"
    lease: float = 30.0
    renew_interval: float = 10.0
    wait_cap: float = 3.0
    queue_cap_factor: float = 10.0
    fence_retention: float = 3600.0
    metric_group: Optional[Callable[[str], str]] = field(default=None, compare=False)
    min_replicas: int = 0
    replica_timeout: float = DEFAULT_REPLICA_TIMEOUT
    barge_limit: float = DEFAULT_BARGE_LIMIT
    #: Redlock (``client=[...]``): the clock drift allowed per hold, in seconds; None: 1% of
    #: the lease plus 2 ms (see ``_quorum.drift``)
    redlock_drift: Optional[float] = None
    #: ``fence_retention`` in ms, as the scripts take it (computed once, not per call)
    fence_retention_ms: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "fence_retention_ms", int(self.fence_retention * 1000))


_lock = threading.Lock()
_settings = Settings()
_default: ClientArg = None
_default_async: Any = None  # a redis.asyncio client set by configure()
_default_client: Optional[redis.Redis] = None
_url_clients: Dict[str, redis.Redis] = {}


def settings() -> Settings:
    return _settings


def reset_settings() -> None:
    """Back to the defaults (the default client is left as it is); for tests."""
    global _settings
    with _lock:
        _settings = Settings()


def configure(
    client: ClientArg = None,
    *,
    prefix: Optional[str] = None,
    lease: Optional[float] = None,
    renew_interval: Optional[float] = None,
    wait_cap: Optional[float] = None,
    fence_retention: Optional[float] = None,
    metric_group: Optional[Callable[[str], str]] = None,
    min_replicas: Optional[int] = None,
    replica_timeout: Optional[float] = None,
    redlock_drift: Optional[float] = None,
    barge_limit: Optional[float] = None,
) -> Settings:
    """Set the default client and/or the process-wide settings; return the settings in force.

    ``client`` is a ``redis.Redis`` or a URL; ``None`` leaves the default client as it is. A
    URL is the default of both shells; a ``redis.Redis`` only of the blocking classes, and a
    ``redis.asyncio.Redis`` only of ``distlock.asyncio``'s. The
    other arguments change only what they name. Raise TypeError or ValueError on bad values,
    changing nothing.
    """
    global _settings, _default, _default_client, _default_async
    if client is not None and not is_async_client(client):
        check_client(client)
    changes: Dict[str, Any] = {}
    if prefix is not None:
        if not isinstance(prefix, str):
            raise TypeError(f"prefix must be a str, not {type(prefix).__name__}")
        if "{" in prefix or "}" in prefix:
            raise ValueError("prefix must not contain '{' or '}': the name is the hash tag")
        changes["prefix"] = prefix
    if lease is not None:
        changes["lease"] = check_seconds(lease, "lease")
    if renew_interval is not None:
        changes["renew_interval"] = check_seconds(renew_interval, "renew_interval")
    if wait_cap is not None:
        changes["wait_cap"] = check_seconds(wait_cap, "wait_cap")
    if fence_retention is not None:
        changes["fence_retention"] = check_retention(fence_retention)
    if metric_group is not None:
        if not callable(metric_group):
            raise TypeError(f"metric_group must be callable, not {type(metric_group).__name__}")
        changes["metric_group"] = metric_group
    if min_replicas is not None:
        changes["min_replicas"] = check_min_replicas(min_replicas)
    if replica_timeout is not None:
        changes["replica_timeout"] = check_replica_timeout(replica_timeout)
    if redlock_drift is not None:
        changes["redlock_drift"] = check_drift(redlock_drift)
    if barge_limit is not None:
        changes["barge_limit"] = check_barge_limit(barge_limit)
    new = replace(_settings, **changes)
    if new.renew_interval >= new.lease:
        raise ValueError("renew_interval must be shorter than lease")
    with _lock:
        _settings = new
        if client is not None and is_async_client(client):
            _default_async = client
        elif client is not None:
            _default = client
            _default_client = None
            if isinstance(client, str):
                _default_async = None  # a URL serves both shells
    return new


def check_barge_limit(value: object) -> float:
    """``configure(barge_limit=)``: seconds, zero or more; ``math.inf`` turns the rule off."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"barge_limit must be a number of seconds, not {type(value).__name__}")
    seconds = float(value)
    if math.isnan(seconds) or seconds < 0:
        raise ValueError("barge_limit must be zero or more seconds (math.inf: never)")
    return seconds


def check_drift(value: object) -> float:
    """``configure(redlock_drift=)``: seconds, zero or more."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value == 0:
        return 0.0
    return check_seconds(value, "redlock_drift")


def check_client(client: object, owner: str = "") -> None:
    """Raise TypeError unless ``client`` is a Redis client or a URL string, ValueError for a
    URL redis-py cannot parse. ``owner``: the class the client is for (its error names the
    asyncio twin when given an asyncio client). A list (a Redlock quorum of independent
    masters) only for DistLock and DistRLock: see ``_quorum.check_masters``."""
    if isinstance(client, (list, tuple)):
        from ._quorum import check_masters
        check_masters(client, owner, _check_master, _master_address)
        return
    if isinstance(client, str):
        check_url(client)
        return
    if isinstance(client, redis.Redis):
        check_not_replica(client)
        return
    cluster = getattr(redis, "RedisCluster", None)
    if cluster is not None and isinstance(client, cluster):
        return
    if is_async_client(client):
        raise TypeError(
            f"{type(client).__module__}.{type(client).__name__} is an asyncio client: use "
            f"distlock.asyncio.{owner or 'DistLock (and its siblings)'} with it, or give "
            f"distlock.{owner or 'DistLock'} a redis.Redis")
    raise TypeError(
        "client must be a redis.Redis, a redis.RedisCluster or a URL string, "
        f"not {type(client).__name__}"
    )


def check_not_replica(client: object) -> None:
    """TypeError for a Sentinel replica client (``slave_for``): a replica refuses every write."""
    pool = getattr(client, "connection_pool", None)
    if getattr(pool, "is_master", True) is False and hasattr(pool, "service_name"):
        raise TypeError("a Sentinel replica client (slave_for) cannot take a lock: "
                        "give a master client, Sentinel(...).master_for(service)")


def _check_master(client: object, i: int) -> None:
    """One master of a Redlock list: a ``redis.Redis`` on redis-py's own pool, or a URL of
    one server."""
    if isinstance(client, str):
        if cluster_url(client) is not None:
            raise ValueError(f"client[{i}] must name one server, not a cluster: {client!r}")
        check_url(client)
        return
    if is_async_client(client):
        raise TypeError(f"client[{i}] is an asyncio client: give distlock.DistLock redis.Redis masters, "
                        "or use distlock.asyncio.DistLock")
    from ._clients import twinnable
    if not isinstance(client, redis.Redis) or not twinnable(client):
        raise TypeError(f"client[{i}] must be a redis.Redis or a URL string, not {type(client).__name__}")


def _check_async_master(client: object, i: int) -> None:
    """One master of a Redlock list of the asyncio shell: a ``redis.asyncio.Redis``, or a URL
    of one server."""
    if isinstance(client, str):
        if cluster_url(client) is not None:
            raise ValueError(f"client[{i}] must name one server, not a cluster: {client!r}")
        check_url(client)
        return
    import redis.asyncio as aredis

    if isinstance(client, redis.Redis):
        raise TypeError(f"client[{i}] is a blocking client: give distlock.asyncio redis.asyncio.Redis "
                        "masters, or use distlock.DistLock")
    if not isinstance(client, aredis.Redis):
        raise TypeError(f"client[{i}] must be a redis.asyncio.Redis or a URL string, "
                        f"not {type(client).__name__}")


def _master_address(client: object) -> Any:
    """Which server a Redlock master names, to refuse the same one twice (two databases of
    one server fail together: they are not independent masters)."""
    if isinstance(client, str):
        client = _client_for_url(client)
    kwargs = getattr(getattr(client, "connection_pool", None), "connection_kwargs", {})
    return kwargs.get("path") or f"{kwargs.get('host', 'localhost')}:{kwargs.get('port', 6379)}"


def is_async_client(client: object) -> bool:
    """True for a client of ``redis.asyncio`` (looked up only if that module was imported:
    nobody can hold one otherwise)."""
    module = sys.modules.get("redis.asyncio")
    if module is None:
        return False
    kinds = tuple(k for k in (getattr(module, "Redis", None), getattr(module, "RedisCluster", None))
                  if k is not None)
    return isinstance(client, kinds)


def check_async_client(client: object, owner: str) -> None:
    """``check_client`` for the asyncio shell's class ``owner``: a ``redis.asyncio.Redis`` or a
    URL string; a sync client gets a TypeError that names the right class."""
    if isinstance(client, str):
        check_url(client)
        return
    import redis.asyncio as aredis

    if isinstance(client, (list, tuple)):
        from ._quorum import check_masters
        check_masters(client, owner, _check_async_master, _master_address)
        return
    if isinstance(client, (aredis.Redis, aredis.RedisCluster)):
        check_not_replica(client)
        return
    if isinstance(client, redis.Redis) or (
            getattr(redis, "RedisCluster", None) is not None and isinstance(client, redis.RedisCluster)):
        raise TypeError(
            f"{type(client).__module__}.{type(client).__name__} is a blocking client: use "
            f"distlock.{owner} with it, or give distlock.asyncio.{owner} a redis.asyncio.Redis")
    raise TypeError("client must be a redis.asyncio.Redis, a redis.asyncio.RedisCluster or a URL string, "
                    f"not {type(client).__name__}")


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
    return manager.master_for(parsed.service, **options)


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


def resolve_client(client: ClientArg) -> redis.Redis:
    """The client to use for ``client``: itself, the one for its URL, or the default."""
    global _default_client
    if client is None:
        if _default_client is not None:
            return _default_client
        chosen = _default if _default is not None else os.environ.get("DISTLOCK_URL", DEFAULT_URL)
        resolved = resolve_client(chosen) if chosen is not None else None
        assert resolved is not None
        with _lock:
            _default_client = resolved
        return resolved
    if isinstance(client, str):
        return _client_for_url(client)  # type: ignore[no-any-return]
    if isinstance(client, (list, tuple)):
        from ._quorum import made
        return made([resolve_client(c) for c in client])  # type: ignore[return-value]
    return client  # type: ignore[return-value]


#: asyncio clients made for URLs, per event loop (an asyncio client's connections belong to
#: the loop that opened them)
_async_url_clients: weakref.WeakKeyDictionary[Any, Dict[str, Any]] = weakref.WeakKeyDictionary()


def resolve_async_client(client: Any) -> Any:
    """The asyncio client to use for ``client`` in the running loop: itself, the one for its
    URL, or the default. A URL (given, set by ``configure()`` or in ``$DISTLOCK_URL``) serves
    both shells; a client object set by ``configure()`` serves only its own kind, and the
    asyncio shell raises RuntimeError rather than guess another server."""
    import asyncio

    if client is None:
        chosen = _default_async if _default_async is not None else _default
        if chosen is None:
            chosen = os.environ.get("DISTLOCK_URL", DEFAULT_URL)
        if not isinstance(chosen, str) and not is_async_client(chosen):
            raise RuntimeError(
                "configure() set a blocking client as the default, which serves only distlock's "
                "blocking classes: give distlock.asyncio a client (client=redis.asyncio.Redis(...)), "
                "or call configure() with a redis.asyncio.Redis or a URL")
        client = chosen
    if isinstance(client, (list, tuple)):
        from ._quorum import made as quorum_of
        return quorum_of([resolve_async_client(c) for c in client])
    if not isinstance(client, str):
        return client
    loop = asyncio.get_running_loop()
    with _lock:
        clients = _async_url_clients.get(loop)
        if clients is None:
            clients = _async_url_clients[loop] = {}
        made = clients.get(client)
        if made is None:
            made = clients[client] = async_client_from_url(client)
        return made


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
