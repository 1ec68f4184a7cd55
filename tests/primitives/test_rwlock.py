"""DistReadWriteLock: shared readers, exclusive writers, writer preference, leases, wake-ups.

Orderings and counts are asserted, not durations; the only time bounds are generous upper ones
(``BOUND``) that only a hang, or a wake-up that never came, could exceed.
"""

from __future__ import annotations

import itertools
import multiprocessing
import os
import signal
import subprocess
import sys
import threading
import time
from typing import Any, Callable, List, Optional, Tuple

import _rw_workers
import pytest
from _support import lease_left_ms, renewals_seen, scan_keys, subscribers

import distlock
from distlock import DistReadWriteLock, LockLostError, LockNotOwnedError
from distlock._core.keys import Keys, RWKeys
from distlock._primitives.rwlock import UPGRADE_REFUSED, DistReadLock, DistWriteLock, writer_entry_ms
from distlock._redis.scripts import script_names

#: the whole contract runs on the test server and on the session's Redis Cluster
pytestmark = [pytest.mark.cluster_too, pytest.mark.sentinel_too]

SPAWN = multiprocessing.get_context("spawn")

#: The loosest upper bound on anything that should be quick: only a hang fails it.
BOUND = 20.0

#: Wake-up tests: with ``wait_cap=60`` and 120 s leases, a waiter that missed its hint would
#: sleep 60 s before trying again; its timeout is longer still, so only "got in within BOUND
#: of the event" tells that the hint worked.
NO_HINT = dict(wait_cap=60.0, lease=120.0, renew_interval=60.0)
LONG = 100.0


# --- helpers -----------------------------------------------------------------------------------

def _keys(name: str) -> RWKeys:
    return RWKeys.of("distlock:", name)


def _wait_until(predicate: Callable[[], Any], what: str, timeout: float = BOUND) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


def _start(target: Callable[..., Any], *args: Any) -> threading.Thread:
    thread = threading.Thread(target=target, args=args, daemon=True)
    thread.start()
    return thread


def _join(threads: List[threading.Thread], timeout: float = BOUND) -> None:
    deadline = time.monotonic() + timeout
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    assert not any(t.is_alive() for t in threads), "a thread did not finish"


def _in_thread(fn: Callable[[], Any]) -> Any:
    """Run ``fn`` in another thread (another owner) and return its result or raise its error."""
    out: List[Any] = []

    def run() -> None:
        try:
            out.append(("ok", fn()))
        except BaseException as exc:  # noqa: BLE001 - handed back to the caller
            out.append(("err", exc))

    _join([_start(run)])
    kind, value = out[0]
    if kind == "err":
        raise value
    return value


def _stop(procs: List[Any]) -> None:
    for proc in procs:
        if proc.is_alive():
            proc.kill()
        proc.join(timeout=10)


def _left(client: Any, name: str) -> List[bytes]:
    return scan_keys(client, f"distlock:{{{name}}}*")


def _only_fence(name: str) -> List[bytes]:
    return [f"distlock:{{{name}}}:fence".encode()]


# --- the API ---------------------------------------------------------------------------------------

def test_sides_are_the_same_objects_every_call(client: Any) -> None:
    rw = DistReadWriteLock("api", client=client)
    assert rw.read_lock() is rw.read_lock()
    assert rw.write_lock() is rw.write_lock()
    assert isinstance(rw.read_lock(), DistReadLock)
    assert isinstance(rw.write_lock(), DistWriteLock)
    assert rw.name == rw.read_lock().name == rw.write_lock().name == "api"
    assert "DistReadWriteLock" in repr(rw) and "'api'" in repr(rw)
    assert distlock.DistReadWriteLock is DistReadWriteLock
    assert "DistReadWriteLock" in distlock.__all__


@pytest.mark.parametrize("args,kwargs,exc", [
    ((42,), {}, TypeError),
    (("",), {}, ValueError),
    (("n",), {"lease": 0}, ValueError),
    (("n",), {"lease": "1"}, TypeError),
    (("n",), {"client": 3}, TypeError),
])
def test_constructor_checks(args: Tuple[Any, ...], kwargs: Any, exc: type) -> None:
    with pytest.raises(exc):
        DistReadWriteLock(*args, **kwargs)


