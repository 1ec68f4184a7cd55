"""The watchdog thread's loop against a stub executor whose renewal round takes a while: one
round at a time, the next due from the end of the last, and no spinning while one is in
flight. Counts over a bounded run are upper bounds: a slow machine only lowers them."""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Any, Iterator, List, Tuple

import pytest

import distlock
from distlock._core.settings import reset_settings
from distlock._session.hold import Hold
from distlock._session.watchdog import Watchdog

ROUND = 0.3  # how long the stub's round trip takes
RUN = 2.0


class _Slow:
    def __init__(self) -> None:
        self.rounds = 0

    def renewal_batch(self) -> _Slow:
        return self

    def execute(self, raise_on_error: bool = True) -> List[Any]:
        self.rounds += 1
        time.sleep(ROUND)
        return [1]

    def renewal_reset(self, then: Any) -> bool:
        return False

    def renewal_sockets(self) -> List[Any]:
        return []

    def open_renewal(self) -> bool:
        return False

    def margin(self, ms: int) -> float:
        return 0.0


@pytest.fixture
def slow() -> _Slow:
    return _Slow()


@pytest.fixture
def wd(slow: _Slow) -> Iterator[Watchdog]:
    distlock.configure(lease=3.0, renew_interval=0.5)
    made = Watchdog(lambda: slow, "loop", lambda hold, cause: None)
    try:
        yield made
    finally:
        made.holds.clear()
        made.close(join=True)
        reset_settings()


def test_one_round_at_a_time_and_no_spin_while_it_runs(wd: Watchdog, slow: _Slow,
                                                       monkeypatch: Any) -> None:
    looks = [0]
    real = wd._expire_due

    def counted() -> None:
        looks[0] += 1
        real()

    monkeypatch.setattr(wd, "_expire_due", counted)
    hold = Hold(None, "k", "owner", token=1, count=1, watchdog=True, lease_ms=3000,
                sent_at=time.monotonic(), renew=lambda batch, hold, ms: None)
    wd.add(hold)
    time.sleep(RUN)
    rounds = slow.rounds
    # a round every ROUND + renew_interval at most (a round back to back with the last one
    # would make it every ROUND); a look every TICK (0.1 s) and at each round's end at most
    assert 1 <= rounds <= RUN / (ROUND + 0.5) + 1, rounds
    assert looks[0] <= RUN / 0.1 + 2 * rounds + 5, looks[0]
    assert not hold.lost


def test_work_due_after_the_threads_wait_ends_does_not_wake_it(wd: Watchdog, monkeypatch: Any) -> None:
    """A hold, or a task deferred to later, due no sooner than the thread's current wait ends
    is left for that wait's end: no kick (a thread woken on the caller's path, for nothing).
    Work due sooner kicks it, and a deferred task runs on time either way."""
    kicks = [0]
    real = wd._kick.set

    def counted() -> None:
        kicks[0] += 1
        real()

    monkeypatch.setattr(wd._kick, "set", counted)
    ran: List[float] = []
    wd.defer_at(time.monotonic(), lambda: ran.append(time.monotonic()))  # starts the thread
    deadline = time.monotonic() + 10
    while not (ran and wd._wake_at < float("inf")) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert ran and wd._wake_at < float("inf"), "the thread never went back to its wait"
    before = kicks[0]
    # due 5 ms from now, but anything within 2 s will do: the wait (at most 0.1 s) ends first
    asked = time.monotonic()
    wd.defer_at(asked + 0.005, lambda: ran.append(time.monotonic()), slack=2.0)
    hold = Hold(None, "k", "owner", token=1, count=1, watchdog=True, lease_ms=3000,
                sent_at=time.monotonic(), renew=lambda batch, hold, ms: None)
    wd.add(hold)  # its deadline, 3 s away, is not due before the wait ends
    assert kicks[0] == before
    while len(ran) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(ran) == 2 and ran[1] >= asked + 0.005
    # due at once, with no slack: the thread is woken for it
    wd.defer_at(time.monotonic(), lambda: ran.append(time.monotonic()))
    assert kicks[0] > before
    while len(ran) < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(ran) == 3


class _Opening(_Slow):
    """An executor whose watchdog connection takes a while to open, and which records when
    it is dropped: redis-py's handshake, closed under it by another thread, goes on with a
    new socket and waits its whole timeout for a reply sent on the old one."""

    def __init__(self) -> None:
        super().__init__()
        self.go = threading.Event()
        self.opening = threading.Event()
        self.dropped_while_opening = 0
        self.dropped = 0
        self.gone = False

    def open_renewal(self) -> bool:
        self.opening.set()
        try:
            return self.go.wait(10)
        finally:
            self.opening.clear()

    def drop_renewal(self) -> None:
        self.dropped += 1
        if self.opening.is_set():
            self.dropped_while_opening += 1


@contextlib.contextmanager
def _dropped_while_opening(tag: str) -> Iterator[Tuple[_Opening, Watchdog]]:
    """A watchdog whose one hold was dropped while the renewals worker opens its connection
    (the worker waits for ``opening.go``); closed and joined afterwards. Its executor source
    raises, as the session's does once the session is collected, after ``opening.gone``."""
    opening = _Opening()

    def source() -> _Opening:
        if opening.gone:
            raise RuntimeError("distlock: the session was retired")
        return opening

    wd = Watchdog(source, tag, lambda hold, cause: None)
    try:
        hold = Hold(None, "k", "owner", token=1, count=1, watchdog=True, lease_ms=3000,
                    sent_at=time.monotonic(), renew=lambda batch, hold, ms: None)
        wd.add(hold)
        assert opening.opening.wait(10), "the worker never began to open the connection"
        wd.drop(hold)
        yield opening, wd
    finally:
        opening.go.set()
        wd.close(join=True)


def test_the_watchdogs_connection_is_never_closed_while_it_is_being_opened() -> None:
    """The thread exits idle (the one hold was released at once) while the renewals worker
    is still opening the watchdog's connection: the worker closes it once it is open, the
    thread does not close it under it."""
    with _dropped_while_opening("opening") as (opening, wd):
        deadline = time.monotonic() + 10
        while wd.running and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not wd.running, "the watchdog thread did not exit idle"
        assert opening.dropped_while_opening == 0
        opening.go.set()
        wd.renewals.flush(10)
        assert opening.dropped == 1 and opening.dropped_while_opening == 0
        assert not wd._renewal_io


def test_a_retired_sessions_watchdog_leaves_a_connection_being_opened_to_its_opener() -> None:
    """The session is retired (``close(join=False)``, the reaper's) while the renewals worker
    is opening the watchdog's connection: nothing closes it under the handshake; the worker
    closes it once it is open."""
    with _dropped_while_opening("retired") as (opening, wd):
        wd.close(join=False)
        assert opening.dropped_while_opening == 0 and opening.dropped == 0
        opening.go.set()
        deadline = time.monotonic() + 10
        while opening.dropped == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        # closed once it is open; the exiting thread may close it again (nothing left then)
        assert opening.dropped >= 1 and opening.dropped_while_opening == 0


def test_a_collected_sessions_watchdog_connection_is_closed_by_its_opener() -> None:
    """As above, and the retired session is collected before the connection is open (its
    executor can no longer be asked for): the opener closes it through the executor it
    started with, rather than leave it to the collector."""
    with _dropped_while_opening("collected") as (opening, wd):
        wd.close(join=False)
        opening.gone = True
        opening.go.set()
        deadline = time.monotonic() + 10
        while opening.dropped == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert opening.dropped >= 1 and opening.dropped_while_opening == 0
