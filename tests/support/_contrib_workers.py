"""Child-process functions of the contrib adapters' tests (tests/contrib/; spawn: importable,
top-level). Every wait here is bounded, so a test that dies never leaves a worker for long."""

from __future__ import annotations

import functools
import os
import time
from typing import Any, Dict, Optional

import redis

#: how long a creator takes: long enough that a second process that asks meanwhile misses
CREATE_SECONDS = 0.6


def dogpile_region(url: str, backend: str, filename: Optional[str] = None,
                   distributed: bool = True, **kwargs: Any) -> Any:
    """A dogpile.cache region on the test server (``backend`` "distlock.redis") or on a dbm
    file whose locks are DistReadWriteLocks on the test server (``backend`` "dbm")."""
    from dogpile.cache import make_region

    from distlock import DistReadWriteLock

    if backend == "dbm":
        arguments: Dict[str, Any] = {
            "filename": filename,
            "lock_factory": functools.partial(DistReadWriteLock.lock_factory, client=url)}
        return make_region(**kwargs).configure("dogpile.cache.dbm", arguments=arguments)
    return make_region(**kwargs).configure(
        "distlock.redis", arguments={"url": url, "distributed_lock": distributed})


def create(url: str, counter: str) -> str:
    """A slow creator that counts its runs in Redis (``counter``), over every process."""
    client = redis.Redis.from_url(url)
    try:
        n = client.incr(counter)
    finally:
        client.close()
    time.sleep(CREATE_SECONDS)
    return f"made #{n} by {os.getpid()}"


def dogpile_race(url: str, backend: str, key: str, counter: str, filename: Optional[str],
                 distributed: bool, conn: Any) -> None:
    """Say "ready", wait for "go", then ``get_or_create(key)``; send (asked at, returned at,
    value) on the system-wide monotonic clock."""
    region = dogpile_region(url, backend, filename, distributed)
    conn.send("ready")
    if not conn.poll(60):
        return
    conn.recv()
    asked = time.monotonic()
    value = region.get_or_create(key, functools.partial(create, url, counter))
    conn.send((asked, time.monotonic(), value))


def django_locker(url: str, key: str, conn: Any) -> None:
    """Take orders from the test: ("try",) -> ``cache.lock(key).acquire(blocking=False)``;
    ("wait", seconds) -> the same with ``blocking_timeout=seconds``; each answer is (taken,
    token), and a lock taken is released before the answer. ("stop",) or silence ends it."""
    from _django_settings import cache_for

    cache = cache_for(url)
    conn.send("ready")
    while conn.poll(60):
        order = conn.recv()
        if order[0] == "stop":
            break
        lock = cache.lock(key)
        if order[0] == "try":
            taken = lock.acquire(blocking=False)
        else:
            taken = lock.acquire(blocking_timeout=order[1])
        token = lock.token
        if taken:
            lock.release()
        conn.send((taken, token))