@pytest.mark.parametrize("side", ["read", "write"])
def test_acquire_argument_checks_match_threading(client: Any, side: str) -> None:
    lock = getattr(DistReadWriteLock("args", client=client), f"{side}_lock")()
    twin = threading.RLock()
    for args, kwargs in [((False, 1), {}), ((), {"timeout": -2}), ((), {"timeout": "x"}),
                         ((True, float("nan")), {})]:
        with pytest.raises(Exception) as ours:
            lock.acquire(*args, **kwargs)
        with pytest.raises(Exception) as theirs:
            twin.acquire(*args, **kwargs)
        assert type(ours.value) is type(theirs.value)
        assert str(ours.value) == str(theirs.value)
    assert _left(client, "args") == []


@pytest.mark.parametrize("side", ["read", "write"])
def test_release_unheld_raises_not_owned(client: Any, side: str) -> None:
    rw = DistReadWriteLock("unheld", client=client)
    lock = getattr(rw, f"{side}_lock")()
    with pytest.raises(LockNotOwnedError, match="cannot release un-acquired lock"):
        lock.release()
    with pytest.raises(RuntimeError):
        lock.release()
    other = rw.write_lock() if side == "read" else rw.read_lock()
    with other:  # holding the other side is not holding this one
        with pytest.raises(LockNotOwnedError):
            lock.release()


def test_locked_owned_token_repr(client: Any) -> None:
    rw = DistReadWriteLock("state", client=client)
    r, w = rw.read_lock(), rw.write_lock()
    assert not r.locked() and not w.locked()
    assert r.token is None and not r.owned()
    with r:
        assert r.locked() and not w.locked()
        assert r.owned() and r.token is not None
        assert repr(r).startswith("<locked distlock.DistReadLock object name='state'")
        assert "count=1" in repr(r)
        assert _in_thread(r.owned) is False  # owned by this thread only
        assert _in_thread(r.locked) is True
    with w:
        assert w.locked() and not r.locked()
        assert repr(w).startswith("<locked distlock.DistWriteLock object name='state'")
    assert repr(w).startswith("<unlocked distlock.DistWriteLock")
    assert _left(client, "state") == _only_fence("state")


def test_try_lock_and_context_manager(client: Any) -> None:
    rw = DistReadWriteLock("try", client=client)
    r, w = rw.read_lock(), rw.write_lock()
    assert r.try_lock()
    assert _in_thread(lambda: w.try_lock(0.2)) is False
    r.release()
    with w as got:
        assert got is True
        assert _in_thread(lambda: r.try_lock()) is False
        assert _in_thread(lambda: r.acquire(False)) is False
    assert _in_thread(lambda: w.try_lock(None) and (w.release() or True)) is True


def test_all_keys_share_one_tag_and_never_collide() -> None:
    rw = _keys("n")
    tag = Keys("distlock:", "n").tag
    names = [rw.writer, rw.readers, rw.queue, rw.fence, rw.writer_channel, rw.reader_channel]
    assert all(n.startswith(tag) for n in names)
    assert len(set(names)) == len(names)
    plain = Keys("distlock:", "n")
    tails = [n[len(tag) - 1:] for n in names + [plain.lock]]
    for a, b in itertools.permutations(set(tails), 2):
        assert not a.endswith(b), (a, b)
    assert 2000 <= writer_entry_ms(0.5) <= 2001


def test_scripts_ship_with_the_package() -> None:
    names = set(script_names())
    for script in ("rw_read_acquire", "rw_read_release", "rw_read_renew", "rw_read_count",
                   "rw_write_acquire", "rw_write_release"):
        assert script in names


# --- shared and exclusive ---------------------------------------------------------------------

def test_readers_overlap_across_threads(client: Any) -> None:
    n = 4
    barrier = threading.Barrier(n)
    met: List[int] = []

    def reader() -> None:
        r = DistReadWriteLock("overlap-t", client=client).read_lock()
        assert r.acquire(timeout=BOUND)
        try:
            barrier.wait(BOUND)  # every reader is inside at once, or this breaks
            met.append(r.token)
        finally:
            r.release()

    _join([_start(reader) for _ in range(n)])
    assert len(met) == n and len(set(met)) == n
    assert _left(client, "overlap-t") == _only_fence("overlap-t")


