"""A name is one lock (docs/guides/kinds.rst): a ``DistLock``, ``DistRLock`` or
``DistCondition`` and the ``DistReadWriteLock`` of the same name exclude each other. The write
side excludes the lock's holders and they exclude it; the read side shares only with readers.

Every ordered pair of (lock kind, read/write side), both ways round, in both shells, on a
single server and on the cluster: while one holds the name, the other's single try is refused
(``False``), and a waiter of the other kind is woken by the release itself. Waits here are
capped at 60 s (``wait_cap``) and the holder's lease is 60 s, so no bounded sleep could end
within the test's time: only the release's hint wakes the waiter.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
import uuid
from typing import Any, Callable, List, Tuple

import pytest
from _aio import run_in_loop
from _support import until

import distlock
import distlock.asyncio as aio

pytestmark = pytest.mark.real_redis

LOCKS = ("DistLock", "DistRLock", "DistCondition")
SIDES = ("DistWriteLock", "DistReadLock")
PAIRS: List[Tuple[str, str]] = ([(lock, side) for lock in LOCKS for side in SIDES]
                                + [(side, lock) for side in SIDES for lock in LOCKS])

#: how long a woken waiter may take on a loaded machine; far below the 60 s cap and lease
WOKEN_WITHIN = 30.0


def _make(shell: Any, kind: str, name: str, client: Any, **kwargs: Any) -> Any:
    if kind == "DistCondition":  # its lock is a DistRLock of its name, with the lease asked
        return shell.DistCondition(name, shell.DistRLock(name, client=client, **kwargs),
                                   client=client)
    if kind in LOCKS:
        return getattr(shell, kind)(name, client=client, **kwargs)
    rw = shell.DistReadWriteLock(name, client=client, **kwargs)
    return rw.write_lock() if kind == "DistWriteLock" else rw.read_lock()


def _registered(client: Any, name: str) -> Callable[[], bool]:
    """True once a waiter of either kind is registered with the lock of ``name``: the lock's
    own waiters and the read/write lock's (by its channel) both are, in the lock's registry."""
    return lambda: bool(client.zcard(f"distlock:{{{name}}}:q"))


def _then_release(client: Any, name: str, held: Any) -> None:
    until(_registered(client, name), what="the waiter to register")
    time.sleep(0.3)  # its try after subscribing is refused too: it sleeps on its hint now
    held.release()


@pytest.mark.cluster_too
@pytest.mark.parametrize("held,tried", PAIRS)
def test_a_lock_and_the_read_write_lock_of_its_name_exclude_each_other(
        client: Any, held: str, tried: str) -> None:
    distlock.configure(wait_cap=60.0)
    name = f"lw-{uuid.uuid4().hex[:8]}"
    holder = _make(distlock, held, name, client, lease=60)
    assert holder.acquire(blocking=False)
    other = _make(distlock, tried, name, client, lease=60)
    assert other.acquire(blocking=False) is False
    assert other.acquire(timeout=0) is False
    got: List[float] = []

    def wait() -> None:
        if other.acquire(timeout=WOKEN_WITHIN):
            got.append(time.monotonic())
            other.release()

    waiter = threading.Thread(target=wait)
    waiter.start()
    try:
        _then_release(client, name, holder)
    finally:
        waiter.join(WOKEN_WITHIN + 10)
    assert got, f"the {tried} waiter was not woken by the {held}'s release"
    assert not client.exists(f"distlock:{{{name}}}", f"distlock:{{{name}}}:rw:w",
                             f"distlock:{{{name}}}:rw:r")


@pytest.mark.cluster_too
@pytest.mark.parametrize("held,tried", PAIRS)
def test_async_a_lock_and_the_read_write_lock_of_its_name_exclude_each_other(
        client: Any, url: str, held: str, tried: str) -> None:
    """The same, the name held in the blocking shell (another process, as far as the asyncio
    shell can tell), the refused tries and the wait in the asyncio shell."""
    distlock.configure(wait_cap=60.0)
    name = f"alw-{uuid.uuid4().hex[:8]}"
    holder = _make(distlock, held, name, client, lease=60)
    assert holder.acquire(blocking=False)

    async def body(aclient: Any) -> Tuple[bool, bool, bool]:
        other = _make(aio, tried, name, aclient, lease=60)
        single = await other.acquire(blocking=False)
        zero = await other.acquire(timeout=0)
        waited = await other.acquire(timeout=WOKEN_WITHIN)
        if waited:
            await other.release()
        return single, zero, waited

    out: List[Any] = []
    runner = threading.Thread(target=lambda: out.append(run_in_loop(url, body, bound=WOKEN_WITHIN + 20)))
    runner.start()
    try:
        _then_release(client, name, holder)
    finally:
        runner.join(WOKEN_WITHIN + 30)
    assert out == [(False, False, True)], f"{tried} (asyncio) after {held}'s release: {out}"


@pytest.mark.parametrize("lock", LOCKS)
def test_readers_share_and_both_sides_keep_a_lock_out(client: Any, lock: str) -> None:
    """Two readers of one name hold at once, and the lock of that name waits for the last of
    them; while the lock is held, neither side is granted."""
    name = f"lr-{uuid.uuid4().hex[:8]}"
    rw = distlock.DistReadWriteLock(name, client=client)
    first, second = rw.read_lock(), distlock.DistReadWriteLock(name, client=client).read_lock()
    assert first.acquire(blocking=False) and second.acquire(blocking=False)
    other = _make(distlock, lock, name, client)
    assert not other.acquire(blocking=False)
    first.release()
    assert not other.acquire(blocking=False)  # one reader is still in
    second.release()
    assert other.acquire(blocking=False)
    assert not rw.read_lock().acquire(blocking=False)
    assert not rw.write_lock().acquire(blocking=False)
    other.release()
    assert rw.write_lock().acquire(blocking=False)
    rw.write_lock().release()


def test_a_fair_lock_waits_for_a_writer_and_a_writer_for_it(client: Any) -> None:
    """A fair lock's queue and a writer exclude each other too: the writer's release wakes the
    queued fair waiter, and the fair holder's release the queued writer."""
    distlock.configure(wait_cap=60.0)
    name = f"lf-{uuid.uuid4().hex[:8]}"
    writer = distlock.DistReadWriteLock(name, client=client, lease=60).write_lock()
    fair = distlock.DistLock(name, client=client, lease=60, fair=True)
    assert writer.acquire(blocking=False)
    assert not fair.acquire(blocking=False)
    got = threading.Event()
    waiter = threading.Thread(target=lambda: fair.acquire(timeout=WOKEN_WITHIN) and got.set())
    waiter.start()
    try:
        _then_release(client, name, writer)
    finally:
        waiter.join(WOKEN_WITHIN + 10)
    assert got.is_set(), "the fair waiter was not woken by the writer's release"
    assert not writer.acquire(blocking=False)
    back = threading.Event()

    def write() -> None:  # the write side is its thread's: released where it was taken
        if writer.acquire(timeout=WOKEN_WITHIN):
            back.set()
            writer.release()

    waiter = threading.Thread(target=write)
    waiter.start()
    try:
        _then_release(client, name, fair)
    finally:
        waiter.join(WOKEN_WITHIN + 10)
    assert back.is_set(), "the writer was not woken by the fair lock's release"


