"""The watchdog thread: nothing stops it (docs/design.rst, principle 11).

tests/primitives/test_lifetimes.py injects errors into the renewal round trip; these inject them into
the rest of the thread's loop (its idle check, its deferred work), where an exception used to
end the thread for good, leaving every hold unrenewed and none of them reported lost.
"""

from __future__ import annotations

import os
import resource
import socket
import threading
import weakref
from types import SimpleNamespace
from typing import Any, List

import pytest
from _support import renewals_seen, until

import distlock
from distlock import DistLock, DistRLock
from distlock._session.wakeup import Wakeup
from distlock._session.watchdog import Watchdog

#: Leases long enough that a loaded machine's late renewal is not taken for a missing one: the
#: tests wait for renewals to reach the server (``renewed``), they judge no timing.
LEASE = {"lease": 3.0, "renew_interval": 0.2}


def renewed(client: Any, key: str, count: int = 2) -> None:
    """Wait until ``count`` renewals of ``key`` reached the server."""
    renewals_seen(lambda: client.pttl(key), count, what=key)


@pytest.mark.real_redis
@pytest.mark.parametrize("cls", [DistLock, DistRLock])
def test_an_error_in_the_idle_check_does_not_stop_the_renewals(
        client: Any, cls: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    distlock.configure(**LEASE)
    lock = cls("wd-loop", client=client)
    lost: List[Any] = []
    lock.on_lost(lost.append)
    real = Watchdog._idle_locked
    failures = [3]

    def flaky(self: Watchdog) -> bool:
        if failures[0] > 0:
            failures[0] -= 1
            raise ZeroDivisionError("a bug in the idle check")
        return real(self)

    monkeypatch.setattr(Watchdog, "_idle_locked", flaky)
    with lock:
        until(lambda: failures[0] == 0, 30.0, "three failed idle checks")
        renewed(client, "distlock:{wd-loop}")  # after the failures: only renewals keep it
        assert lock.owned() and not lost
        assert client.exists("distlock:{wd-loop}")
        assert lock._session().watchdog.running


@pytest.mark.real_redis
def test_a_deferred_task_that_raises_anything_does_not_stop_the_watchdog(
        client: Any) -> None:
    distlock.configure(**LEASE)
    lock = DistLock("wd-deferred", client=client)
    with lock:
        session = lock._session()

        def bad() -> None:
            raise SystemExit("a task that raises what no 'except Exception' catches")

        session.defer(bad)
        renewed(client, "distlock:{wd-deferred}")
        assert lock.owned()
        assert client.exists("distlock:{wd-deferred}")
        assert session.watchdog.running


@pytest.mark.real_redis
def test_configure_shortening_the_lease_applies_to_a_running_watchdog(client: Any) -> None:
    """The watchdog reads the renew interval afresh: a hold taken after configure() shortened
    the lease is renewed in time, even though the thread last slept on the old interval."""
    distlock.configure(lease=120.0, renew_interval=60.0)
    warm = DistLock("wd-warm", client=client)
    with warm:  # the watchdog thread is running, on the 60 s interval
        distlock.configure(**LEASE)
        lock = DistLock("wd-short", client=client)
        lost: List[Any] = []
        lock.on_lost(lost.append)
        with lock:
            # On the old interval the first renewal would come after the new lease ran out.
            renewed(client, "distlock:{wd-short}")
            assert lock.owned() and not lost
        assert not lost


# --- Wakeup: the thread's wait, on its kick and on its idle connection's socket ---------------


def test_a_wakeup_set_before_the_wait_ends_it_at_once() -> None:
    wakeup = Wakeup()
    try:
        wakeup.set()
        assert wakeup.is_set() and wakeup.wait(60.0) is False  # the kick, not a socket
        wakeup.clear()
        assert not wakeup.is_set() and wakeup.wait(0.0) is False
    finally:
        wakeup.close()


def test_a_wakeup_set_from_another_thread_ends_a_wait() -> None:
    wakeup = Wakeup()
    timer = threading.Timer(0.05, wakeup.set)
    try:
        timer.start()
        assert wakeup.wait(60.0) is False and wakeup.is_set()
    finally:
        timer.cancel()
        wakeup.close()


def test_a_wakeup_ends_when_a_watched_socket_closes() -> None:
    """The server's FIN makes the idle socket readable: the wait ends, and says a socket did;
    a socket closed under the wait (another thread dropped the connection) makes it a plain
    wait, never an error."""
    wakeup = Wakeup()
    ours, theirs = socket.socketpair()
    try:
        assert wakeup.wait(0.01, [ours]) is False  # nothing yet: the timeout ends it
        theirs.close()
        assert wakeup.wait(60.0, [ours]) is True
        ours.close()
        assert wakeup.wait(0.01, [ours]) is False
    finally:
        ours.close()
        theirs.close()
        wakeup.close()


def test_a_closed_wakeup_makes_a_new_pair_for_the_next_thread() -> None:
    wakeup = Wakeup()
    assert wakeup.wait(0.0) is False
    wakeup.close()
    wakeup.close()  # idempotent
    wakeup.set()  # no pair: the flag alone, which the next wait sees
    assert wakeup.wait(60.0) is False
    wakeup.clear()
    timer = threading.Timer(0.05, wakeup.set)
    try:
        timer.start()
        assert wakeup.wait(60.0) is False
    finally:
        timer.cancel()
        wakeup.close()


def test_a_reset_is_acted_on_before_it_is_marked_seen() -> None:
    """``renewal_reset(then)`` runs ``then`` (the suspension) before it marks the closed socket
    as seen: another thread that looks meanwhile must find the reset too, not be told there is
    none while the holds are not suspended yet (it would go on believing after the FIN)."""
    from distlock._redis.executor import Executor

    ours, theirs = socket.socketpair()
    theirs.close()  # the server's FIN
    try:
        pool = SimpleNamespace(_available_connections=[SimpleNamespace(_sock=ours)])
        stub = SimpleNamespace(_renewal_pools=lambda: [pool], _reset_seen=weakref.WeakSet())
        meanwhile: List[bool] = []
        assert Executor.renewal_reset(stub, lambda: meanwhile.append(  # type: ignore[arg-type]
            Executor.renewal_reset(stub))) is True  # type: ignore[arg-type]
        assert meanwhile == [True]
        assert Executor.renewal_reset(stub) is False  # type: ignore[arg-type]  # each once
    finally:
        ours.close()


def test_a_descriptor_above_1023_is_waited_on_and_peeked_at() -> None:
    """``select`` takes no descriptor above 1023; a process with many files open has its
    watchdog's connection there. The wait and the peek use ``poll``."""
    from distlock._redis.direct import closed_idle

    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 1200:
        pytest.skip(f"RLIMIT_NOFILE is {soft}: no descriptor above 1023 to try")
    ours, theirs = socket.socketpair()
    high = socket.socket(fileno=os.dup2(ours.fileno(), 1100))
    ours.close()
    wakeup = Wakeup()
    try:
        assert high.fileno() == 1100
        assert wakeup.wait(0.05, [high]) is False  # nothing yet: the timeout ends it
        theirs.close()
        assert wakeup.wait(60.0, [high]) is True
        pool = SimpleNamespace(_available_connections=[SimpleNamespace(_sock=high)])
        assert closed_idle(pool, weakref.WeakSet()) == [high]
    finally:
        high.close()
        theirs.close()
        wakeup.close()


@pytest.mark.real_redis
@pytest.mark.parametrize("cls", [DistLock, DistRLock])
def test_a_release_after_the_deadline_reports_the_loss_whatever_the_thread_did(
        client: Any, cls: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Belief ends at the local deadline, not when the watchdog thread gets to it: a release
    just after the deadline raises LockLostError and runs ``on_lost`` (in the releasing
    thread) even when the thread has not reported it yet (here it never does), and gives back
    the hold Redis still has."""
    monkeypatch.setattr(Watchdog, "_expire_due", lambda self: None)
    lock = cls("wd-deadline-release", client=client, lease=0.3)
    lost: List[Any] = []
    lock.on_lost(lost.append)
    assert lock.acquire()
    # Redis keeps it longer than the local deadline (which is never later than Redis's own):
    # a release that went to Redis unwarned would find it and succeed
    client.pexpire("distlock:{wd-deadline-release}", 10_000)
    until(lambda: lock.valid_for() == 0.0, what="the deadline")
    with pytest.raises(distlock.LockLostError):
        lock.release()
    assert lost == [lock] and not lock.owned()
    assert client.exists("distlock:{wd-deadline-release}") == 0