@pytest.mark.real_redis
def test_readers_overlap_across_processes(url: str, client: Any) -> None:
    n = 3
    barrier = SPAWN.Barrier(n + 1)  # and this process' own reader thread
    results = SPAWN.Queue()
    procs = [SPAWN.Process(target=_rw_workers.read_at_barrier, args=(url, "overlap-p", barrier, results),
                           daemon=True) for _ in range(n)]
    try:
        for proc in procs:
            proc.start()
        r = DistReadWriteLock("overlap-p", client=client).read_lock()
        with r:
            barrier.wait(60)
        got = [results.get(timeout=60) for _ in range(n)]
        assert all(kind == "met" for kind, _ in got), got
        for proc in procs:
            proc.join(timeout=30)
            assert proc.exitcode == 0
    finally:
        _stop(procs)
    assert _left(client, "overlap-p") == _only_fence("overlap-p")


def _check_intervals(intervals: List[Tuple[str, float, float, int]]) -> None:
    """No write interval overlaps any other interval; tokens are unique."""
    writes = [iv for iv in intervals if iv[0] == "w"]
    for w in writes:
        for other in intervals:
            if other is w:
                continue
            overlap = w[1] < other[2] and other[1] < w[2]
            assert not overlap, f"write {w} overlaps {other}"
    tokens = [iv[3] for iv in intervals]
    assert len(set(tokens)) == len(tokens)


@pytest.mark.real_redis
def test_writer_never_overlaps_anyone_across_processes(url: str, client: Any) -> None:
    """3 processes and 2 threads here take both sides at random; every hold is recorded on the
    system-wide monotonic clock, and no write hold overlaps any other hold."""
    plans = ["rrwrrrwrrw", "rwrrwrrrwr", "wrrrrwrrrw"]
    intervals: List[Tuple[str, float, float, int]] = []
    with SPAWN.Pool(3) as pool:
        pending = pool.starmap_async(_rw_workers.mixed_holds,
                                     [(url, "intervals", ops, i) for i, ops in enumerate(plans)])
        local: List[List[Tuple[str, float, float, int]]] = []

        def here(ops: str, seed: int) -> None:
            local.append(_rw_workers.mixed_holds(url, "intervals", ops, seed))

        _join([_start(here, "rrwrwrrrrw", 10), _start(here, "wrrrwrrwrr", 11)], timeout=120)
        for chunk in pending.get(timeout=120) + local:
            intervals.extend(chunk)
    assert len(intervals) == 50
    _check_intervals(intervals)
    assert _left(client, "intervals") == _only_fence("intervals")


def test_writer_never_overlaps_anyone_across_threads(client: Any) -> None:
    chunks: List[List[Tuple[str, float, float, int]]] = []
    rw_name = "intervals-t"

    def worker(ops: str, seed: int) -> None:
        import random
        rng = random.Random(seed)
        rw = DistReadWriteLock(rw_name, client=client)
        out = []
        for op in ops:
            side = rw.read_lock() if op == "r" else rw.write_lock()
            assert side.acquire(timeout=60)
            start = time.monotonic()
            token = side.token
            time.sleep(rng.uniform(0.001, 0.005))
            end = time.monotonic()
            side.release()
            out.append((op, start, end, token))
        chunks.append(out)

    _join([_start(worker, ops, i) for i, ops in enumerate(["rrwrrw", "rwrrwr", "wrrrrw", "rrrwrr"])],
          timeout=120)
    intervals = [iv for chunk in chunks for iv in chunk]
    assert len(intervals) == 24
    _check_intervals(intervals)


def test_tokens_strictly_increase_across_sides(client: Any) -> None:
    rw = DistReadWriteLock("tokens", client=client)
    r, w = rw.read_lock(), rw.write_lock()
    seen = []
    for side in (r, w, r, r, w, w, r):
        with side:
            seen.append(side.token)
    assert seen == sorted(seen) and len(set(seen)) == len(seen)
    with r:
        t = r.token
        assert _in_thread(lambda: (r.acquire(), r.token, r.release())[1]) > t


# --- reentrancy, downgrade, upgrade ----------------------------------------------------------------

@pytest.mark.parametrize("side", ["read", "write"])
def test_reentrancy(client: Any, side: str) -> None:
    rw = DistReadWriteLock("reenter", client=client)
    lock = getattr(rw, f"{side}_lock")()
    same = getattr(DistReadWriteLock("reenter", client=client), f"{side}_lock")()
    assert lock.acquire()
    token = lock.token
    assert lock.acquire(blocking=False)
    assert same.acquire(timeout=0.1)  # another object of the same name: the same hold
    assert lock._recursion_count() == 3 and same.token == token
    lock.release()
    same.release()
    assert lock.owned() and lock.token == token
    lock.release()
    assert not lock.owned()
    with pytest.raises(LockNotOwnedError):
        lock.release()
    assert _left(client, "reenter") == _only_fence("reenter")


