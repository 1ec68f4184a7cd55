"""DistSemaphore and DistBoundedSemaphore: threading's contract, and what must hold across
processes.

The contract classes are keyed by ``semtypes`` (as ``test_contract.py`` keys locks): every test
runs against ``threading.Semaphore`` / ``threading.BoundedSemaphore`` themselves, which proves
the test, and against the Dist twins. Where the contract is "as threading does", the same call
runs on a threading twin in the same state and the outcomes are compared. Timing is asserted
only as generous bounds; every thread and process is joined (or killed) with a bound.
"""

from __future__ import annotations

import math
import os
import signal
import threading
import time
import warnings
from typing import Any, Iterator, List, Tuple

import _sem_event_barrier_workers
import pytest
from _procs import Children, recv
from _sem_contract import SemaphoreContract, SemType, _name, drain, in_thread  # noqa: F401 - the contract is collected here
from _support import BOUND, sem_permits
from _support import distlock_keys as _keys
from _support import until as _until

import distlock
from distlock import DistBoundedSemaphore, DistSemaphore, LockLostError
from distlock._primitives.semaphore import check_sem_acquire_args
from distlock._session.session import session_for


def _permits(client: Any, sem: Any) -> List[Tuple[bytes, float]]:
    """The permits held on ``sem`` (without its counters), by lease deadline."""
    return sem_permits(client, sem._keys.sem)


# --- semaphore types --------------------------------------------------------------------------


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "type_id" in metafunc.fixturenames and metafunc.cls is not None:
        metafunc.parametrize("type_id", metafunc.cls.semtypes)


# --- the contract -----------------------------------------------------------------------------


# --- what only the distributed semaphores do ---------------------------------------------------

@pytest.fixture
def other_client(backend: Any, client: Any) -> Iterator[Any]:
    """A second client of the same server: its session stands for another process."""
    second = backend.client()
    try:
        yield second
    finally:
        second.close()


@pytest.mark.parametrize("cls", [DistSemaphore, DistBoundedSemaphore])
def test_constructor_checks(client: Any, cls: Any) -> None:
    with pytest.raises(TypeError):
        cls(1, client=client)
    with pytest.raises(ValueError):
        cls("", client=client)
    with pytest.raises(TypeError):
        cls("x", 2.5, client=client)  # a count of permits: an int
    with pytest.raises(ValueError):
        cls("x", lease=0, client=client)
    with pytest.raises(TypeError):
        cls("x", client=42)
    with pytest.raises(TypeError):
        cls("x", 1, client, None)  # keyword-only options
    assert cls("x", True, client=client).name == "x"  # threading takes a bool, so do we


def test_check_acquire_args_is_threadings() -> None:
    assert check_sem_acquire_args(True, None) == (True, None)
    assert check_sem_acquire_args(False, None) == (False, 0.0)
    assert check_sem_acquire_args(1, 2) == (True, 2.0)
    assert check_sem_acquire_args(True, -3) == (True, 0.0)
    with pytest.raises(ValueError, match="Invalid value NaN"):
        check_sem_acquire_args(True, math.nan)  # threading would spin for ever


def test_nothing_left_at_rest(client: Any) -> None:
    sem = DistSemaphore(_name(), 2, client=client)
    sem.acquire()
    sem.acquire()
    assert _keys(client) == [sem._keys.sem]
    assert sem.acquire(timeout=0.1) is False  # a waiter queued, then left
    sem.release(2)
    assert _keys(client) == []
    sem.release()  # a count raised above the value is state: it stays
    assert _keys(client) == [sem._keys.sem]
    assert client.ttl(sem._keys.sem) == -1
    assert drain(sem) == 3
    sem.release(3)
    assert _keys(client) == [sem._keys.sem]


def test_value_mismatch_names_the_recorded_value(client: Any) -> None:
    name = _name()
    first = DistSemaphore(name, 3, client=client)
    other = DistBoundedSemaphore(name, 5, client=client)  # no I/O: constructing is fine
    first.acquire()
    with pytest.raises(ValueError, match=r"created with value 3, not 5"):
        other.acquire()
    with pytest.raises(ValueError, match=r"created with value 3, not 5"):
        other.release()
    first.release()
    # At rest nothing is recorded: the next first use records its own value.
    assert other.acquire() is True
    with pytest.raises(ValueError, match=r"created with value 5, not 3"):
        first.acquire(False)
    other.release()
    assert _keys(client) == []


def test_same_name_is_one_count(client: Any) -> None:
    name = _name()
    a, b = DistSemaphore(name, 2, client=client), DistBoundedSemaphore(name, 2, client=client)
    assert a.acquire(False) and b.acquire(False)
    assert not a.acquire(False) and not b.acquire(False)
    b.release()
    a.release()
    with pytest.raises(ValueError, match="^Semaphore released too many times$"):
        b.release()
    assert _keys(client) == []