def test_exclusion_holds_across_processes(url: str, client: Any) -> None:
    """Processes that take a name as DistLock and as either side of its DistReadWriteLock in
    turn never overlap with a writer or a lock holder: each records its hold's start and end
    on the one monotonic clock of the host, and no exclusive hold overlaps any other hold."""
    name = f"lp-{uuid.uuid4().hex[:8]}"
    code = (
        "import sys, time, redis, distlock\n"
        "url, name, kind = sys.argv[1:4]\n"
        "c = redis.Redis.from_url(url)\n"
        "rw = distlock.DistReadWriteLock(name, client=c)\n"
        "lock = {'lock': distlock.DistLock(name, client=c), 'write': rw.write_lock(),\n"
        "        'read': rw.read_lock()}[kind]\n"
        "for _ in range(15):\n"
        "    assert lock.acquire(timeout=60)\n"
        "    start = time.monotonic(); time.sleep(0.01); end = time.monotonic()\n"
        "    lock.release()\n"
        "    print(kind, start, end, flush=True)\n"
    )
    kinds = ["lock", "write", "read", "read", "lock"]
    procs = [subprocess.Popen([sys.executable, "-c", code, url, name, kind],
                              stdout=subprocess.PIPE, text=True) for kind in kinds]
    spans: List[Tuple[str, float, float]] = []
    try:
        for proc in procs:
            out, _ = proc.communicate(timeout=120)
            assert proc.returncode == 0
            spans += [(k, float(s), float(e)) for k, s, e in (line.split() for line in out.splitlines())]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert len(spans) == 15 * len(kinds)
    spans.sort(key=lambda span: span[1])
    for i, (kind, _, end) in enumerate(spans):
        for other, o_start, _ in spans[i + 1:]:
            if o_start >= end:
                break
            assert kind == other == "read", f"{kind} and {other} held {name!r} at once"