def test_reader_reenters_while_a_writer_waits(client: Any) -> None:
    """Writer preference refuses new readers, never a thread that already reads."""
    rw = DistReadWriteLock("reenter-pref", client=client)
    r, w = rw.read_lock(), rw.write_lock()
    keys = _keys("reenter-pref")
    assert r.acquire()
    writer_result: List[bool] = []
    writer = _start(lambda: writer_result.append(w.acquire(timeout=BOUND) and (w.release() or True)))
    try:
        _wait_until(lambda: client.zcard(keys.queue) == 1, "the writer to queue")
        assert r.acquire(blocking=False)  # re-entry: granted though a writer waits
        assert _in_thread(lambda: r.acquire(blocking=False)) is False  # a new reader: refused
        r.release()
    finally:
        r.release()
    _join([writer])
    assert writer_result == [True]
    assert _left(client, "reenter-pref") == _only_fence("reenter-pref")


def test_upgrade_is_refused_at_once(client: Any) -> None:
    """A try for the write lock that would wait, by a thread that holds only the read lock:
    two such readers would wait for each other forever, so it raises at once."""
    rw = DistReadWriteLock("upgrade", client=client)
    r, w = rw.read_lock(), rw.write_lock()
    with r:
        for call in (w.acquire, lambda: w.acquire(timeout=30), lambda: w.acquire(True, 0.5),
                     lambda: w.try_lock(None), lambda: w.try_lock(30), w.__enter__):
            started = time.monotonic()
            with pytest.raises(RuntimeError) as info:
                call()
            assert time.monotonic() - started < BOUND
            assert str(info.value) == UPGRADE_REFUSED
            assert not isinstance(info.value, LockNotOwnedError)
        assert "read lock" in UPGRADE_REFUSED and "release the read lock first" in UPGRADE_REFUSED
        assert not w.owned()
        assert client.zcard(_keys("upgrade").queue) == 0  # never queued
        # another thread is not upgrading: it just waits for this reader
        assert _in_thread(lambda: w.acquire(timeout=0.2)) is False
    assert w.acquire(blocking=False)  # after releasing the read lock, fine
    w.release()
    assert _left(client, "upgrade") == _only_fence("upgrade")


def test_upgrade_by_a_single_try_returns_false(client: Any) -> None:
    """A single try for the write lock (``blocking=False``, ``timeout=0``, ``try_lock()``) by a
    thread that holds only the read lock cannot deadlock: it returns False, as Java's
    ``writeLock().tryLock()`` does, and leaves the read hold as it was."""
    rw = DistReadWriteLock("upgrade-try", client=client)
    r, w = rw.read_lock(), rw.write_lock()
    with r:
        token = r.token
        for call in (lambda: w.acquire(False), lambda: w.acquire(blocking=False),
                     lambda: w.acquire(timeout=0), lambda: w.acquire(True, 0),
                     lambda: w.acquire(timeout=-0.0), lambda: w.try_lock(), lambda: w.try_lock(0)):
            assert call() is False
        assert not w.owned() and w._recursion_count() == 0 and w.token is None
        assert r.owned() and r._recursion_count() == 1 and r.token == token
        assert client.zcard(_keys("upgrade-try").queue) == 0  # never queued
        with r:  # the read side still re-enters
            assert r._recursion_count() == 2
        # another thread is no upgrader: its single try is refused by this reader's hold
        assert _in_thread(lambda: w.acquire(blocking=False)) is False
    assert w.acquire(blocking=False)  # after releasing the read lock, granted
    assert r.acquire(blocking=False)  # a downgrade, while holding the write lock: granted
    assert w.acquire(blocking=False)  # holding both sides: a re-entry of the write lock
    assert w._recursion_count() == 2
    w.release()
    w.release()
    r.release()
    assert _left(client, "upgrade-try") == _only_fence("upgrade-try")


