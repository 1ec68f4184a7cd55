"""Private twins of a user's Redis client, for I/O that must never wait without a bound.

Construction only: nothing here talks to Redis (redis-py connects on the first command).

- ``session_client(client)``: what a shareable client's session talks through: a client on
  that client's own pool, unless the client has no ``socket_timeout`` (older redis-py versions
  defaulted to none; recent ones to 5 s). Then a dead server that keeps its TCP connections
  open (a blackhole) would block every command forever, and ``acquire(timeout=1)`` with it, so
  the session does its I/O through a twin with the same connection settings, a pool of its own
  and ``DEFAULT_IO_TIMEOUT``.
- ``renewer(client, timeout)``: a twin for the watchdog, with its own connection, a socket
  timeout no longer than the renew interval and no hidden retries (the watchdog retries by
  itself).
  It does not share the user's pool, so user code that exhausts a BlockingConnectionPool cannot
  starve the renewals, and a blackholed server makes the renewal fail in time for the hold to be
  reported lost when its lease runs out, not a minute later.

Only clients built on redis-py's own pools and connection classes are twinned; anything else
(Cluster, test doubles) is used as it is. A Sentinel-managed client
(``Sentinel(...).master_for(service)``) gets a session of its own (it is not ``shareable``),
and its watchdog's twin is one of the same kind: a ``SentinelConnectionPool`` of its own on the
same ``Sentinel`` and service, so that every renewal connection looks the master up when it
connects and follows a failover. How commands are sent is the executor's business
(``_redis/executor.py``).
"""

from __future__ import annotations

import sys
from typing import Any, Callable, Dict, List, Optional, Tuple, Union

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from .urls import _client_for_url, check_url, cluster_url

ClientArg = Union["redis.Redis", "redis.RedisCluster", str, "List[Any]", "Tuple[Any, ...]", None]


def check_client(client: object, owner: str = "") -> None:
    """Raise TypeError unless ``client`` is a Redis client or a URL string, ValueError for a
    URL redis-py cannot parse. ``owner``: the class the client is for (its error names the
    asyncio twin when given an asyncio client). A list (a Redlock quorum of independent
    masters) only for DistLock and DistRLock: see ``_core.quorum.check_masters``."""
    if isinstance(client, (list, tuple)):
        from .._core.quorum import check_masters
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
    pass
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
    URL string; a blocking client gets a TypeError that names the right class."""
    if isinstance(client, str):
        check_url(client)
        return
    import redis.asyncio as aredis

    if isinstance(client, (list, tuple)):
        from .._core.quorum import check_masters
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


__all__ = ["DEFAULT_IO_TIMEOUT", "renewer", "twinnable", "server_key", "session_client", "shareable"]

#: The socket timeout of the session's own I/O when the user's client has none (seconds): the
#: default of recent redis-py versions.
DEFAULT_IO_TIMEOUT = 5.0

_CONNECTIONS = (redis.Connection, redis.SSLConnection, redis.UnixDomainSocketConnection)


def _pool_of(client: Any) -> Any:
    pool: Any = getattr(client, "connection_pool", None)
    if type(pool) not in (redis.ConnectionPool, redis.BlockingConnectionPool):
        return None
    if pool.connection_class not in _CONNECTIONS:
        return None
    return pool


def _twin(pool: Any, overrides: Dict[str, Any], private: bool) -> Any:
    """A client with ``pool``'s connection settings and ``overrides``; its pool is of the same
    kind and size, or (``private``) a plain pool of its own that grows only as it is used."""
    kwargs = dict(pool.connection_kwargs)
    kwargs.update(overrides)
    if private:
        return redis.Redis(connection_pool=redis.ConnectionPool(
            connection_class=pool.connection_class, **kwargs))
    if type(pool) is redis.BlockingConnectionPool:
        new_pool: Any = redis.BlockingConnectionPool(  # type: ignore[no-untyped-call]
            connection_class=pool.connection_class, max_connections=pool.max_connections,
            timeout=pool.timeout, **kwargs)
    else:
        new_pool = redis.ConnectionPool(
            connection_class=pool.connection_class, max_connections=pool.max_connections, **kwargs)
    return redis.Redis(connection_pool=new_pool)


def _sentinel_pool_of(client: Any) -> Any:
    """``client``'s pool when it is redis-py's ``SentinelConnectionPool`` of a master, on
    redis-py's own Sentinel connection classes; else None."""
    from redis.sentinel import SentinelConnectionPool, SentinelManagedConnection, SentinelManagedSSLConnection

    pool: Any = getattr(client, "connection_pool", None)
    if type(pool) is not SentinelConnectionPool or not pool.is_master:
        return None
    if pool.connection_class not in (SentinelManagedConnection, SentinelManagedSSLConnection):
        return None
    return pool


def _sentinel_twin(pool: Any, overrides: Dict[str, Any]) -> Any:
    """A master client on a ``SentinelConnectionPool`` of its own: ``pool``'s Sentinel,
    service and connection settings, and ``overrides``."""
    from redis.sentinel import SentinelConnectionPool

    kwargs = {k: v for k, v in pool.connection_kwargs.items() if k != "connection_pool"}
    kwargs.update(overrides)
    return redis.Redis(connection_pool=SentinelConnectionPool(  # type: ignore[no-untyped-call]
        pool.service_name, pool.sentinel_manager, connection_class=pool.connection_class,
        is_master=True, check_connection=pool.check_connection, **kwargs))


def twinnable(client: Any) -> bool:
    """True for a client built on redis-py's own pools and connection classes (``renewer``
    can make a twin of it)."""
    return _pool_of(client) is not None


