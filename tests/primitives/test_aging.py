"""Holds as they age: the cap (``max_hold``), ``on_long_hold``, and the live holds of
``distlock.metrics()`` (docs/guides/bound.rst).

At the cap the watchdog reports the hold lost (``on_lost``, cause "held longer than max_hold")
and gives it back, token-checked: Redis does not keep it for up to a lease more. The tests
wait for what Redis and the holder show, with generous bounds; they judge no timing.
"""

from __future__ import annotations

import logging
import math
import threading
import uuid
from typing import Any, Iterator, List

import pytest
from _aio import run_in_loop
from _support import until

import distlock
import distlock.asyncio as aio
from distlock import (
    DistBoundedSemaphore,
    DistCondition,
    DistLock,
    DistReadWriteLock,
    DistRLock,
    DistSemaphore,
    LockLostError,
)
from distlock._session import metrics as _metrics

pytestmark = pytest.mark.real_redis


@pytest.fixture(autouse=True)
def fresh_metrics() -> Iterator[None]:
    """Groups are counted per process, at most 100: earlier tests' names must not crowd
    these tests' groups into ``other``."""
    _metrics.reset()
    yield
    _metrics.reset()

#: short enough to pass during a test; the tests do not count on the holder seeing its hold
#: before the cap (a loaded machine may take longer than that to return from acquire)
CAP = 0.4
BOUND = 15.0


def _name() -> str:
    return f"age:{uuid.uuid4().hex[:10]}"


def _lost_causes(caplog: pytest.LogCaptureFixture) -> List[str]:
    return [getattr(r, "cause", "") for r in caplog.records if hasattr(r, "cause")]


@pytest.mark.parametrize("cls", [DistLock, DistRLock])
def test_at_the_cap_the_hold_is_lost_and_given_back(
        client: Any, cls: Any, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="distlock")
    name = _name()
    lock = cls(name, client=client, max_hold=CAP)
    fired = threading.Event()
    lock.on_lost(lambda _: fired.set())
    assert lock.max_hold == CAP
    assert lock.acquire()
    if cls is DistRLock:
        try:
            lock.acquire()  # a re-entered hold is given back whole
        except LockLostError:
            pass  # the cap came first (a loaded machine): refused, as it should be
    assert lock.valid_for() <= CAP
    assert fired.wait(BOUND), "on_lost did not fire at the cap"
    assert not lock.owned() and lock.valid_for() == 0.0 and lock.token is None
    until(lambda: not client.exists(f"distlock:{{{name}}}"), BOUND, "the capped hold given back")
    assert any(c.startswith("held longer than max_hold") for c in _lost_causes(caplog))
    other = DistLock(name, client=client)
    assert other.acquire(blocking=False)  # free at once, not after a lease
    other.release()
    with pytest.raises(LockLostError):
        lock.release()
    if cls is DistRLock:
        with pytest.raises(RuntimeError):
            lock.release()  # the whole hold is gone: nothing is left to release


def test_a_release_before_the_cap_changes_nothing(client: Any) -> None:
    name = _name()
    lock = DistLock(name, client=client, max_hold=30.0)
    fired: List[Any] = []
    lock.on_lost(fired.append)
    with lock:
        assert lock.owned()
    assert not client.exists(f"distlock:{{{name}}}")
    assert not fired


def test_a_release_just_past_the_cap_raises_and_gives_back(client: Any, monkeypatch: Any) -> None:
    """The releasing thread may see the cap pass before the watchdog thread: its release
    reports the loss and gives back what Redis still has, token-checked."""
    name = _name()
    lock = DistLock(name, client=client, max_hold=CAP)
    assert lock.acquire()
    hold = lock._hold
    assert hold is not None
    hold.cap_at = 0.0  # as if the cap passed before the watchdog thread looked
    with pytest.raises(LockLostError):
        lock.release()
    assert not client.exists(f"distlock:{{{name}}}")


def test_the_cap_applies_to_a_fixed_lease_and_to_a_hand_off(client: Any) -> None:
    name = _name()
    lock = DistLock(name, client=client, lease=30.0, max_hold=CAP)
    assert lock.acquire()
    until(lambda: not lock.owned(), BOUND, "a fixed lease capped")
    until(lambda: not client.exists(f"distlock:{{{name}}}"), BOUND, "given back")
    with pytest.raises(LockLostError):
        lock.release()
    # a waiter's grant (a hand-off) is capped as a first try's is
    holder, waiter = DistLock(name, client=client), DistLock(name, client=client, max_hold=CAP)
    holder.acquire()
    got = threading.Event()
    thread = threading.Thread(target=lambda: (waiter.acquire(), got.set()))
    thread.start()
    until(lambda: client.exists(f"distlock:{{{name}}}:q"), BOUND, "the waiter registered")
    holder.release()
    assert got.wait(BOUND)
    thread.join(BOUND)
    until(lambda: not waiter.owned(), BOUND, "the handed hold capped")
    with pytest.raises(LockLostError):
        waiter.release()