def test_downgrade_keeps_the_read_lock_and_wakes_readers(client: Any) -> None:
    distlock.configure(**NO_HINT)
    rw = DistReadWriteLock("downgrade", client=client)
    r, w = rw.read_lock(), rw.write_lock()
    assert w.acquire()
    assert r.acquire(blocking=False)  # the write holder may read
    assert r.token > w.token
    got_in = threading.Event()
    may_leave = threading.Event()

    def reader() -> None:
        assert r.acquire(timeout=LONG)
        got_in.set()
        may_leave.wait(BOUND)
        r.release()

    thread = _start(reader)
    try:
        _wait_until(lambda: subscribers(client, _keys("downgrade").reader_channel) >= 1,
                    "the reader to wait")
        assert not got_in.is_set()
        w.release()  # downgrade: still a reader, and the waiting reader is let in
        assert r.owned() and not w.owned()
        assert got_in.wait(BOUND), "the waiting reader was not woken"
        assert r.locked() and not w.locked()
        assert _in_thread(lambda: w.acquire(blocking=False)) is False  # readers hold it
    finally:
        may_leave.set()
        r.release()
    _join([thread])
    assert _left(client, "downgrade") == _only_fence("downgrade")


def test_condition_on_write_lock(client: Any) -> None:
    rw = DistReadWriteLock("cond", client=client)
    cond = threading.Condition(rw.write_lock())
    items: List[int] = []
    results: List[Any] = []

    def consumer() -> None:
        with cond:
            ok = cond.wait_for(lambda: bool(items), timeout=BOUND)
            results.append((ok, rw.write_lock()._recursion_count(), items.pop()))

    thread = _start(consumer)
    time.sleep(0.2)
    with cond:
        items.append(7)
        cond.notify()
    _join([thread])
    assert results == [(True, 1, 7)]
    with cond:
        assert cond.wait(0.1) is False  # releases and takes back the write lock
        assert rw.write_lock().owned()
    assert _left(client, "cond") == _only_fence("cond")


def test_condition_on_read_lock(client: Any) -> None:
    rw = DistReadWriteLock("cond-r", client=client)
    cond = threading.Condition(rw.read_lock())
    with cond:
        assert cond.wait(0.1) is False
        assert rw.read_lock()._is_owned()
    assert not rw.read_lock()._is_owned()


# --- writer preference -------------------------------------------------------------------------

def _preference_run(client: Any, url: Optional[str], name: str, writer_in: str, readers_in: str,
                    n_readers: int) -> Tuple[int, List[int]]:
    """A reader holds; a writer queues; then readers arrive (after the writer is seen queued)
    and wait; the first reader leaves. Return the writer's and the late readers' sequence
    numbers (INCR inside each hold: the holds never overlap a write, so the order is exact)."""
    keys = _keys(name)
    seq_key = f"seq:{name}"
    first = DistReadWriteLock(name, client=client).read_lock()
    assert first.acquire()
    procs: List[Any] = []
    pool: Any = None
    threads: List[threading.Thread] = []
    writer_seq: List[Tuple[bool, int]] = []
    reader_seqs: List[int] = []
    conn = None
    try:
        if writer_in == "process":
            assert url is not None
            conn, child = SPAWN.Pipe()
            proc = SPAWN.Process(target=_rw_workers.wait_for_write,
                                 args=(url, name, seq_key, 60.0, 0.2, None, child), daemon=True)
            proc.start()
            procs.append(proc)
        else:
            def write() -> None:
                w = DistReadWriteLock(name, client=client).write_lock()
                ok = w.acquire(timeout=60)
                seq = int(client.incr(seq_key)) if ok else -1
                time.sleep(0.2)
                if ok:
                    w.release()
                writer_seq.append((ok, seq))
            threads.append(_start(write))
        _wait_until(lambda: client.zcard(keys.queue) == 1, "the writer to queue", timeout=60)

        # the writer is waiting: every reader from here on began waiting after it
        if readers_in == "process":
            assert url is not None
            pool = SPAWN.Pool(n_readers)
            pending = pool.starmap_async(_rw_workers.read_in_sequence,
                                         [(url, name, seq_key, 60.0)] * n_readers)
            n_subscribers = n_readers
        else:
            def read() -> None:
                reader_seqs.append(_rw_workers.read_in_sequence_with(client, name, seq_key, 60.0))
            threads.extend(_start(read) for _ in range(n_readers))
            n_subscribers = 1
        _wait_until(lambda: subscribers(client, keys.reader_channel) >= n_subscribers,
                    "the late readers to wait", timeout=60)
        time.sleep(0.1)
        assert int(client.get(seq_key) or 0) == 0  # nobody got in yet
        first.release()

        if pool is not None:
            reader_seqs.extend(pending.get(timeout=60))
        if conn is not None:
            assert conn.poll(60) and conn.recv() == "asking"
            assert conn.poll(60)
            writer_seq.append(conn.recv())
        _join(threads, timeout=60)
    finally:
        if first.owned():
            first.release()
        if pool is not None:
            pool.terminate()
            pool.join()
        _stop(procs)
    assert len(writer_seq) == 1 and writer_seq[0][0]
    client.delete(seq_key)
    return writer_seq[0][1], reader_seqs


