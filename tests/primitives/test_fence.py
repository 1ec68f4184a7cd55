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
from typing import Any, List

import pytest
from _support import previous_script, renewals_seen, settle

import distlock
from distlock import DistLock, DistReadWriteLock, DistRLock
from distlock._core.keys import RWKeys

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
    distlock.configure(fence_retention=2.0)
    names = [f"fence-{kind}-{i}" for i in range(50)]
    outlived = 0
    for name in names:
        # a lease no stall of a loaded machine outlasts (one of 0.5 s ran out inside the block)
        lock = make(kind, name, client, lease=5.0)
        with lock:
            assert client.exists(f"distlock:{{{name}}}:fence")
        # looked at right after the hold ended (the whole loop may take longer than the
        # retention on a loaded machine: the first counters may be gone by its end)
        outlived += client.exists(f"distlock:{{{name}}}:fence")
    assert outlived, "the counters outlive the holds for a while"
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
    distlock.configure(lease=3.0, renew_interval=0.2, fence_retention=0)
    name = f"fence-held-{kind}"
    lock = make(kind, name, client)
    with lock:
        token = lock.token
        # each renewal lengthens the counter's TTL with the hold's
        renewals_seen(lambda: client.pttl(f"distlock:{{{name}}}:fence"), 3)
        assert client.exists(f"distlock:{{{name}}}:fence")
        assert int(client.get(f"distlock:{{{name}}}:fence")) == token
    assert settle(lambda: not client.keys(f"distlock:{{{name}}}*"), 10.0)


def _hold_key(kind: str, name: str) -> str:
    if kind in ("DistLock", "DistRLock"):
        return f"distlock:{{{name}}}"
    rw = RWKeys.of("distlock:", name)
    return rw.readers if kind == "read" else rw.writer


@pytest.mark.parametrize("retention", [0, 2.0])
@pytest.mark.parametrize("kind", ["DistRLock", "read", "write"])
def test_a_reentry_that_extends_the_lease_extends_the_counter(
        client: Any, kind: str, retention: float) -> None:
    """A re-entry with a longer lease extends the hold, and the counter with it, as a renewal
    does: the counter never goes while the hold lives."""
    distlock.configure(fence_retention=retention)
    name = f"fence-reenter-{kind}-{retention}"
    lock = make(kind, name, client, lease=1.0)
    assert lock.acquire(blocking=False)
    try:
        assert lock.try_lock(lease=60.0)  # a re-entry: same token, a 60 s lease
        pipe = client.pipeline(transaction=False)
        pipe.pttl(f"distlock:{{{name}}}:fence")
        pipe.pttl(_hold_key(kind, name))
        fence, hold = pipe.execute()
        assert hold > 50000
        assert fence >= hold + retention * 1000, (fence, hold)
    finally:
        lock.release()
        lock.release()


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


@pytest.mark.real_redis
def test_a_previous_release_and_this_one_exclude_each_other(url: str, client: Any) -> None:
    """A rolling upgrade: the lock hash is laid out as before (the counter only gained a TTL),
    so a process still running the previous release's scripts and one running these exclude
    each other on the same name, and tokens keep growing across both."""
    acquire, release = previous_script("lock_acquire"), previous_script("lock_release")
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
def test_readers_and_writers_of_a_previous_release_and_this_one_exclude_each_other(
        url: str, client: Any) -> None:
    """A rolling upgrade of a read/write lock, against the previous release's (b49bc5c) own
    scripts called with its own ARGV (tests/compat/prev_rw_*.lua): its read ARGV had no fence
    TTL and its members no ``@host:pid``, its write ARGV no fence TTL. Every script counts
    readers by their deadlines, not their spelling, so each release's writers exclude the
    other's readers and writers, and its readers the other's writers; tokens keep growing
    across both; and ``status`` reads both spellings of a reader."""
    read_acquire, read_release = previous_script("rw_read_acquire"), previous_script("rw_read_release")
    write_acquire, write_release = previous_script("rw_write_acquire"), previous_script("rw_write_release")
    rw = RWKeys.of("distlock:", "rw-upgrade")
    keys = (rw.writer, rw.readers, rw.queue, rw.fence)

    def old_read(owner: str) -> int:  # b49bc5c: (owner, lease ms[, re-entry token])
        return int(client.eval(read_acquire, 4, *keys, owner, 30000))

    def old_read_release(owner: str, token: int) -> int:  # (member '<owner>#<token>'[, depth])
        return int(client.eval(read_release, 3, rw.readers, rw.queue, rw.writer_channel,
                               f"{owner}#{token}"))

    def old_write(owner: str) -> int:  # b49bc5c: (owner, lease ms, info[, mode, ...])
        return int(client.eval(write_acquire, 4, *keys, owner, 30000, "h:2"))

    def old_write_release(owner: str, token: int) -> int:  # (owner, token[, count])
        return int(client.eval(write_release, 4, rw.writer, rw.queue, rw.writer_channel,
                               rw.reader_channel, owner, token))

    new = DistReadWriteLock("rw-upgrade", client=client)
    reader, writer = new.read_lock(), new.write_lock()
    tokens: List[int] = []

    # an old reader keeps writers of both releases out, and shares with a new reader
    tokens.append(old_read("old:1"))
    assert tokens[-1] > 0
    assert not writer.acquire(blocking=False)
    assert reader.acquire(blocking=False)  # readers share, whatever their release
    tokens.append(reader.token)
    (state,) = _status(url, "rw-upgrade")
    where = sorted((o["token"], o["host"], o["pid"]) for o in state["owners"])
    assert where == [(tokens[0], None, None), (tokens[1], socket.gethostname(), os.getpid())]
    assert old_read_release("old:1", tokens[0]) == 0  # the old reader leaves
    assert old_write("old:2") < 0  # the new reader keeps an old writer out
    reader.release()

    # an old writer keeps readers and writers of both releases out
    tokens.append(old_write("old:2"))
    assert tokens[-1] > 0
    assert not reader.acquire(blocking=False)
    assert not writer.acquire(blocking=False)
    assert old_read("old:3") < 0
    assert old_write("old:4") < 0
    assert old_write_release("old:2", tokens[-1]) == 0

    # a new writer keeps readers and writers of both releases out
    assert writer.acquire(blocking=False)
    tokens.append(writer.token)
    assert old_read("old:3") < 0
    assert old_write("old:4") < 0
    writer.release()

    # free again: an old reader, then a new reader and a new writer in turn
    tokens.append(old_read("old:3"))
    assert old_read_release("old:3", tokens[-1]) == 0
    assert reader.acquire(blocking=False)
    tokens.append(reader.token)
    reader.release()
    assert writer.acquire(blocking=False)
    tokens.append(writer.token)
    writer.release()
    assert tokens == sorted(set(tokens)) and tokens[0] > 0, tokens
    assert not client.exists(rw.writer, rw.readers, rw.queue)