@pytest.mark.parametrize("side", ["read", "write"])
def test_both_sides_of_a_read_write_lock_are_capped(client: Any, side: str) -> None:
    name = _name()
    rw = DistReadWriteLock(name, client=client, max_hold=CAP)
    lock = rw.read_lock() if side == "read" else rw.write_lock()
    assert lock.max_hold == CAP
    assert lock.acquire()
    until(lambda: not lock.owned(), BOUND, f"the {side} hold capped")
    writer = DistReadWriteLock(name, client=client).write_lock()

    def free() -> bool:  # another thread: this one still holds the lost hold until it releases
        got: List[bool] = []

        def take() -> None:
            got.append(writer.acquire(blocking=False))
            if got[0]:
                writer.release()

        thread = threading.Thread(target=take)
        thread.start()
        thread.join(BOUND)
        return bool(got and got[0])

    until(free, BOUND, "the name free again before the holder's release")
    with pytest.raises(LockLostError):
        lock.release()


@pytest.mark.parametrize("cls", [DistSemaphore, DistBoundedSemaphore])
def test_a_capped_permit_is_given_back(client: Any, cls: Any) -> None:
    name = _name()
    sem = cls(name, 1, client=client, max_hold=CAP)
    fired = threading.Event()
    sem.on_lost(lambda _: fired.set())
    assert sem.acquire()
    assert fired.wait(BOUND)
    assert sem.valid_for() == 0.0
    other = cls(name, 1, client=client)
    until(lambda: other.acquire(blocking=False), BOUND, "the permit free again")
    with pytest.raises(LockLostError):
        sem.release()  # this thread's oldest permit first: the capped one, reported
    other.release()
    assert not client.exists(f"distlock:{{{name}}}:sem")


def test_a_condition_caps_the_lock_it_makes(client: Any) -> None:
    cond = DistCondition(_name(), client=client, max_hold=CAP)
    assert cond._lock.max_hold == CAP
    with pytest.raises(TypeError, match="max_hold is the lock's"):
        DistCondition(_name(), DistRLock(_name(), client=client), client=client, max_hold=1.0)


def test_configure_sets_the_default_and_inf_opts_out(client: Any) -> None:
    assert distlock.configure().max_hold == math.inf  # without the cap, nothing changes
    lock = DistLock(_name(), client=client)
    with lock:
        assert lock._hold is not None and lock._hold.cap_at == math.inf
    distlock.configure(max_hold=CAP)
    capped, free = DistLock(_name(), client=client), DistLock(_name(), client=client, max_hold=math.inf)
    assert capped.max_hold == CAP and free.max_hold == math.inf
    capped.acquire()
    free.acquire()
    until(lambda: not capped.owned(), BOUND, "the configured cap")
    assert free.owned()
    free.release()
    with pytest.raises(LockLostError):
        capped.release()


@pytest.mark.parametrize("bad, error", [(0, ValueError), (-1, ValueError), (math.nan, ValueError),
                                        (-math.inf, ValueError), ("1", TypeError), (True, TypeError),
                                        (1e300, OverflowError)])
def test_bad_max_hold(bad: Any, error: type) -> None:
    for make in (lambda: DistLock("x", max_hold=bad), lambda: DistRLock("x", max_hold=bad),
                 lambda: DistReadWriteLock("x", max_hold=bad), lambda: DistSemaphore("x", max_hold=bad),
                 lambda: DistCondition("x", max_hold=bad), lambda: aio.DistLock("x", max_hold=bad),
                 lambda: distlock.configure(max_hold=bad)):
        with pytest.raises(error, match="max_hold"):
            make()
    assert distlock.configure().max_hold == math.inf  # a refused configure changed nothing


# --- on_long_hold -----------------------------------------------------------------------------

def test_on_long_hold_fires_once_per_hold_on_the_watchdog_thread(client: Any) -> None:
    lock = DistRLock(_name(), client=client)
    seen: List[Any] = []
    threads: List[str] = []
    lock.on_long_hold(0.2, lambda subject: (seen.append(subject), threads.append(
        threading.current_thread().name)))
    with lock:
        with lock:  # a re-entry is the same hold: one alarm
            until(lambda: seen, BOUND, "the long-hold alarm")
    assert seen == [lock]
    assert threads[0].startswith("distlock-watchdog")
    with lock:  # a new hold, a new alarm
        until(lambda: len(seen) == 2, BOUND, "the second hold's alarm")
    assert lock.owned() is False and len(seen) == 2