@pytest.mark.server_only  # its workers reach the server through ``backend``
@pytest.mark.parametrize("writer_in,readers_in", [
    ("thread", "thread"),
    pytest.param("process", "process", marks=pytest.mark.real_redis),
    pytest.param("process", "thread", marks=pytest.mark.real_redis),
    pytest.param("thread", "process", marks=pytest.mark.real_redis),
])
def test_writer_preference_is_an_ordering(backend: Any, client: Any, writer_in: str,
                                          readers_in: str) -> None:
    """No reader that began waiting after a writer began waiting gets in before that writer."""
    url = backend.url
    name = f"pref-{writer_in}-{readers_in}"
    wseq, rseqs = _preference_run(client, url, name, writer_in, readers_in, 3)
    assert len(rseqs) == 3 and all(s > 0 for s in rseqs)
    assert wseq == 1, (wseq, rseqs)
    assert sorted(rseqs) == [2, 3, 4]
    assert _left(client, name) == _only_fence(name)


def test_many_readers_cannot_starve_a_writer(client: Any) -> None:
    """Readers keep taking turns (each hold overlapping the next); a writer still gets in."""
    name = "starve"
    stop = threading.Event()
    writer_done: List[bool] = []

    def reader(i: int) -> None:
        r = DistReadWriteLock(name, client=client).read_lock()
        deadline = time.monotonic() + 60
        while not stop.is_set() and time.monotonic() < deadline:
            if r.acquire(timeout=0.5):
                time.sleep(0.02 + 0.01 * i)
                r.release()

    readers = [_start(reader, i) for i in range(3)]
    try:
        time.sleep(0.3)
        w = DistReadWriteLock(name, client=client).write_lock()
        writer_done.append(w.acquire(timeout=BOUND))
        if writer_done[-1]:
            w.release()
    finally:
        stop.set()
        _join(readers, timeout=60)
    assert writer_done == [True]


# --- giving up, dying, leases ------------------------------------------------------------------

def test_writer_timeout_leaves_the_queue_and_wakes_readers(client: Any) -> None:
    distlock.configure(**NO_HINT)  # only the give-up hint can wake the reader in time
    name = "w-timeout"
    keys = _keys(name)
    rw = DistReadWriteLock(name, client=client)
    r, w = rw.read_lock(), rw.write_lock()
    assert r.acquire()
    writer_result: List[bool] = []
    reader_at: List[float] = []

    def late_reader() -> None:
        if r.acquire(timeout=LONG):
            reader_at.append(time.monotonic())
            r.release()

    writer = _start(lambda: writer_result.append(w.acquire(timeout=1.5)))
    try:
        _wait_until(lambda: client.zcard(keys.queue) == 1, "the writer to queue")
        ttl = client.pttl(keys.queue)
        assert 0 < ttl <= writer_entry_ms(60.0)  # the queue expires by itself
        reader = _start(late_reader)
        _join([writer])
        gave_up_at = time.monotonic()
        assert writer_result == [False]
        assert not client.exists(keys.queue)
        _join([reader], timeout=LONG + 10)
        assert len(reader_at) == 1
        assert reader_at[0] - gave_up_at < BOUND  # woken by the give-up, not by its 60 s poll
    finally:
        r.release()
    assert _left(client, name) == _only_fence(name)


def test_non_blocking_writer_never_queues(client: Any) -> None:
    name = "w-nb"
    rw = DistReadWriteLock(name, client=client)
    with rw.read_lock():
        assert _in_thread(lambda: rw.write_lock().acquire(blocking=False)) is False
        assert _in_thread(lambda: rw.write_lock().acquire(timeout=0)) is False
        assert not client.exists(_keys(name).queue)
        assert _in_thread(lambda: rw.read_lock().acquire(blocking=False) and
                          (rw.read_lock().release() or True)) is True


