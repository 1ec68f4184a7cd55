"""The pub/sub connection lent to a sleeping thread (``distlock._redis.lending``).

While the dispatcher thread has nothing else to read for, a waiting thread reads its process'
pub/sub connection itself, so the message that wakes it needs no second thread. Checked here
against a real server: the loan is taken and given back; a wake-up from inside the process
(an in-process hand-off) reaches the borrower through its bell; a second waiter's hint is
dispatched by the borrower; a connection that breaks during a loan is mended by the
dispatcher; the bell goes with the dispatcher thread.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any, List

import pytest
from _procs import in_forked_child

import distlock
from distlock import DistLock
from distlock._redis import lending
from distlock._redis.direct import readable
from distlock._session.session import session_for

pytestmark = pytest.mark.real_redis


def _lender(client: Any) -> Any:
    return session_for(client).dispatcher._lender


def _until(check: Any, what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not seen within {timeout} s: {what}")
        time.sleep(0.005)


def _waiter(lock: DistLock, results: List[Any], timeout: float = 30.0) -> threading.Thread:
    def run() -> None:
        ok = lock.acquire(timeout=timeout)
        results.append(ok)
        if ok:
            lock.release()

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def _borrowing(holder_client: Any, client: Any, name: str, timeout: float = 30.0) -> Any:
    """``holder_client`` (another process, for the lock) takes ``name``; a thread of
    ``client``'s process waits for it, until it borrows the connection. Returns the holder,
    the waiting thread, its results and the lender."""
    holder = DistLock(name, client=holder_client, lease=60)
    assert holder.acquire()
    results: List[Any] = []
    t = _waiter(DistLock(name, client=client, lease=60), results, timeout=timeout)
    lender = _lender(client)
    _until(lambda: lender.lent_to is not None, "the waiter borrowing the connection")
    return holder, t, results, lender


def test_a_lone_waiter_reads_the_connection_itself(backend: Any, client: Any) -> None:
    """A thread waiting for a lock held by another process borrows its process' connection;
    the release's message wakes it, and the loan is given back."""
    other = backend.client()
    try:
        holder, t, results, lender = _borrowing(other, client, "lend:lone")
        assert lender.parked
        holder.release()
        t.join(40)
        assert results == [True]
        assert lender.lent_to is None
    finally:
        other.close()


def test_a_hand_off_in_the_process_rings_the_borrower(client: Any, monkeypatch: Any) -> None:
    """A release of the borrower's own process hands it the lock with no message on the
    connection: the bell ends its read at once, long before its read's own deadline."""
    lender = _lender(client)
    monkeypatch.setattr(lender, "_tick", 60.0)  # a read would otherwise look again each tick
    ended_early: List[bool] = []
    real_read = lending.Lender.read

    def read(self: Any, waiter: Any, loan: Any, until: float) -> None:
        real_read(self, waiter, loan, until)
        ended_early.append(time.monotonic() < until)

    monkeypatch.setattr(lending.Lender, "read", read)
    holder = DistLock("lend:ring", client=client, lease=60)
    assert holder.acquire()
    results: List[Any] = []
    # a wait whose sleeps last long: its read ends early only if the bell rang
    t = _waiter(DistLock("lend:ring", client=client, lease=60), results, timeout=120.0)
    _until(lambda: lender.lent_to is not None, "the waiter borrowing the connection")
    holder.release()  # the in-process hand-off: Board.hand sets the waiter's event
    t.join(150)
    assert results == [True]
    assert ended_early and ended_early[-1]


def test_the_borrower_dispatches_another_waiters_hint(backend: Any, client: Any) -> None:
    """Two threads wait for two locks: one borrows, the other sleeps on its event; each is
    woken by its own lock's release, whoever reads."""
    other = backend.client()
    try:
        a, b = DistLock("lend:a", client=other, lease=60), DistLock("lend:b", client=other, lease=60)
        assert a.acquire() and b.acquire()
        got_a: List[Any] = []
        got_b: List[Any] = []
        # the second starts once the first borrows (started together, both may find the
        # dispatcher reading the other's subscription, and sleep on their events)
        distlock.configure(wait_cap=60)  # no bound ends the loan meanwhile
        lender = _lender(client)
        ta = _waiter(DistLock("lend:a", client=client, lease=60), got_a)
        _until(lambda: lender.lent_to is not None, "the first waiter borrowing the connection")
        tb = _waiter(DistLock("lend:b", client=client, lease=60), got_b)
        _until(lambda: lender.lent_to is not None and lender.sleepers >= 1,
               "one waiter borrowing, the other asleep on its event")
        b.release()  # the sleeper's lock: the borrower reads its message
        tb.join(40)
        assert got_b == [True] and got_a == []
        a.release()
        ta.join(40)
        tb.join(40)
        assert got_a == [True] and got_b == [True]
    finally:
        other.close()


def test_a_connection_broken_during_a_loan_is_mended(backend: Any, client: Any) -> None:
    """The server drops the pub/sub connection while a thread reads it: the loan ends, the
    dispatcher reconnects and subscribes again, and the waiter still gets the lock."""
    other = backend.client()
    try:
        holder, t, results, _ = _borrowing(other, client, "lend:broken")
        session = session_for(client)
        before = session.dispatcher.reconnects
        assert other.client_kill_filter(_type="pubsub") >= 1
        _until(lambda: session.dispatcher.reconnects > before, "the dispatcher reconnecting")
        _until(lambda: bool(session.dispatcher.subscribed()), "the channel subscribed again")
        holder.release()
        t.join(40)
        assert results == [True]
    finally:
        other.close()


