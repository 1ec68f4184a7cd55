"""``configure()`` and the default Redis client of each shell.

Nothing here connects: clients are created lazily and redis-py only opens a socket on the first
command. ``configure()`` may be called at any time; a lock resolves its default client on first
use, not at construction.
"""

from __future__ import annotations

import os
import threading
import weakref
from typing import Any, Callable, Dict, Optional

import redis

from .._core.settings import Settings, changed, install
from .._redis import QUORUM, topology
from .._redis.clients import ClientArg, check_client, is_async_client
from .._redis.urls import _client_for_url, async_client_from_url

__all__ = ["configure", "resolve_client", "resolve_async_client", "DEFAULT_URL"]


DEFAULT_URL = "redis://localhost:6379/0"


_lock = threading.Lock()
_default: ClientArg = None
_default_async: Any = None  # a redis.asyncio client set by configure()
_default_client: Optional[redis.Redis] = None


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
    max_hold: Optional[float] = None,
) -> Settings:
    """Set the default client and/or the process-wide settings; return the settings in force.

    ``client`` is a ``redis.Redis`` or a URL; ``None`` leaves the default client as it is. A
    URL is the default of both shells; a ``redis.Redis`` only of the blocking classes, and a
    ``redis.asyncio.Redis`` only of ``distlock.asyncio``'s. The
    other arguments change only what they name. Raise TypeError or ValueError on bad values,
    changing nothing.
    """
    global _default, _default_client, _default_async
    if client is not None and not is_async_client(client):
        check_client(client)
    new = changed(prefix=prefix, lease=lease, renew_interval=renew_interval, wait_cap=wait_cap,
                  fence_retention=fence_retention, metric_group=metric_group,
                  min_replicas=min_replicas, replica_timeout=replica_timeout,
                  redlock_drift=redlock_drift, barge_limit=barge_limit, max_hold=max_hold)
    install(new)
    with _lock:
        if client is not None and is_async_client(client):
            _default_async = client
        elif client is not None:
            _default = client
            _default_client = None
            if isinstance(client, str):
                _default_async = None  # a URL serves both shells
    return new


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
    if topology(client) == QUORUM:
        from .._core.quorum import made
        return made([resolve_client(c) for c in client])  # type: ignore[return-value,union-attr]
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
    if topology(client) == QUORUM:
        from .._core.quorum import made as quorum_of
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


def _after_fork_in_child() -> None:
    global _lock
    _lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
