"""Fencing-token counters expire (issue 12, finding 3): a name's ``:fence`` key outlives its
last hold by ``fence_retention``, then goes, so that locking per entity does not grow Redis
without bound; tokens stay strictly increasing after it went (the server-TIME floor)."""

from __future__ import annotations

import json
import math
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, List

import pytest
from _support import settle

import distlock
from distlock import DistLock, DistReadWriteLock, DistRLock
from distlock._rwlogic import RWKeys

KINDS = ["DistLock", "DistRLock", "read", "write"]


def make(kind: str, name: str, client: Any, **kwargs: Any) -> Any:
    if kind == "DistLock":
        return DistLock(name, client=client, **kwargs)
    if kind == "DistRLock":
        return DistRLock(name, client=client, **kwargs)
    rw = DistReadWriteLock(name, client=client, **kwargs)
    return rw.read_lock() if kind == "read" else rw.write_lock()


@pytest.mark.parametrize("kind", KINDS)
def test_names_leave_nothing_once_the_retention_passed(client: Any, kind: str) -> None:
    distlock.configure(fence_retention=1.0)
    names = [f"fence-{kind}-{i}" for i in range(50)]
    for name in names:
        lock = make(kind, name, client, lease=0.5)
        with lock:
            assert client.exists(f"distlock:{{{name}}}:fence")
    assert client.keys("distlock:*"), "the counters outlive the holds for a while"
    assert settle(lambda: not client.keys("distlock:*"), 20.0), client.keys("distlock:*")[:5]


@pytest.mark.parametrize("kind", KINDS)
def test_tokens_keep_growing_after_the_counter_went(client: Any, kind: str) -> None:
    distlock.configure(fence_retention=0.2)
    name = f"fence-grow-{kind}"
    tokens: List[int] = []
    for _round in range(3):
        lock = make(kind, name, client, lease=0.5)
        assert lock.acquire(blocking=False)
        tokens.append(lock.token)
        lock.release()
        assert settle(lambda: not client.exists(f"distlock:{{{name}}}:fence"), 20.0)
    assert tokens == sorted(set(tokens)), tokens


def test_retention_zero_goes_with_the_lease(client: Any) -> None:
    """0: the counter lives as long as the grant's lease, and no longer."""
    distlock.configure(fence_retention=0)
    lock = DistLock("fence-zero", client=client, lease=1.0)
    with lock:
        assert 0 < client.pttl("distlock:{fence-zero}:fence") <= 1000
    assert settle(lambda: not client.keys("distlock:*"), 10.0)


@pytest.mark.parametrize("kind", KINDS)
def test_a_renewed_hold_keeps_its_counter(client: Any, kind: str) -> None:
    """The watchdog's renewals extend the counter with the hold: it never goes while held."""
    distlock.configure(lease=1.0, renew_interval=0.2, fence_retention=0)
    name = f"fence-held-{kind}"
    lock = make(kind, name, client)
    with lock:
        token = lock.token
        time.sleep(2.5)  # more than two leases
        assert client.exists(f"distlock:{{{name}}}:fence")
        assert int(client.get(f"distlock:{{{name}}}:fence")) == token
    assert settle(lambda: not client.keys(f"distlock:{{{name}}}*"), 10.0)


@pytest.mark.parametrize("value, error", [
    (-1, ValueError), (math.nan, ValueError), (math.inf, ValueError), ("1", TypeError),
    (True, TypeError), (None, None),
])
def test_configure_checks_fence_retention(value: Any, error: Any) -> None:
    before = distlock.configure().fence_retention
    if error is None:
        assert distlock.configure(fence_retention=value).fence_retention == before
        return
    with pytest.raises(error):
        distlock.configure(fence_retention=value)
    assert distlock.configure().fence_retention == before


def test_default_retention_is_at_most_a_day() -> None:
    assert 0 < distlock.configure().fence_retention <= 86400


def _previous(name: str) -> str:
    """The assembled script ``name`` of the previous release (tests/compat)."""
    return (Path(__file__).parent / "compat" / f"prev_{name}.lua").read_text(encoding="utf-8")


@pytest.mark.real_redis
def test_a_previous_release_and_this_one_exclude_each_other(url: str, client: Any) -> None:
    """A rolling upgrade: the lock hash is laid out as before (the counter only gained a TTL),
    so a process still running the previous release's scripts and one running these exclude
    each other on the same name, and tokens keep growing across both."""
    acquire, release = _previous("lock_acquire"), _previous("lock_release")
    keys = ("distlock:{upgrade}", "distlock:{upgrade}:fence", "distlock:{upgrade}:q")
    new = DistLock("upgrade", client=client)

    assert new.acquire(blocking=False)
    first = new.token
    assert int(client.eval(acquire, 3, *keys, "old:1", 30000, "h:1")) < 0  # refused
    new.release()

    second = int(client.eval(acquire, 3, *keys, "old:1", 30000, "h:1"))
    assert second > first
    assert not new.acquire(blocking=False)  # refused while the old release holds it
    assert int(client.eval(release, 2, keys[0], keys[2], "old:1", second)) == 0

    assert new.acquire(blocking=False)
    assert new.token > second
    new.release()


@pytest.mark.real_redis
def test_read_holds_of_a_previous_release_and_this_one_exclude_writers_of_both(
        url: str, client: Any) -> None:
    """A rolling upgrade of a read/write lock: a read hold's member gained its holder's
    ``@host:pid`` (for ``distlock status``), and every script counts readers by their
    deadlines, not their spelling, so readers of either release keep writers of either out,
    and ``status`` reads both spellings."""
    read_acquire, write_acquire = _previous("rw_read_acquire"), _previous("rw_write_acquire")
    rw = RWKeys.of("distlock:", "rw-upgrade")
    keys = (rw.writer, rw.readers, rw.queue, rw.fence)
    new = DistReadWriteLock("rw-upgrade", client=client)

    old_token = int(client.eval(read_acquire, 4, *keys, "old:1", 30000, 60000))
    assert old_token > 0
    assert not new.write_lock().acquire(blocking=False)  # the old reader keeps the new writer out
    assert new.read_lock().acquire(blocking=False)  # readers share, whatever their release
    (state,) = _status(url, "rw-upgrade")
    where = sorted((o["token"], o["host"], o["pid"]) for o in state["owners"])
    assert where == [(old_token, None, None), (new.read_lock().token, socket.gethostname(), os.getpid())]
    client.zrem(rw.readers, f"old:1#{old_token}")  # the old reader leaves
    # the new reader keeps an old writer out
    assert int(client.eval(write_acquire, 4, *keys, "old:2", 30000, 60000, "h:2")) < 0
    new.read_lock().release()
    assert int(client.eval(write_acquire, 4, *keys, "old:2", 30000, 60000, "h:2")) > old_token
    client.delete(rw.writer)
    assert new.read_lock().acquire(blocking=False)
    new.read_lock().release()


def _status(url: str, name: str) -> Any:
    out = subprocess.run([sys.executable, "-m", "distlock", "status", name, "--json", "--url", url],
                         capture_output=True, text=True, timeout=60, check=True)
    return json.loads(out.stdout)