def test_a_waiting_lock_keeps_new_readers_out_as_a_waiting_writer_does(client: Any) -> None:
    """Writer preference holds for the lock of the name too: while a process waits for the
    lock behind readers, new readers wait behind it, so a stream of readers cannot starve it;
    they are woken once it is done (its release), with no polling."""
    distlock.configure(wait_cap=60.0)
    name = f"lpref-{uuid.uuid4().hex[:8]}"
    first = distlock.DistReadWriteLock(name, client=client, lease=60).read_lock()
    assert first.acquire(blocking=False)
    lock = distlock.DistLock(name, client=client, lease=60)
    held = threading.Event()
    done = threading.Event()

    def wait_for_the_lock() -> None:
        if lock.acquire(timeout=WOKEN_WITHIN):
            held.set()
            done.wait(WOKEN_WITHIN)
            lock.release()

    waiter = threading.Thread(target=wait_for_the_lock)
    waiter.start()
    got: List[str] = []
    reader: threading.Thread = threading.Thread()
    try:
        until(_registered(client, name), what="the lock's waiter to register")
        late = distlock.DistReadWriteLock(name, client=client, lease=60).read_lock()
        tried: List[bool] = []  # (in a thread of its own: this one's read hold is first's)
        probe = threading.Thread(target=lambda: tried.append(late.acquire(blocking=False)))
        probe.start()
        probe.join(WOKEN_WITHIN)
        assert tried == [False], "a new reader went ahead of the waiting lock"

        def read() -> None:
            started = time.monotonic()
            if late.acquire(timeout=WOKEN_WITHIN):  # unwoken, it would return at its deadline
                got.append("read" if time.monotonic() - started < WOKEN_WITHIN / 2 else "late")
                late.release()

        reader = threading.Thread(target=read)
        reader.start()
        time.sleep(0.3)
        first.release()  # the last reader out wakes the lock's waiter
        assert held.wait(WOKEN_WITHIN), "the waiting lock was not woken by the last reader"
        assert not got
        done.set()  # the lock's release wakes the reader that waited behind it
        reader.join(WOKEN_WITHIN + 10)
        assert got == ["read"]
    finally:
        done.set()
        waiter.join(WOKEN_WITHIN + 10)
        if reader.is_alive():
            reader.join(WOKEN_WITHIN + 10)


def test_readers_behind_a_lock_waiter_that_gives_up_are_woken(client: Any) -> None:
    """A process that stops waiting for the lock (its timeout) lets the readers that waited
    behind it in at once: it hints them as it leaves the registry."""
    distlock.configure(wait_cap=60.0)
    name = f"lgive-{uuid.uuid4().hex[:8]}"
    first = distlock.DistReadWriteLock(name, client=client, lease=60).read_lock()
    assert first.acquire(blocking=False)
    gave_up = threading.Event()
    waiter = threading.Thread(target=lambda: distlock.DistLock(name, client=client).acquire(
        timeout=2.0) or gave_up.set())
    waiter.start()
    got: List[float] = []
    try:
        until(_registered(client, name), what="the lock's waiter to register")
        late = distlock.DistReadWriteLock(name, client=client, lease=60).read_lock()

        def read() -> None:
            started = time.monotonic()
            if late.acquire(timeout=WOKEN_WITHIN):  # unwoken, it would return at its deadline
                got.append(time.monotonic() - started)
                late.release()

        reader = threading.Thread(target=read)
        reader.start()
        reader.join(WOKEN_WITHIN + 10)
        waiter.join(WOKEN_WITHIN)
        assert gave_up.is_set() and got and got[0] < WOKEN_WITHIN / 2, \
            f"the reader behind the lock's waiter was not woken: {got}"
    finally:
        first.release()
        waiter.join(WOKEN_WITHIN)