def test_watchdog_keeps_permits(client: Any) -> None:
    distlock.configure(lease=1.0, renew_interval=0.25)
    sem = DistSemaphore(_name(), 1, client=client)
    lost: List[Any] = []
    sem.on_lost(lost.append)
    sem.acquire()
    first = _permits(client, sem)[0][1]
    _until(lambda: _permits(client, sem)[0][1] > first)
    time.sleep(1.2)  # longer than the lease
    assert in_thread(lambda: DistSemaphore(sem.name, 1, client=client).acquire(False)) is False
    sem.release()
    assert lost == []
    assert _keys(client) == []


def test_explicit_lease_expires_and_release_reports_it(client: Any) -> None:
    name = _name()
    sem = DistSemaphore(name, 1, client=client, lease=0.5)
    lost: List[Any] = []
    sem.on_lost(lost.append)
    started = time.monotonic()
    assert sem.acquire() is True

    def take() -> Tuple[bool, float]:
        other = DistSemaphore(name, 1, client=client)
        ok = other.acquire(timeout=BOUND)
        at = time.monotonic() - started
        if ok:
            other.release()
        return ok, at

    ok, at = in_thread(take)
    assert ok is True and 0.4 <= at <= BOUND  # not before the lease ran out
    with pytest.raises(LockLostError, match="lost"):
        sem.release()
    assert lost == [sem]
    assert drain(sem) == 1  # the lost permit was not counted twice
    sem.release()
    assert _keys(client) == []


def test_permit_taken_at_rest_lives_by_the_key_until_settled(client: Any) -> None:
    """The uncontended path reads no clock: a permit taken at rest is scored +inf, and its
    deadline is the key's expiry. The next acquire writes that deadline out before it adds its
    own permit (which may extend the key), so each permit still ends with its own lease."""
    name = _name()
    first = DistSemaphore(name, 2, client=client, lease=5)
    assert first.acquire() is True
    key = first._keys.sem
    ((member, score),) = client.zrangebyscore(key, 0, "+inf", withscores=True)
    assert math.isinf(score) and 4000 < client.pttl(key) <= 5000
    second = DistSemaphore(name, 2, client=client, lease=8)
    assert second.acquire() is True
    seconds, micros = client.time()
    now = seconds * 1000 + micros // 1000
    deadlines = dict(client.zrangebyscore(key, 0, "+inf", withscores=True))
    assert len(deadlines) == 2 and not any(math.isinf(d) for d in deadlines.values())
    assert 3000 < deadlines[member] - now <= 5000  # the first permit kept its own lease
    assert 7000 < client.pttl(key) <= 8000  # the key lives as long as the latest lease
    second.release()
    first.release()
    assert _keys(client) == []


def test_release_on_another_processs_behalf(client: Any, other_client: Any) -> None:
    """A process that holds no permit releases one: the permit another process holds (whose
    lease runs out first) is given back, and its owner forgets it quietly. The record of the
    release on its behalf lives as long as the permit's lease: 5 s, so that a renewal a loaded
    machine delays still finds it. (The read-back of a session's first hold used to call the
    permit lost when it came after the release, which deletes the key at rest: see
    ``renewal.check_round``.)"""
    distlock.configure(lease=5.0, renew_interval=0.2)
    name = _name()
    owner = DistSemaphore(name, 1, client=client)
    stranger = DistSemaphore(name, 1, client=other_client)
    lost: List[Any] = []
    owner.on_lost(lost.append)
    owner.acquire()
    assert stranger.acquire(False) is False
    stranger.release()  # threading: any thread may release
    assert _permits(client, owner) == []
    assert stranger.acquire(False) is True  # the count is back to 1, then taken
    session = session_for(client)
    _until(lambda: not [h for (k, _), h in session.holds.items() if k == owner._keys.sem])
    assert lost == []  # forgotten quietly, not lost
    # The owner releases "its" permit again: threading counts that as one more release.
    owner.release()
    assert stranger.acquire(False) is True
    stranger.release(2)
    assert drain(owner) == 2
    owner.release(2)


def test_bounded_release_on_behalf_then_owner_release_is_too_many(client: Any,
                                                                   other_client: Any) -> None:
    name = _name()
    owner = DistBoundedSemaphore(name, 1, client=client, lease=5)
    stranger = DistBoundedSemaphore(name, 1, client=other_client)
    owner.acquire()
    stranger.release()
    with pytest.raises(ValueError, match="^Semaphore released too many times$"):
        owner.release()
    with pytest.raises(ValueError, match="^Semaphore released too many times$"):
        owner.release()
    assert drain(owner) == 1
    owner.release()