@pytest.mark.real_redis
def test_dead_waiting_writer_stops_blocking_readers(url: str, client: Any) -> None:
    name = "w-dead"
    keys = _keys(name)
    first = DistReadWriteLock(name, client=client).read_lock()
    assert first.acquire()
    conn, child = SPAWN.Pipe()
    proc = SPAWN.Process(target=_rw_workers.wait_for_write,
                         args=(url, name, "seq:w-dead", 120.0, 0.0, 0.3, child), daemon=True)
    try:
        proc.start()
        _wait_until(lambda: client.zcard(keys.queue) == 1, "the writer to queue", timeout=60)
        assert _in_thread(lambda: first.acquire(blocking=False)) is False  # preference
        os.kill(proc.pid, signal.SIGKILL)
        proc.join(timeout=10)
        # its entry lasts writer_entry_ms(0.3) = 1.6 s after its last try, then readers pass
        assert _in_thread(lambda: first.acquire(timeout=BOUND) and (first.release() or True)) is True
    finally:
        _stop([proc])
        if first.owned():
            first.release()
    # the dead writer's queue expires with its entry (give or take the milliseconds between
    # the two deadlines)
    _wait_until(lambda: _left(client, name) == _only_fence(name), "the dead writer's queue to go", 5.0)


@pytest.mark.real_redis
def test_sigkilled_reader_stops_blocking_writers_after_its_lease(url: str, client: Any) -> None:
    name = "r-killed"
    conn, child = SPAWN.Pipe()
    proc = SPAWN.Process(target=_rw_workers.hold_read_until_killed, args=(url, name, child),
                         daemon=True)
    try:
        proc.start()
        assert conn.poll(60), "the reader did not report"
        token, sent_at = conn.recv()
        w = DistReadWriteLock(name, client=client).write_lock()
        assert not w.acquire(blocking=False)
        os.kill(proc.pid, signal.SIGKILL)
        proc.join(timeout=10)
        assert w.acquire(timeout=BOUND)
        got_at = time.monotonic()
        assert got_at >= sent_at + 1.0  # never before the dead reader's 1 s lease ran out
        assert w.token > token
        w.release()
    finally:
        _stop([proc])
    assert _left(client, name) == _only_fence(name)


def test_watchdog_keeps_a_reader_alive(client: Any) -> None:
    distlock.configure(lease=3.0, renew_interval=0.2)
    rw = DistReadWriteLock("r-watch", client=client)
    r, w = rw.read_lock(), rw.write_lock()
    with r:
        renewals_seen(lambda: lease_left_ms(client, "r-watch"), 3)  # the watchdog's
        assert r.owned()
        assert _in_thread(lambda: w.acquire(blocking=False)) is False
    assert _left(client, "r-watch") == _only_fence("r-watch")


def test_explicit_lease_reader_expires(client: Any) -> None:
    rw = DistReadWriteLock("r-lease", client=client, lease=0.5)
    r, w = rw.read_lock(), rw.write_lock()
    assert r.acquire()
    assert _in_thread(lambda: w.acquire(timeout=BOUND) and (w.release() or True)) is True
    with pytest.raises(LockLostError):
        r.release()
    assert not r.owned()
    assert _left(client, "r-lease") == _only_fence("r-lease")


def test_reentry_after_lease_ran_out_is_lost(client: Any) -> None:
    rw = DistReadWriteLock("r-reenter-lost", client=client)
    r = rw.read_lock()
    assert r.try_lock(lease=0.5)
    time.sleep(0.8)
    assert not r.locked()
    with pytest.raises(LockLostError):
        r.acquire()
    with pytest.raises(LockLostError):
        r.release()
    assert not r.owned()
    assert _left(client, "r-reenter-lost") == _only_fence("r-reenter-lost")


def test_release_after_lease_ran_out_is_lost_even_with_other_readers(client: Any) -> None:
    """The readers' key lives on (another reader), but the expired hold is still lost."""
    rw = DistReadWriteLock("r-expired", client=client)
    r = rw.read_lock()
    other = _start(lambda: _hold_read_for(client, "r-expired", 1.5))
    try:
        time.sleep(0.2)
        assert r.try_lock(lease=0.5)
        time.sleep(0.8)
        with pytest.raises(LockLostError):
            r.release()
    finally:
        _join([other])
    assert _left(client, "r-expired") == _only_fence("r-expired")


def _hold_read_for(client: Any, name: str, seconds: float) -> None:
    with DistReadWriteLock(name, client=client).read_lock():
        time.sleep(seconds)