#: What makes a twin's commands fail at once, the caller deciding what to do next: redis-py's
#: own retries sleep between attempts (an exponential backoff: seconds, against a server gone)
#: where nothing can stop them.
NO_RETRIES = {"retry_on_timeout": False, "retry_on_error": []}


def _quiet_twin(client: Any, bounds: Callable[[Dict[str, Any]], Dict[str, Any]]) -> Optional[Any]:
    """A twin of ``client`` (a plain or a Sentinel master client) on a pool of its own, without
    retries, its timeouts set by ``bounds(the client's connection settings)``; None when the
    client cannot be twinned. What ``listener`` and ``renewer`` share."""
    pool = _pool_of(client)
    sentinel = pool is None
    if sentinel:
        pool = _sentinel_pool_of(client)
    if pool is None:
        return None
    overrides = {"retry": Retry(NoBackoff(), 0), **NO_RETRIES, **bounds(pool.connection_kwargs)}
    try:
        return _sentinel_twin(pool, overrides) if sentinel else _twin(pool, overrides, True)
    except (TypeError, ValueError):
        return None


def _at_most(kwargs: Dict[str, Any], name: str, bound: float) -> float:
    """The client's own ``name`` timeout, or ``bound`` when it has none or a longer one."""
    own = kwargs.get(name)
    return bound if own is None else min(float(own), bound)


def listener(client: Any) -> Optional[Any]:
    """A twin for the dispatcher's pub/sub connection: ``client``'s connection settings,
    without retries (the dispatcher reconnects itself, and looks between two attempts whether
    its session closed), a connect bounded as the session's own I/O is, on a pool of its own
    (``release_listener`` closes it); None when the client cannot be twinned."""
    # redis-py still reconnects once after a failure (its retries' callback), before it
    # raises: against a server that drops packets, that connect must end too
    twin = _quiet_twin(client, lambda kw: {
        "socket_connect_timeout": _at_most(kw, "socket_connect_timeout", DEFAULT_IO_TIMEOUT)})
    if twin is not None:
        twin.connection_pool.distlock_listener = True
    return twin


def release_listener(pubsub: Any) -> None:
    """Close whatever ``pubsub``'s pool still has open when it is a ``listener``'s own: a read
    that failed as the PubSub was being closed reconnects it (redis-py's retry callback), into
    a pool the user's ``disconnect`` never reaches. A PubSub on the user's pool is left alone."""
    pool: Any = getattr(pubsub, "connection_pool", None)
    if getattr(pool, "distlock_listener", False):
        try:
            pool.disconnect()
        except Exception:  # noqa: BLE001 - closing connections that may be broken already
            pass


def renewer(client: Any, timeout: float) -> Optional[Any]:
    """A twin for the watchdog (one thread: one connection) whose every command gives up after ``timeout``
    seconds (or the client's own, shorter, socket timeout), without retries; None when the
    client cannot be twinned."""
    def bounds(kw: Dict[str, Any]) -> Dict[str, Any]:
        bound = _at_most(kw, "socket_timeout", timeout)
        return {"socket_timeout": bound,
                "socket_connect_timeout": _at_most(kw, "socket_connect_timeout", bound)}
    return _quiet_twin(client, bounds)


#: The connection settings that make two clients "the same server as the same user": clients
#: that agree on all of them share one session (see ``_session.session.session_for``).
_SERVER_FIELDS = (
    "host", "port", "path", "db", "username", "password", "credential_provider",
    "decode_responses", "encoding", "encoding_errors", "protocol", "client_name",
    "socket_timeout", "socket_connect_timeout",
)


def shareable(client: Any) -> bool:
    """True for a plain ``redis.Redis`` on redis-py's own pool and connection classes: its
    session may talk through a private twin of it, shared with every client of the same
    server and credentials. Anything else (Sentinel, Cluster, a subclass that overrides
    ``execute_command``, a single-connection client, fakeredis) gets a session of its own."""
    return (
        _pool_of(client) is not None
        and type(client).execute_command is redis.Redis.execute_command
        and getattr(client, "connection", None) is None
        and "EVALSHA" not in getattr(client, "response_callbacks", {})
    )


def server_key(client: Any) -> Tuple[Any, ...]:
    """What identifies a shareable client's server and user (see ``shareable``)."""
    pool = _pool_of(client)
    kwargs = pool.connection_kwargs
    parts: List[Any] = [pool.connection_class]
    for field in _SERVER_FIELDS + tuple(sorted(k for k in kwargs if k.startswith("ssl"))):
        value = kwargs.get(field)
        try:
            hash(value)
        except TypeError:
            value = ("id", id(value))
        parts.append((field, value))
    return tuple(parts)


def session_client(client: Any) -> Tuple[Any, bool]:
    """The client a shareable ``client``'s session talks through (see the module's docstring),
    and whether its pool is the user's: one on that client's own pool, so that the process'
    own commands and distlock's share connections, as they did before sessions were shared
    per server; or, when the client has no socket timeout, a twin with a pool of its own (of
    the same kind and size) and one."""
    pool = _pool_of(client)
    if pool.connection_kwargs.get("socket_timeout") is not None:
        return redis.Redis(connection_pool=pool), True
    overrides: Dict[str, Any] = {"socket_timeout": DEFAULT_IO_TIMEOUT}
    if pool.connection_kwargs.get("socket_connect_timeout") is None:
        overrides["socket_connect_timeout"] = DEFAULT_IO_TIMEOUT
    return _twin(pool, overrides, False), False