def test_calling_thread_permit_goes_back_first(client: Any) -> None:
    sem = DistSemaphore(_name(), 2, client=client)
    sem.acquire()
    mine = {member for member, _ in _permits(client, sem)}
    in_thread(sem.acquire)
    theirs = {member for member, _ in _permits(client, sem)} - mine
    sem.release()  # this thread's permit goes back; the other thread's stays
    assert {member for member, _ in _permits(client, sem)} == theirs
    in_thread(sem.release)
    assert _keys(client) == []


def test_expired_holder_wakes_waiters(client: Any) -> None:
    """Permits whose holder stopped renewing (lease=...) come back; the waiters, whose sleep is
    bounded by the first lease to run out (not by the 10 s cap), take them without any
    release: the first one's try finds both expired and tells the other."""
    distlock.configure(wait_cap=10.0)
    name = _name()
    holder = DistSemaphore(name, 2, client=client, lease=0.6)
    before = time.monotonic()  # each permit's lease began after this, on the server too
    holder.acquire()
    holder.acquire()
    results: List[bool] = []

    def wait() -> None:
        sem = DistSemaphore(name, 2, client=client)
        ok = sem.acquire(timeout=BOUND)
        results.append(ok)
        if ok:
            sem.release()

    started = time.monotonic()
    threads = [threading.Thread(target=wait, daemon=True) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(BOUND)
    assert results == [True, True]
    # not before the leases ran out (counted from before the grants: on a loaded machine the
    # grants themselves can take a good part of a lease), and well before the cap alone (10 s)
    assert 0.5 <= time.monotonic() - before and time.monotonic() - started < 6.0
    # The second waiter may have taken the permit the first gave back, before the holder's
    # second permit ran out: both of the holder's leases are over (on the server too: each
    # began before ``started``) only 0.6 s after ``started``.
    time.sleep(max(0.0, started + 0.65 - time.monotonic()))
    for _ in range(2):
        with pytest.raises(LockLostError):
            holder.release()
    assert _keys(client) == []


# --- across processes ---------------------------------------------------------------------------

@pytest.mark.real_redis
@pytest.mark.slow
def test_processes_never_exceed_the_value(client: Any, url: str, children: Children) -> None:
    name, gauge, high = _name(), _name("gauge"), _name("high")
    conns = [children.start(_sem_event_barrier_workers.sem_worker, url, name, 2, 15, gauge, high)
             for _ in range(4)]
    for conn in conns:
        assert recv(conn)[0] == "ready"
    for conn in conns:
        conn.send("go")
    done = [recv(conn, 120.0) for conn in conns]
    assert done == [("done", 15)] * 4
    assert int(client.get(gauge)) == 0
    assert 1 <= int(client.get(high)) <= 2
    assert _keys(client) == []
    client.delete(gauge, high)


@pytest.mark.real_redis
@pytest.mark.slow
def test_sigkilled_holder_gives_permits_back(client: Any, url: str, children: Children) -> None:
    """A holder killed with SIGKILL: its permits come back when their lease runs out, and
    waiters in three other processes get them."""
    name = _name()
    settings = {"lease": 1.0, "renew_interval": 0.25}
    holder = children.start(_sem_event_barrier_workers.sem_holder, url, name, 2, 2, settings)
    kind, pid = recv(holder)
    assert kind == "held"
    waiters = [children.start(_sem_event_barrier_workers.sem_waiter, url, name, 2, 60.0) for _ in range(3)]
    for conn in waiters:
        assert recv(conn)[0] == "ready"
    for conn in waiters:
        conn.send("go")
        assert recv(conn) == ("waiting",)
    time.sleep(1.5)  # longer than the lease: the watchdog keeps them held while it lives
    assert not any(conn.poll(0) for conn in waiters)
    assert len(_permits(client, DistSemaphore(name, 2))) == 2
    os.kill(pid, signal.SIGKILL)
    children.procs[0].join(10.0)
    assert [recv(conn, BOUND) for conn in waiters] == [("got", True)] * 3
    _until(lambda: _keys(client) == [])


@pytest.mark.real_redis
def test_fork_child_owns_nothing(client: Any, url: str) -> None:
    if not hasattr(os, "fork"):
        pytest.skip("no fork")
    sem = DistSemaphore(_name(), 1, client=client)
    sem.acquire()
    r, w = os.pipe()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # fork() with threads running (3.12+)
        pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            try:
                sem.release()  # holds nothing here: raises the count, like a stranger
                os.write(w, b"ok")
            except Exception as exc:  # noqa: BLE001
                os.write(w, repr(exc).encode())
        finally:
            os._exit(0)
    os.close(w)
    got = os.read(r, 200)
    os.close(r)
    os.waitpid(pid, 0)
    assert got == b"ok"
    # The child's release gave back our permit on our behalf: the count is 1 again.
    assert sem.acquire(False) is True
    sem.release()