def test_lost_reader_found_by_watchdog(client: Any) -> None:
    distlock.configure(lease=1.0, renew_interval=0.2)
    name = "r-lost"
    rw = DistReadWriteLock(name, client=client)
    r = rw.read_lock()
    lost: List[Any] = []
    r.on_lost(lost.append)
    assert r.acquire()
    client.delete(_keys(name).readers)  # someone wiped it
    _wait_until(lambda: lost, "the watchdog to notice")
    assert lost == [r] and not r.owned()
    with pytest.raises(LockLostError):
        r.release()


def test_write_lease_expires_and_readers_pass(client: Any) -> None:
    rw = DistReadWriteLock("w-lease", client=client)
    w, r = rw.write_lock(), rw.read_lock()
    assert w.try_lock(lease=0.5)
    assert _in_thread(lambda: r.acquire(timeout=BOUND) and (r.release() or True)) is True
    with pytest.raises(LockLostError):
        w.release()


# --- wake-ups --------------------------------------------------------------------------------

def test_write_release_wakes_every_waiting_reader(client: Any) -> None:
    distlock.configure(**NO_HINT)
    name = "wake-readers"
    rw = DistReadWriteLock(name, client=client)
    assert rw.write_lock().acquire()
    n = 3
    inside = threading.Barrier(n)
    got_at: List[float] = []

    def reader() -> None:
        r = DistReadWriteLock(name, client=client).read_lock()
        if not r.acquire(timeout=LONG):
            return
        try:
            got_at.append(time.monotonic())
            inside.wait(BOUND)  # all of them hold it at once
        finally:
            r.release()

    threads = [_start(reader) for _ in range(n)]
    try:
        _wait_until(lambda: subscribers(client, _keys(name).reader_channel) >= 1,
                    "the readers to wait")
        time.sleep(0.3)
    finally:
        released_at = time.monotonic()
        rw.write_lock().release()
    _join(threads, timeout=LONG + 10)
    assert len(got_at) == n
    assert max(got_at) - released_at < BOUND
    assert _left(client, name) == _only_fence(name)


def test_last_reader_out_wakes_the_writer(client: Any) -> None:
    distlock.configure(**NO_HINT)
    name = "wake-writer"
    keys = _keys(name)
    rw = DistReadWriteLock(name, client=client)
    r = rw.read_lock()
    other_in = threading.Event()
    other_out = threading.Event()

    def other_reader() -> None:
        with DistReadWriteLock(name, client=client).read_lock():
            other_in.set()
            other_out.wait(BOUND)

    def writer() -> None:
        w = rw.write_lock()
        if w.acquire(timeout=LONG):
            got_at.append(time.monotonic())
            w.release()

    got_at: List[float] = []
    other = _start(other_reader)
    assert other_in.wait(BOUND)
    assert r.acquire()
    thread = _start(writer)
    try:
        _wait_until(lambda: client.zcard(keys.queue) == 1, "the writer to queue")
        r.release()  # not the last reader: the writer keeps waiting
        time.sleep(0.3)
        assert got_at == []
    finally:
        last_out_at = time.monotonic()
        other_out.set()  # the last reader leaves
    _join([other, thread], timeout=LONG + 10)
    assert len(got_at) == 1
    assert got_at[0] - last_out_at < BOUND
    assert _left(client, name) == _only_fence(name)


def test_nothing_left_after_mixed_use(client: Any) -> None:
    name = "leftovers"
    rw = DistReadWriteLock(name, client=client)
    r, w = rw.read_lock(), rw.write_lock()
    with w, r, r:
        pass
    with r:
        assert _in_thread(lambda: w.acquire(timeout=0.3)) is False
    with r:
        with pytest.raises(RuntimeError):
            w.acquire()
    assert _left(client, name) == _only_fence(name)


@pytest.mark.real_redis
@pytest.mark.server_only  # the example takes a plain redis:// URL
def test_torn_reads_example_runs(url: str, client: Any) -> None:
    """docs/examples/torn_reads.py: readers never see a half-written value; exit status 0."""
    example = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                           "docs", "examples", "torn_reads.py")
    done = subprocess.run([sys.executable, example, "--url", url, "--seconds", "1.5", "--readers", "2"],
                          capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 torn: no reader ever saw a half-written value" in done.stdout
    assert "readers reading meanwhile: at most 0" in done.stdout
    assert client.keys("example:*") == []