def test_a_loan_ends_when_the_board_needs_the_dispatcher(backend: Any, client: Any) -> None:
    """A channel waited on that must be subscribed again (as after a reconnect) is only the
    dispatcher's to subscribe: the borrower gives the connection back for it, the dispatcher
    subscribes it, and its waiter is still woken by the release."""
    distlock.configure(wait_cap=60)  # no bound ends the loan meanwhile
    other = backend.client()
    try:
        holder, t, results, lender = _borrowing(other, client, "lend:again", timeout=120.0)
        board = session_for(client).dispatcher
        channel = lender.lent_to.channel.name
        with board.mutex:
            board._reset_channels()  # every channel to subscribe again, as on a new connection
        _until(lambda: channel in board.subscribed(), "the channel subscribed again")
        holder.release()
        t.join(150)
        assert results == [True]
    finally:
        other.close()


def test_the_bell_goes_with_the_dispatcher_thread(backend: Any, client: Any) -> None:
    """Once nobody waits, the dispatcher thread exits idle, and the bell's socket pair is
    closed with it: a process that stops waiting keeps nothing for it."""
    other = backend.client()
    try:
        holder, t, results, _ = _borrowing(other, client, "lend:idle")
        dispatcher = session_for(client).dispatcher
        bell = dispatcher._lender._bell
        assert bell is not None
        holder.release()
        t.join(40)
        assert results == [True]
        _until(lambda: not dispatcher.running, "the dispatcher thread exiting idle")
        assert dispatcher._lender._bell is None
        assert all(end.fileno() == -1 for end in bell)
    finally:
        other.close()


def test_a_forked_child_closes_its_copy_of_the_bell(backend: Any, client: Any) -> None:
    """A child forked while a thread borrows the connection drops the sessions it inherited,
    and closes its copies of their bells' sockets; the parent's loan goes on, and ends with
    the release as ever."""
    other = backend.client()
    try:
        holder, t, results, lender = _borrowing(other, client, "lend:fork")
        bell = lender._bell
        assert bell is not None
        status, report = in_forked_child(
            lambda: "closed" if lender._bell is None and all(end.fileno() == -1 for end in bell)
            else "open")
        assert status == 0
        assert report == "closed"
        assert all(end.fileno() != -1 for end in bell)  # the parent's own are untouched
        holder.release()
        t.join(40)
        assert results == [True]
    finally:
        other.close()


def test_quorum_and_cluster_node_dispatchers_do_not_lend() -> None:
    """A quorum's waiter sleeps on every master's dispatcher at once, and a cluster node's
    connection speaks through a translating wrapper: neither lends its connection."""
    from distlock._redis.dispatcher import Dispatcher
    from distlock._redis.pubsub_cluster import _NodeDispatcher
    from distlock._redis.pubsub_quorum import MasterDispatcher

    assert not MasterDispatcher.lends and not _NodeDispatcher.lends
    assert Dispatcher.lends  # one server's and a Sentinel master's do, by default
    assert issubclass(MasterDispatcher, Dispatcher) and issubclass(_NodeDispatcher, Dispatcher)


def test_the_wait_sees_sockets_past_selects_limit() -> None:
    """A process may have more than select()'s 1024 file descriptors: the borrower's wait
    (``direct.readable``: poll where there is one) still sees a socket numbered past it."""
    import resource
    import socket

    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft <= 1100:
        pytest.skip(f"this process may open only {soft} files")
    a, b = socket.socketpair()
    ring, bell = socket.socketpair()
    high = socket.socket(fileno=os.dup2(a.fileno(), 1090))
    try:
        assert readable([high, bell], 0.0) == []
        b.send(b"x")
        assert readable([high, bell], 5.0) == [high]
        ring.send(b"\0")
        assert bell in readable([high, bell], 5.0)
    finally:
        for s in (a, b, ring, bell, high):
            s.close()


class _Interrupted(Exception):
    pass


def test_a_signal_handlers_exception_ends_the_borrowers_wait(backend: Any, client: Any) -> None:
    """The main thread borrows the connection and a signal comes: what its handler raises
    leaves ``acquire()`` (``distlock run --leader`` ends this way), not swallowed by the loan."""
    import signal

    if threading.current_thread() is not threading.main_thread():
        pytest.skip("signals reach the main thread only")
    other = backend.client()
    holder = DistLock("lend:signal", client=other, lease=60)
    assert holder.acquire()

    def interrupted(signum: int, frame: Any) -> None:
        raise _Interrupted()

    previous = signal.signal(signal.SIGUSR1, interrupted)
    lender = _lender(client)
    sent: List[bool] = []

    def send() -> None:
        _until(lambda: lender.lent_to is not None, "the main thread borrowing the connection")
        sent.append(True)
        os.kill(os.getpid(), signal.SIGUSR1)

    t = threading.Thread(target=send, daemon=True)
    t.start()
    try:
        with pytest.raises(_Interrupted):
            DistLock("lend:signal", client=client, lease=60).acquire(timeout=60)
        assert sent
    finally:
        t.join(30)
        signal.signal(signal.SIGUSR1, previous)
        holder.release()
        other.close()
