"""A watchdog thread that exits idle while the next one starts (docs/design.rst, principle 11:
a helper thread with nothing to do exits, and comes back on demand).

The thread that exits closes the watchdog's own connection (the executor's renewer) on its way
out. A new hold may start the next thread in that moment; the connection is the executor's,
not the thread's, so the next thread renews through the very connection the exiting one is
about to close. The test holds the exiting thread right before its last step until the next
thread's renewal is on the wire, and checks that the renewal's reply is read, not cut off.
"""

from __future__ import annotations

import threading
from typing import Any, List

import pytest
from _support import BOUND, until

import distlock
from distlock import DistLock


@pytest.mark.real_redis
def test_an_exiting_watchdog_thread_leaves_the_next_ones_renewal_alone(
        client: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    distlock.configure(lease=3.0, renew_interval=0.2)
    first = DistLock("wd-restart:first", client=client)
    second = DistLock("wd-restart:second", client=client)
    session = first._session()
    watchdog, executor = session.watchdog, session.executor
    exiting, in_flight = threading.Event(), threading.Event()
    held_back: List[Any] = []
    outcome: List[Any] = []

    loop_body = watchdog._run

    def run_then_hold_back() -> None:
        """The first thread, once its loop is over (idle), waits before its last step until
        the next thread's renewal is on the wire."""
        loop_body()
        if not held_back:
            held_back.append(threading.current_thread())
            exiting.set()
            in_flight.wait(BOUND)
    monkeypatch.setattr(watchdog, "_run", run_then_hold_back)

    assert first.acquire()
    until(lambda: executor._renewer is not None, what="the first thread's renewal")
    first_thread = watchdog._thread
    twin = executor._renewer[1]
    pool = twin.connection_pool
    get_connection = pool.get_connection

    def gated(*args: Any, **kwargs: Any) -> Any:
        """The next thread's first read on the watchdog's connection waits until the first
        thread is gone (whatever it did to the connection on its way out). Renewals are read
        on the renewals worker, the same thread for both watchdog threads: a read is the next
        thread's once the first one's loop is over (a renewal of the first hold, read before
        that, would wait for a thread that cannot exit while it is in flight)."""
        conn = get_connection(*args, **kwargs)
        if exiting.is_set() and not in_flight.is_set():
            read = conn.read_response

            def read_once_the_first_is_gone(*a: Any, **kw: Any) -> Any:
                conn.read_response = read
                in_flight.set()
                assert first_thread is not None
                first_thread.join(BOUND)
                try:
                    reply = read(*a, **kw)
                except BaseException as exc:
                    outcome.append(exc)
                    raise
                outcome.append("read")
                return reply
            conn.read_response = read_once_the_first_is_gone
        return conn
    monkeypatch.setattr(pool, "get_connection", gated)

    first.release()  # the first thread has nothing left: it exits IDLE_EXIT later
    assert exiting.wait(BOUND), "the first watchdog thread did not exit"
    try:
        assert second.acquire()  # starts the next thread, which renews 0.2 s later
        until(lambda: outcome, what="the next thread's renewal")
        assert outcome == ["read"], outcome  # not a connection closed under it
        assert executor._renewer is not None and executor._renewer[1] is twin
        assert second.owned()
    finally:
        in_flight.set()
        if second.owned():
            second.release()