def _status(url: str, name: str) -> Any:
    out = subprocess.run([sys.executable, "-m", "distlock", "status", name, "--json", "--url", url],
                         capture_output=True, text=True, timeout=60, check=True)
    return json.loads(out.stdout)


@pytest.mark.real_redis
def test_a_previous_release_does_not_check_kinds_and_this_one_refuses_what_it_made(
        url: str, client: Any) -> None:
    """A rolling upgrade and "a name is one lock" (docs/guides/kinds.rst): the previous
    release's scripts look at their own kind's keys only, so a process still running it takes
    a name that this release holds as a semaphore (both believe they have it, as before the
    check existed); this release refuses a semaphore on the name while the previous release's
    process holds it as a lock, and takes it once that hold is gone."""
    acquire, release = previous_script("lock_acquire"), previous_script("lock_release")
    keys = ("distlock:{kind-upgrade}", "distlock:{kind-upgrade}:fence", "distlock:{kind-upgrade}:q")
    sem = distlock.DistSemaphore("kind-upgrade", 1, client=client)
    assert sem.acquire(blocking=False)
    old = int(client.eval(acquire, 3, *keys, "old:1", 30000, "h:1"))
    assert old > 0  # the previous release sees no lock there: granted
    sem.release()
    with pytest.raises(distlock.WrongKindError):
        sem.acquire(blocking=False)  # this release sees the previous one's lock
    assert int(client.eval(release, 2, keys[0], keys[2], "old:1", old)) == 0
    assert sem.acquire(blocking=False)
    sem.release()


@pytest.mark.real_redis
def test_a_lock_and_a_read_write_lock_of_a_previous_release_see_only_their_own_kind(
        url: str, client: Any) -> None:
    """A rolling upgrade and "a name is one lock" between the two kinds of lock
    (docs/guides/kinds.rst): a process still running the previous release's scripts takes the
    DistLock of a name whose DistReadWriteLock this release holds, and the write side of one
    whose DistLock this release holds (it looks at its own kind's keys only, as before); this
    release refuses either side while the previous release holds the lock, and the lock while
    the previous release holds the write side. What an older process releases does not wake this
    release's waiters of the other kind: they try again at their bounded sleep (wait_cap)."""
    lock_acquire, lock_release = previous_script("lock_acquire"), previous_script("lock_release")
    write_acquire, write_release = previous_script("rw_write_acquire"), previous_script("rw_write_release")
    rw = RWKeys.of("distlock:", "lw-upgrade")
    lock_keys = (rw.lock, rw.fence, rw.lock_queue)
    rw_keys = (rw.writer, rw.readers, rw.queue, rw.fence)
    new_rw = DistReadWriteLock("lw-upgrade", client=client)
    new_lock = DistLock("lw-upgrade", client=client)

    # the previous release does not see this one's other kind: both believe they hold
    assert new_rw.write_lock().acquire(blocking=False)
    old = int(client.eval(lock_acquire, 3, *lock_keys, "old:1", 30000, "h:1"))
    assert old > 0
    assert int(client.eval(lock_release, 2, rw.lock, rw.lock_queue, "old:1", old)) == 0
    new_rw.write_lock().release()
    assert new_lock.acquire(blocking=False)
    old = int(client.eval(write_acquire, 4, *rw_keys, "old:2", 30000, "h:2"))
    assert old > 0
    assert int(client.eval(write_release, 4, rw.writer, rw.queue, rw.writer_channel,
                           rw.reader_channel, "old:2", old)) == 0
    new_lock.release()

    # this release sees the previous one's holds of the other kind
    old = int(client.eval(lock_acquire, 3, *lock_keys, "old:3", 30000, "h:3"))
    assert old > 0
    assert not new_rw.write_lock().acquire(blocking=False)
    assert not new_rw.read_lock().acquire(blocking=False)
    assert int(client.eval(lock_release, 2, rw.lock, rw.lock_queue, "old:3", old)) == 0
    old = int(client.eval(write_acquire, 4, *rw_keys, "old:4", 30000, "h:4"))
    assert old > 0
    assert not new_lock.acquire(blocking=False)
    assert int(client.eval(write_release, 4, rw.writer, rw.queue, rw.writer_channel,
                           rw.reader_channel, "old:4", old)) == 0
    assert new_lock.acquire(blocking=False)
    new_lock.release()
    # the refused tries above flagged and registered nothing that outlives them needlessly:
    # what is left besides the fence is the registry entries of the read/write lock's channels
    left = {k.decode() for k in client.keys("distlock:{lw-upgrade}*")} - {rw.fence}
    assert left <= {rw.lock_queue}, left