def test_on_long_hold_never_fires_for_a_hold_released_before(client: Any) -> None:
    lock = DistLock(_name(), client=client)
    seen: List[Any] = []
    lock.on_long_hold(0.5, seen.append)
    for _ in range(3):
        with lock:
            pass
    keeper = DistLock(_name(), client=client)  # a hold of another name keeps the thread busy
    fired = threading.Event()
    keeper.on_long_hold(1.0, lambda _: fired.set())
    with keeper:
        assert fired.wait(BOUND)
    assert seen == []


def test_a_failing_long_hold_callback_is_logged_and_the_watchdog_goes_on(
        client: Any, caplog: pytest.LogCaptureFixture) -> None:
    sem = DistSemaphore(_name(), 2, client=client)
    fired = threading.Event()

    def boom(_: Any) -> None:
        raise RuntimeError("boom")

    sem.on_long_hold(0.1, boom)
    sem.on_long_hold(0.2, lambda _: fired.set())
    with sem:
        assert fired.wait(BOUND)
    assert any("on_long_hold callback failed" in r.getMessage() for r in caplog.records)


def test_on_long_hold_bad_arguments() -> None:
    lock = DistLock("x")
    with pytest.raises(TypeError, match="callable"):
        lock.on_long_hold(1.0, "nope")  # type: ignore[arg-type]
    for bad, error in ((0, ValueError), (math.inf, ValueError), ("1", TypeError)):
        with pytest.raises(error, match="seconds"):
            lock.on_long_hold(bad, print)  # type: ignore[arg-type]


# --- metrics ------------------------------------------------------------------------------------

def test_metrics_list_the_live_holds_oldest_first(client: Any) -> None:
    first, second = DistLock(f"orders:{uuid.uuid4().hex[:6]}", client=client), \
        DistSemaphore(f"jobs:{uuid.uuid4().hex[:6]}", 2, client=client)
    reader = DistReadWriteLock(f"cache:{uuid.uuid4().hex[:6]}", client=client).read_lock()
    with first:
        until(lambda: distlock.metrics()["holds"] and distlock.metrics()["holds"][0]["age"] > 0.05,
              BOUND, "an age")
        with second, reader:
            holds = distlock.metrics()["holds"]
            assert [h["kind"] for h in holds] == ["lock", "semaphore", "read"] or \
                [h["kind"] for h in holds][0] == "lock"
            row = holds[0]
            assert row["group"] == "orders" and row["name"] == first.name
            assert row["token"] == first.token and row["believed"] is True and row["age"] > 0
            assert {h["kind"] for h in holds} == {"lock", "semaphore", "read"}
            assert all(a["age"] >= b["age"] for a, b in zip(holds, holds[1:]))
    assert distlock.metrics()["holds"] == []


def test_prometheus_gauge_of_the_oldest_hold(client: Any) -> None:
    prometheus_client = pytest.importorskip("prometheus_client")
    from distlock.prometheus import DistlockCollector

    registry = prometheus_client.CollectorRegistry()
    registry.register(DistlockCollector())
    with DistLock(f"orders:{uuid.uuid4().hex[:6]}", client=client):
        text = prometheus_client.generate_latest(registry).decode()
        assert 'distlock_oldest_hold_seconds{group="orders",kind="lock"}' in text
    text = prometheus_client.generate_latest(registry).decode()
    assert 'distlock_oldest_hold_seconds{group="orders"' not in text


# --- asyncio --------------------------------------------------------------------------------------

def test_asyncio_holds_are_capped_and_age(url: str, client: Any) -> None:
    name = _name()

    async def body(ac: Any) -> None:
        import asyncio
        lock = aio.DistLock(name, client=ac, max_hold=CAP)
        seen: List[Any] = []
        me = threading.current_thread()
        lock.on_long_hold(0.1, lambda s: seen.append((s, threading.current_thread() is me)))

        async def coroutine(s: Any) -> None:
            seen.append(("task", s))

        lock.on_long_hold(0.15, coroutine)
        assert await lock.acquire()
        for _ in range(int(BOUND / 0.02)):
            if not lock.owned() and len(seen) == 2:
                break
            await asyncio.sleep(0.02)
        # in the loop, as on_lost callbacks run: not in the watchdog thread
        assert not lock.owned() and seen == [(lock, True), ("task", lock)]
        with pytest.raises(LockLostError):
            await lock.release()
    run_in_loop(url, body, BOUND + 5)
    until(lambda: not client.exists(f"distlock:{{{name}}}"), BOUND, "given back")
