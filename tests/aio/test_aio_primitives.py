"""distlock.asyncio's DistSemaphore, DistBoundedSemaphore, DistEvent, DistCondition,
DistBarrier and DistReadWriteLock: asyncio's semantics where asyncio differs from threading,
awaitables that are not truth values, state changes that act un-awaited, cancellation,
sync and async primitives of one name, clients, argument checks equal to the blocking classes'.

threading's contract of the semaphores and the event also runs here, through a blocking view
(tests/support/_aio.py: each test thread is one task). Each async test runs its coroutine with
``asyncio.run`` on a loop of its own; timing is asserted only as loose upper bounds.
"""

from __future__ import annotations

import asyncio
import math
import re
import sys
import threading
import time
import uuid
from functools import partial
from typing import Any, Awaitable, Callable, Dict, List, Optional, Tuple

import _event_contract as _event_suite
import _sem_contract as _sem_suite
import pytest
import redis
import redis.asyncio as aredis
from _aio import SyncView, keys, run_in_loop
from _support import outcome, url_for

import distlock
import distlock.asyncio as aio
from distlock import LockNotOwnedError
from distlock._core.keys import RWKeys

pytestmark = pytest.mark.real_redis

BOUND = 20.0

#: what a broken barrier raises: asyncio's own where there is one (Python 3.11+)
BROKEN = getattr(asyncio, "BrokenBarrierError", threading.BrokenBarrierError)


def _name(prefix: str = "aiop") -> str:
    return f"{prefix}:{uuid.uuid4().hex[:10]}"


def run(url: str, body: Callable[[Any], Awaitable[Any]], bound: float = BOUND) -> Any:
    return run_in_loop(url, body, bound, f"aiop-{uuid.uuid4().hex[:6]}")


async def until(check: Callable[[], Awaitable[Any]], bound: float = BOUND,
                negate: bool = False) -> None:
    """Await ``check()`` until it is true (false, with ``negate``); fail after ``bound`` s."""
    deadline = time.monotonic() + bound
    while bool(await check()) is negate:
        assert time.monotonic() < deadline, "not reached within the bound"
        await asyncio.sleep(0.01)


async def outcome_of(awaitable: Awaitable[Any]) -> Tuple[str, Any]:
    """('ok', value) or (exception type name, message), as _support.outcome."""
    try:
        return "ok", await awaitable
    except Exception as exc:  # noqa: BLE001
        return type(exc).__name__, str(exc)


def in_thread(fn: Callable[[], Any]) -> threading.Thread:
    thread = threading.Thread(target=fn, daemon=True)
    thread.start()
    return thread


async def joined(thread: threading.Thread) -> None:
    await asyncio.get_running_loop().run_in_executor(None, thread.join, BOUND)
    assert not thread.is_alive()


async def _async(value: Any) -> Any:
    return value


def _same_signature_errors(scls: Any, acls: Any, too_many: Tuple[Any, ...],
                           unknown: Dict[str, Any]) -> None:
    """Arguments the signature refuses (the options are keyword-only): TypeError from both
    classes (Python's wording names the function, so only the type is compared)."""
    for args, kwargs in ((too_many, {}), (too_many[:1], unknown)):
        with pytest.raises(TypeError):
            scls(*args, **kwargs)
        with pytest.raises(TypeError):
            acls(*args, **kwargs)


def _short_lifetimes() -> None:
    """Leases and waiter entries that run out within seconds: what a wait cut short anywhere
    leaves behind for a while (see test_cancelled_when_a_reply_is_cut_off) is gone soon."""
    distlock.configure(lease=1.0, renew_interval=0.3, wait_cap=0.2)


def _until_sync(check: Callable[[], Any], bound: float = BOUND) -> None:
    deadline = time.monotonic() + bound
    while not check():
        assert time.monotonic() < deadline, "not reached within the bound"
        time.sleep(0.05)


def _entry_ms() -> int:
    from distlock._core.deadlines import entry_ms
    cfg = distlock._core.settings.settings()
    return entry_ms(cfg.wait_cap, cfg.queue_cap_factor)


def asleep(task: asyncio.Future[Any]) -> bool:
    """Whether ``task`` sleeps between two looks of a wait (in the pub/sub dispatcher's
    ``sleep``), rather than waiting for a reply: a cancellation there cuts no reply off (that
    case is test_cancelled_when_a_reply_is_cut_off's)."""
    link: Any = task.get_coro()  # type: ignore[attr-defined]
    while link is not None:
        code = getattr(link, "cr_code", None) or getattr(link, "gi_code", None)
        if code is not None and code.co_name == "sleep" and code.co_filename.endswith("_redis/apubsub.py"):
            return True
        if code is not None and code.co_name == "_whole" and link.cr_frame is not None:
            # Python < 3.11: the op runs in a task of its own, awaited through a shield
            inner = link.cr_frame.f_locals.get("inner")
            link = inner.get_coro() if inner is not None and not inner.done() else None
            continue
        link = getattr(link, "cr_await", None) or getattr(link, "gi_yieldfrom", None)
    return False


async def waiting(task: asyncio.Future[Any], seen: Callable[[], Any]) -> None:
    """Until ``seen()`` (the task's wait shows in Redis) and the task sleeps."""
    await until(lambda: _async(bool(seen()) and asleep(task)))


# --- threading's contract, through a blocking view ----------------------------------------------

def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "type_id" in metafunc.fixturenames and metafunc.cls is not None:
        metafunc.parametrize("type_id", getattr(metafunc.cls, "semtypes", None)
                             or metafunc.cls.eventtypes)


class TestAioSemaphoreContract(_sem_suite.SemaphoreContract):
    """The semaphores' threading contract, where asyncio's semantics agree (each test thread is
    one task)."""

    semtypes = ("aio.DistSemaphore", "aio.DistBoundedSemaphore", "aio.DistSemaphore@cluster",
                "aio.DistBoundedSemaphore@cluster", "aio.DistSemaphore@sentinel")

    @pytest.fixture
    def semtype(self, type_id: str, request: pytest.FixtureRequest) -> _sem_suite.SemType:
        runner = request.getfixturevalue("aio")
        aclient = runner.client(url_for(type_id, request))
        bounded = "Bounded" in type_id
        cls = aio.DistBoundedSemaphore if bounded else aio.DistSemaphore
        twin = threading.BoundedSemaphore if bounded else threading.Semaphore

        def make(value: Any) -> Any:
            return SyncView(cls(_name("aio-sem"), value, client=aclient), runner)

        def make_default() -> Any:
            return SyncView(cls(_name("aio-sem"), client=aclient), runner)

        return _sem_suite.SemType(type_id, bounded, True, make, twin, make_default)

    def test_repr(self, semtype: _sem_suite.SemType) -> None:
        sem = semtype(3)
        shown = "3/3" if semtype.bounded else "3"
        assert re.match(rf"^<distlock\.(asyncio\.)?Dist(Bounded)?Semaphore at 0x[0-9a-f]+: "
                        rf"value={shown}\b", repr(sem)), repr(sem)
        sem.acquire()
        assert f"value={'2/3' if semtype.bounded else '2'}" in repr(sem)
        sem.release()

    def test_with(self, semtype: _sem_suite.SemType) -> None:
        """asyncio's ``async with sem`` gives None, where threading's ``with`` gives True."""
        sem = semtype(1)
        with sem as got:
            assert sem.acquire(False) is False
        assert got is None
        assert _sem_suite.drain(sem) == 1
        sem.release()


class TestAioEventContract(_event_suite.EventContract):
    """The event's threading contract, where asyncio's semantics agree."""

    eventtypes = ("aio.DistEvent", "aio.DistEvent@cluster", "aio.DistEvent@sentinel")

    @pytest.fixture
    def make(self, type_id: str, request: pytest.FixtureRequest) -> Callable[[], Any]:
        runner = request.getfixturevalue("aio")
        aclient = runner.client(url_for(type_id, request))
        return lambda: SyncView(aio.DistEvent(_name("aio-ev"), client=aclient), runner)

    def test_repr(self, make: Callable[[], Any]) -> None:
        event = make()
        assert re.match(r"^<distlock\.(asyncio\.)?DistEvent at 0x[0-9a-f]+: unset\b",
                        repr(event)), repr(event)
        event.set()
        assert ": set" in repr(event)
        event.clear()
        assert ": unset" in repr(event)


# --- helpers for cancellation ---------------------------------------------------------------------

async def settle(task: asyncio.Future[Any], poke: Optional[Callable[[], Awaitable[Any]]] = None,
                 bound: float = BOUND) -> Tuple[str, Any]:
    """How a task that was cancelled ended: ('cancelled', None), ('ok', value) or ('error', exc).

    ``poke()`` is awaited each half second the task still runs: it ends a wait whose
    cancellation did not take (see ``test_cancellation_is_never_swallowed``), or one that is
    slow to notice it; it must do no harm when the task is gone already."""
    deadline = time.monotonic() + bound
    while True:
        done, _ = await asyncio.wait({task}, timeout=0.5)
        if done:
            break
        assert time.monotonic() < deadline, "the cancelled task did not end"
        if poke is not None:
            await poke()
    if task.cancelled():
        return "cancelled", None
    exc = task.exception()
    return ("ok", task.result()) if exc is None else ("error", exc)


async def cancel_later(task: asyncio.Future[Any], steps: int = 0, delay: float = 0.0) -> None:
    if delay:
        await asyncio.sleep(delay)
    for _ in range(steps):
        await asyncio.sleep(0)
    task.cancel()


def once(release: Callable[[], Awaitable[Any]]) -> Callable[[], Awaitable[None]]:
    """A ``poke`` for ``settle`` that calls ``release()`` the first time only (and so may
    also be called after it, to make sure the release happened)."""
    done: List[bool] = []

    async def poke() -> None:
        if not done:
            done.append(True)
            await release()
    return poke


#: where a wait is cancelled in the "every step" tests: loop steps, then a few short delays
#: that land in a script's round trip or in the subscription
STEPS = [(steps, 0.0) for steps in range(10)] + [(0, delay) for delay in (0.001, 0.004, 0.02)]

#: after the waiter is visibly waiting in Redis: at once, and while it sleeps
QUEUED_DELAYS = [0.0, 0.05, 0.3]


# --- semaphores -----------------------------------------------------------------------------------

def test_semaphore_asyncio_surface(url: str, client: redis.Redis) -> None:
    name = _name()

    async def body(ac: Any) -> None:
        sem = aio.DistSemaphore(name, 2, client=ac)
        assert await sem.acquire() is True  # asyncio.Semaphore.acquire() returns True
        async with sem as got:  # asyncio's __aenter__ gives None
            assert got is None
            assert await sem.acquire(blocking=False) is False
        pending = sem.release()
        with pytest.raises(TypeError, match="await"):
            bool(pending)
        assert await pending is None
        assert keys(client, name) == []  # at rest: nothing in Redis
        with pytest.raises(TypeError, match="async with"):
            with sem:
                pass
        assert not hasattr(sem, "locked")  # documented: a semaphore has no locked()
    run(url, body)


def test_semaphore_release_without_await_still_releases(url: str, client: redis.Redis) -> None:
    name = _name()

    async def body(ac: Any) -> None:
        sem = aio.DistSemaphore(name, 1, client=ac)
        await sem.acquire()
        waiter = asyncio.ensure_future(aio.DistSemaphore(name, 1, client=ac).acquire(timeout=BOUND))
        await until(lambda: _async(client.exists(sem._keys.queue)))
        sem.release()  # as asyncio users write it
        assert await waiter is True
        other = aio.DistSemaphore(name, 1, client=ac)
        assert await other.acquire(blocking=False) is False  # the waiter holds it now
        await other.release()
    run(url, body)
    assert keys(client, name) == []


def test_bounded_semaphore_over_release(url: str, client: redis.Redis) -> None:
    """Too many releases is for Redis to decide (the count is shared): ValueError where the
    awaitable is awaited, the count unchanged. What the call can see itself raises at once."""
    name = _name()

    async def body(ac: Any) -> None:
        sem = aio.DistBoundedSemaphore(name, 2, client=ac)
        pending = sem.release()  # no error yet: not a local misuse
        with pytest.raises(ValueError, match="^Semaphore released too many times$"):
            await pending
        await sem.acquire()
        with pytest.raises(ValueError, match="^Semaphore released too many times$"):
            await sem.release(2)  # would take it to 3: nothing changes
        assert await sem.acquire(blocking=False) is True  # still one free
        assert await sem.acquire(blocking=False) is False
        with pytest.raises(ValueError, match="n must be one or more"):
            sem.release(0)  # checked in the call, not awaited
        with pytest.raises(TypeError):
            sem.release(1.5)
        await sem.release(2)
        # a DistSemaphore of the name shares the count; only the check on release differs
        plain = aio.DistSemaphore(name, 2, client=ac)
        assert await plain.acquire(blocking=False) and await plain.acquire(blocking=False)
        assert await sem.acquire(blocking=False) is False
        await sem.release(2)
    run(url, body)
    assert keys(client, name) == []


def test_semaphore_never_admits_more_than_its_value(url: str, client: redis.Redis) -> None:
    name = _name()

    async def body(ac: Any) -> Dict[str, int]:
        box = {"inside": 0, "high": 0, "done": 0}

        async def worker() -> None:
            sem = aio.DistSemaphore(name, 3, client=ac)
            for _ in range(4):
                async with sem:
                    box["inside"] += 1
                    box["high"] = max(box["high"], box["inside"])
                    await asyncio.sleep(0.005)
                    box["inside"] -= 1
                    box["done"] += 1
        await asyncio.gather(*(worker() for _ in range(10)))
        return box

    box = run(url, body, bound=BOUND * 3)
    assert box["done"] == 40 and box["inside"] == 0
    assert 1 <= box["high"] <= 3
    assert keys(client, name) == []


def test_semaphore_release_gives_back_the_calling_tasks_permit(url: str, client: redis.Redis) -> None:
    name = _name()

    def permits() -> set:
        return {m for m, _ in client.zrangebyscore(f"distlock:{{{name}}}:sem", 0, "+inf",
                                                   withscores=True)}

    async def body(ac: Any) -> None:
        sem = aio.DistSemaphore(name, 2, client=ac)
        await sem.acquire()
        mine = permits()
        theirs: set = set()
        go, done = asyncio.Event(), asyncio.Event()

        async def other() -> None:
            await sem.acquire()
            theirs.update(permits() - mine)
            go.set()
            await done.wait()
            await sem.release()
        task = asyncio.ensure_future(other())
        await go.wait()
        await sem.release()  # this task's permit goes back, the other task's stays
        assert permits() == theirs and len(theirs) == 1
        done.set()
        await task
    run(url, body)
    assert keys(client, name) == []


@pytest.mark.parametrize("cls", ["DistSemaphore", "DistBoundedSemaphore"])
def test_semaphore_bad_arguments_as_the_blocking_class(url: str, client: redis.Redis, cls: str) -> None:
    acls, scls = getattr(aio, cls), getattr(distlock, cls)
    constructor_cases: List[Tuple[Tuple[Any, ...], Dict[str, Any]]] = [
        ((1,), {}), (("",), {}), (("x", -1), {}), (("x", 2.5), {}), (("x", "3"), {}),
        (("x", None), {}), (("x", 2 ** 53), {}), (("x",), {"lease": 0}), (("x",), {"lease": "1"}),
    ]
    for args, kwargs in constructor_cases:
        expected = outcome(partial(scls, *args, **kwargs))
        assert expected[0] != "ok", (args, kwargs)
        assert outcome(partial(acls, *args, **kwargs)) == expected, (args, kwargs)
    _same_signature_errors(scls, acls, ("x", 1, None, None), {"bogus": 1})
    assert acls("x", True).name == "x"  # threading takes a bool, so does the blocking class

    async def body(ac: Any) -> None:
        sync_sem, async_sem = scls(_name(), 0, client=client), acls(_name(), 0, client=ac)
        for args, kwargs in [((False, 1), {}), ((), {"timeout": "1"}), ((), {"timeout": math.nan}),
                             ((), {"timeout": math.inf}), ((), {"timeout": 1j})]:
            expected = outcome(partial(sync_sem.acquire, *args, **kwargs))
            assert expected[0] != "ok", (args, kwargs)
            assert await outcome_of(async_sem.acquire(*args, **kwargs)) == expected, (args, kwargs)
        for n in [0, -1, "2", None, 2 ** 53]:
            expected = outcome(partial(sync_sem.release, n))
            assert expected[0] != "ok", n
            assert outcome(partial(async_sem.release, n)) == expected, n  # at once, in the call
    run(url, body)


def test_semaphore_sync_and_async_are_one_semaphore(url: str, client: redis.Redis) -> None:
    name = _name()
    sync_sem = distlock.DistBoundedSemaphore(name, 1, client=client)
    assert sync_sem.acquire()
    order: List[str] = []

    def release_later() -> None:
        time.sleep(0.2)
        order.append("thread releases")
        sync_sem.release()

    async def body(ac: Any) -> None:
        sem = aio.DistSemaphore(name, 1, client=ac)
        assert await sem.acquire(blocking=False) is False  # the thread's permit counts here
        thread = in_thread(release_later)
        assert await sem.acquire(timeout=BOUND) is True  # woken by the thread's release
        order.append("task acquired")
        await joined(thread)
        # the other way round: a thread waits for the task's permit
        got: List[bool] = []
        waiter = in_thread(lambda: got.append(sync_sem.acquire(timeout=BOUND)))
        await until(lambda: _async(client.exists(sem._keys.queue)))
        assert got == []
        await sem.release()
        await joined(waiter)
        assert got == [True]
        sync_sem.release()  # the thread's permit: the count is back at its value
        with pytest.raises(ValueError, match="too many"):  # one count, bounded by either
            await aio.DistBoundedSemaphore(name, 1, client=ac).release()
    run(url, body)
    assert order == ["thread releases", "task acquired"]
    assert keys(client, name) == []


@pytest.mark.parametrize("delay", QUEUED_DELAYS)
def test_semaphore_cancelled_while_waiting(url: str, client: redis.Redis, delay: float) -> None:
    """Cancelled once it waits in the queue: the cancellation propagates, no permit is taken;
    its queue entry is left to run out by itself (documented: a try to take it out could take a
    permit), and nothing else is left."""
    name = _name()

    async def body(ac: Any) -> None:
        holder = aio.DistSemaphore(name, 1, client=ac)
        await holder.acquire()
        waiter = aio.DistSemaphore(name, 1, client=ac)
        task = asyncio.ensure_future(waiter.acquire())
        await waiting(task, lambda: client.zcard(waiter._keys.queue) == 1)
        await cancel_later(task, delay=delay)
        with pytest.raises(asyncio.CancelledError):
            await task
        await holder.release()
        assert set(keys(client, name)) <= {waiter._keys.queue}  # no permit, no count
        assert client.pttl(waiter._keys.queue) <= _entry_ms()  # -2: gone already
        assert await waiter.acquire(blocking=False) is True  # the permit is free
        await waiter.release()
    run(url, body)


def test_semaphore_cancelled_at_every_step(url: str, client: redis.Redis) -> None:
    """Cancel a waiting acquire after each number of loop steps (in the first try, in the
    subscription, in a try of the wait, asleep): it takes no permit, and once its queue entry
    has run out (short here) nothing is left."""
    _short_lifetimes()
    name = _name()

    async def body(ac: Any) -> List[str]:
        seen = []
        for steps, delay in STEPS:
            holder = aio.DistSemaphore(name, 1, client=ac)
            await holder.acquire()
            waiter = aio.DistSemaphore(name, 1, client=ac)
            task = asyncio.ensure_future(waiter.acquire())
            await cancel_later(task, steps, delay)
            poke = once(holder.release)  # a cancellation that did not take: let it finish
            kind, value = await settle(task, poke)
            seen.append(kind)
            assert kind == "cancelled" or (kind, value) == ("ok", True), (steps, delay, value)
            await poke()
            if kind == "ok":
                await waiter.release()
            assert await waiter.acquire(blocking=False) is True, (steps, delay)
            await waiter.release()
        return seen

    seen = run(url, body, bound=BOUND * 3)
    assert "cancelled" in seen
    _until_sync(lambda: keys(client, name) == [])


def test_semaphore_cancelled_release_still_completes(url: str, client: redis.Redis) -> None:
    name = _name()

    async def body(ac: Any) -> None:
        for steps in range(6):
            sem = aio.DistSemaphore(name, 1, client=ac)
            await sem.acquire()

            async def release(sem: Any = sem) -> None:
                await sem.release()
            task = asyncio.ensure_future(release())
            await cancel_later(task, steps + 1)  # the first step calls release()
            await settle(task)
            await until(lambda: _async(keys(client, name) == []))
    run(url, body)


# --- event ------------------------------------------------------------------------------------------

def test_event_asyncio_surface(url: str, client: redis.Redis) -> None:
    name = _name()

    async def body(ac: Any) -> None:
        event = aio.DistEvent(name, client=ac)
        query = event.is_set()
        with pytest.raises(TypeError, match="await"):
            if query:
                pass
        assert await query is False
        assert await event.wait(0.05) is False  # the blocking class' timeout: False
        change = event.set()
        with pytest.raises(TypeError, match="await"):
            bool(change)
        assert await change is None
        assert await event.is_set() is True  # awaited: set in Redis
        assert await event.wait() is True  # asyncio.Event.wait() returns True
        assert keys(client, name) == [event._keys.flag]
        assert await event.clear() is None
        assert await event.is_set() is False
        assert keys(client, name) == []
    run(url, body)


def test_event_set_and_clear_without_await_still_act(url: str, client: redis.Redis) -> None:
    name = _name()

    async def body(ac: Any) -> None:
        event = aio.DistEvent(name, client=ac)
        waiters = [asyncio.ensure_future(aio.DistEvent(name, client=ac).wait(BOUND))
                   for _ in range(3)]
        await until(lambda: _async(client.zcard(event._keys.waiters) == 3))
        event.set()  # as asyncio users write it
        assert await asyncio.gather(*waiters) == [True] * 3
        await until(event.is_set)
        event.clear()
        await until(event.is_set, negate=True)
    run(url, body)
    assert keys(client, name) == []


def test_event_set_then_clear_wakes_every_waiting_task(url: str, client: redis.Redis) -> None:
    """asyncio: a waiter woken by set() returns True even if clear() came before it ran."""
    name = _name()

    async def body(ac: Any) -> None:
        event = aio.DistEvent(name, client=ac)
        waiters = [asyncio.ensure_future(event.wait()) for _ in range(5)]
        await until(lambda: _async(client.zcard(event._keys.waiters) == 5))
        await event.set()
        await event.clear()
        assert await asyncio.gather(*waiters) == [True] * 5
        assert await event.is_set() is False
        assert await event.wait(0.05) is False
    run(url, body)
    _until_sync(lambda: keys(client, name) == [])  # woken waiters' entries go in the background


def test_event_bad_arguments_as_the_blocking_class(url: str, client: redis.Redis) -> None:
    for args, kwargs in [((1,), {}), (("",), {})]:
        expected = outcome(partial(distlock.DistEvent, *args, **kwargs))
        assert expected[0] != "ok", (args, kwargs)
        assert outcome(partial(aio.DistEvent, *args, **kwargs)) == expected, (args, kwargs)
    with pytest.raises(TypeError):
        distlock.DistEvent("x", client)
    with pytest.raises(TypeError):
        aio.DistEvent("x", client)  # client is keyword-only

    async def body(ac: Any) -> None:
        sync_event = distlock.DistEvent(_name(), client=client)
        async_event = aio.DistEvent(_name(), client=ac)
        for timeout in ["1", 1j, [1], math.inf, 1e100, threading.TIMEOUT_MAX * 2]:
            expected = outcome(partial(sync_event.wait, timeout))
            assert expected[0] != "ok", timeout
            assert await outcome_of(async_event.wait(timeout)) == expected, timeout
        for timeout in [0, -1, math.nan]:  # threading: no wait at all
            assert await async_event.wait(timeout) is False
    run(url, body)


def test_event_sync_and_async_wake_each_other(url: str, client: redis.Redis) -> None:
    name = _name()
    sync_event = distlock.DistEvent(name, client=client)

    async def body(ac: Any) -> None:
        event = aio.DistEvent(name, client=ac)
        # a thread waits, a task sets
        got: List[bool] = []
        thread = in_thread(lambda: got.append(sync_event.wait(BOUND)))
        await until(lambda: _async(client.zcard(event._keys.waiters) == 1))
        await event.set()
        await joined(thread)
        assert got == [True]
        assert sync_event.is_set() is True
        sync_event.clear()
        assert await event.is_set() is False
        # a task waits, a thread sets
        task = asyncio.ensure_future(event.wait(BOUND))
        await until(lambda: _async(client.zcard(event._keys.waiters) == 1))
        setter = in_thread(sync_event.set)
        assert await task is True
        await joined(setter)
        await event.clear()
    run(url, body)
    _until_sync(lambda: keys(client, name) == [])


@pytest.mark.parametrize("delay", QUEUED_DELAYS)
def test_event_cancelled_while_waiting(url: str, client: redis.Redis, delay: float) -> None:
    name = _name()

    async def body(ac: Any) -> None:
        event = aio.DistEvent(name, client=ac)
        task = asyncio.ensure_future(event.wait())
        await waiting(task, lambda: client.zcard(event._keys.waiters) == 1)
        await cancel_later(task, delay=delay)
        with pytest.raises(asyncio.CancelledError):
            await task
        assert keys(client, name) == []  # its entry left with it
        await event.set()
        assert await event.wait(0) is True
        await event.clear()
    run(url, body)
    assert keys(client, name) == []


def test_event_cancelled_at_every_step(url: str, client: redis.Redis) -> None:
    _short_lifetimes()
    name = _name()

    async def body(ac: Any) -> List[str]:
        seen = []
        for steps, delay in STEPS:
            event = aio.DistEvent(name, client=ac)
            task = asyncio.ensure_future(event.wait())
            await cancel_later(task, steps, delay)
            kind, value = await settle(task, event.set)
            seen.append(kind)
            assert kind == "cancelled" or (kind, value) == ("ok", True), (steps, delay, value)
            await event.clear()
            await until(lambda: _async(keys(client, name) == []))
        return seen

    assert "cancelled" in run(url, body, bound=BOUND * 4)


# --- condition --------------------------------------------------------------------------------------

def _cond_queued(client: redis.Redis, cond: Any, n: int = 1) -> Callable[[], Awaitable[bool]]:
    return lambda: _async(client.zcard(cond._keys.queue) == n)


def test_condition_asyncio_surface(url: str, client: redis.Redis) -> None:
    name = _name()

    async def body(ac: Any) -> None:
        cond = aio.DistCondition(name, client=ac)
        lock = cond._lock
        assert type(lock) is aio.DistLock and lock.name == name  # asyncio's default: a Lock
        with pytest.raises(TypeError, match="await"):
            if cond.locked():
                pass
        assert await cond.locked() is False
        with pytest.raises(RuntimeError, match="un-acquired"):
            cond.notify()  # no await: raised in the call
        with pytest.raises(RuntimeError, match="un-acquired"):
            cond.notify_all()
        with pytest.raises(RuntimeError, match="un-acquired"):
            await cond.wait()
        with pytest.raises(RuntimeError, match="un-acquired"):
            await cond.wait_for(lambda: False)
        assert await cond.wait_for(lambda: 7) == 7  # as asyncio's: true at once, no check
        with pytest.raises(TypeError, match="async with"):
            with cond:
                pass
        async with cond as got:
            assert got is None
            assert await cond.locked() is True
            change = cond.notify()
            with pytest.raises(TypeError, match="await"):
                bool(change)
            assert await change is None  # nobody waits: nothing to wake
            assert await cond.notify_all() is None
            assert await cond.wait(0.05) is False  # the blocking class' timeout
            assert lock.owned()  # taken back
            assert await cond.wait_for(lambda: 0, timeout=0.05) == 0  # the last false result
        assert await cond.locked() is False
        assert await cond.acquire() is True  # the lock's own methods, as asyncio exports them
        await cond.release()
    run(url, body)
    assert keys(client, name) == [f"distlock:{{{name}}}:fence"]


def test_condition_wait_returns_true_when_notified(url: str, client: redis.Redis) -> None:
    name = _name()

    async def body(ac: Any) -> None:
        cond = aio.DistCondition(name, client=ac)
        got: List[Any] = []

        async def waiter() -> None:
            async with cond:
                got.append(await cond.wait())
                got.append(cond._lock.owned())  # the lock is held again on return
        task = asyncio.ensure_future(waiter())
        await until(_cond_queued(client, cond))
        async with cond:
            cond.notify()  # not awaited: it still wakes the waiter
        await task
        assert got == [True, True]
    run(url, body)
    assert keys(client, name) == [f"distlock:{{{name}}}:fence"]


def test_condition_notify_n_and_notify_all(url: str, client: redis.Redis) -> None:
    name = _name()

    async def body(ac: Any) -> None:
        cond = aio.DistCondition(name, client=ac)
        woken: List[int] = []

        async def waiter(i: int) -> None:
            async with cond:
                assert await cond.wait() is True
                woken.append(i)
        tasks = []
        for i in range(5):  # queued in this order
            tasks.append(asyncio.ensure_future(waiter(i)))
            await until(_cond_queued(client, cond, i + 1))
        async with cond:
            await cond.notify(2)
        await asyncio.gather(*tasks[:2])
        assert sorted(woken) == [0, 1]  # the oldest two
        assert client.zcard(cond._keys.queue) == 3
        async with cond:
            await cond.notify_all()
        await asyncio.gather(*tasks)
        assert sorted(woken) == [0, 1, 2, 3, 4]
    run(url, body)
    assert keys(client, name) == [f"distlock:{{{name}}}:fence"]


def test_condition_producer_consumer(url: str, client: redis.Redis) -> None:
    """Items go through a list guarded by the condition: every item is consumed exactly once,
    and no consumer ever finds the list empty after wait_for."""
    name, queue_key = _name(), _name("items")

    async def body(ac: Any) -> List[int]:
        consumed: List[int] = []

        async def consumer() -> None:
            cond = aio.DistCondition(name, client=ac)  # an object per task, one condition
            while True:
                async with cond:
                    await cond.wait_for(lambda: client.llen(queue_key) > 0)
                    item = int(client.lpop(queue_key))
                if item < 0:
                    return
                consumed.append(item)

        async def producer(start: int) -> None:
            cond = aio.DistCondition(name, client=ac)
            for item in range(start, start + 10):
                async with cond:
                    client.rpush(queue_key, item)
                    cond.notify()
                await asyncio.sleep(0)

        consumers = [asyncio.ensure_future(consumer()) for _ in range(4)]
        await asyncio.gather(producer(0), producer(100))
        cond = aio.DistCondition(name, client=ac)
        async with cond:
            client.rpush(queue_key, *([-1] * 4))  # one stop per consumer
            cond.notify_all()
        await asyncio.gather(*consumers)
        return consumed

    consumed = run(url, body, bound=BOUND * 2)
    assert sorted(consumed) == list(range(10)) + list(range(100, 110))
    assert not client.exists(queue_key)
    assert keys(client, name) == [f"distlock:{{{name}}}:fence"]


def test_condition_over_a_task_reentrant_lock_and_a_write_lock(url: str, client: redis.Redis) -> None:
    async def body(ac: Any) -> None:
        rlock = aio.DistRLock(_name(), client=ac)
        cond = aio.DistCondition(rlock.name, rlock, client=ac)

        async def waiter() -> int:
            async with cond:
                async with rlock:  # depth 2
                    assert await cond.wait() is True
                    return rlock._recursion_count()
        task = asyncio.ensure_future(waiter())
        await until(_cond_queued(client, cond))
        assert await rlock.locked() is False  # released at every depth while it waits
        async with cond:
            cond.notify()
        assert await task == 2  # taken back at its depth

        rw = aio.DistReadWriteLock(_name(), client=ac)
        wcond = aio.DistCondition(rw.name, rw.write_lock(), client=ac)
        flag: List[bool] = []

        async def write_waiter() -> None:
            async with wcond:
                await wcond.wait_for(lambda: flag)
        task = asyncio.ensure_future(write_waiter())
        await until(_cond_queued(client, wcond))
        async with rw.read_lock():  # the writer waits: the lock is free for readers
            pass
        async with wcond:
            flag.append(True)
            wcond.notify_all()
        await task
    run(url, body)


def test_condition_refuses_a_lock_it_cannot_await(url: str, client: redis.Redis) -> None:
    for lock in (distlock.DistLock("x", client=client), asyncio.Lock(), threading.Lock()):
        with pytest.raises(TypeError, match="distlock.asyncio lock"):
            aio.DistCondition("x", lock)


def test_condition_bad_arguments_as_the_blocking_class(url: str, client: redis.Redis) -> None:
    for args, kwargs in [((1,), {}), (("",), {})]:
        expected = outcome(partial(distlock.DistCondition, *args, **kwargs))
        assert expected[0] != "ok", (args, kwargs)
        assert outcome(partial(aio.DistCondition, *args, **kwargs)) == expected, (args, kwargs)

    async def body(ac: Any) -> None:
        sync_cond = distlock.DistCondition(_name(), distlock.DistLock("s", client=client), client=client)
        async_cond = aio.DistCondition(_name(), client=ac)
        with sync_cond:
            async with async_cond:
                for timeout in ["1", 1j, [1], math.inf, 1e100]:
                    expected = outcome(partial(sync_cond.wait, timeout))
                    assert expected[0] != "ok", timeout
                    assert await outcome_of(async_cond.wait(timeout)) == expected, timeout
                    assert async_cond._lock.owned()
                for n in ["2", None, [1]]:
                    expected = outcome(partial(sync_cond.notify, n))
                    assert expected[0] != "ok", n
                    assert outcome(partial(async_cond.notify, n)) == expected, n  # in the call
                for n in [0, -1, math.nan]:  # threading (and asyncio): wakes nobody
                    assert await async_cond.notify(n) is None
    run(url, body)


def test_condition_sync_and_async_wake_each_other(url: str, client: redis.Redis) -> None:
    """A blocking DistCondition over a blocking DistLock of the name and an asyncio
    DistCondition (whose default lock is that DistLock) are one condition."""
    name = _name()
    sync_cond = distlock.DistCondition(name, distlock.DistLock(name, client=client), client=client)

    def thread_waits(got: List[bool]) -> None:
        with sync_cond:
            got.append(sync_cond.wait(BOUND))

    async def body(ac: Any) -> None:
        cond = aio.DistCondition(name, client=ac)
        got: List[bool] = []
        thread = in_thread(lambda: thread_waits(got))
        await until(_cond_queued(client, cond))
        async with cond:  # the thread released the lock when it joined the queue
            cond.notify()
        await joined(thread)
        assert got == [True]

        async def task_waits() -> bool:
            async with cond:
                return await cond.wait(BOUND)
        task = asyncio.ensure_future(task_waits())
        await until(_cond_queued(client, cond))

        def notify() -> None:
            with sync_cond:
                sync_cond.notify()
        notifier = in_thread(notify)
        assert await task is True
        await joined(notifier)
    run(url, body)
    assert keys(client, name) == [f"distlock:{{{name}}}:fence"]


@pytest.mark.parametrize("delay", QUEUED_DELAYS)
def test_condition_cancelled_wait_takes_the_lock_back(url: str, client: redis.Redis, delay: float) -> None:
    """As asyncio.Condition.wait(): the lock is held again when the cancellation propagates,
    and ``async with`` releases it."""
    name = _name()

    async def body(ac: Any) -> None:
        cond = aio.DistCondition(name, client=ac)
        seen: List[Any] = []

        async def waiter() -> None:
            async with cond:
                try:
                    await cond.wait()
                except asyncio.CancelledError:
                    seen.append(cond._lock.owned())
                    raise
        task = asyncio.ensure_future(waiter())
        await waiting(task, lambda: client.zcard(cond._keys.queue) == 1)
        await cancel_later(task, delay=delay)
        with pytest.raises(asyncio.CancelledError):
            await task
        assert seen == [True]
        assert await cond.locked() is False  # released by async with
    run(url, body)
    assert keys(client, name) == [f"distlock:{{{name}}}:fence"]


def test_condition_cancelled_wait_waits_for_the_lock_even_when_cancelled_again(
        url: str, client: redis.Redis) -> None:
    """The lock is busy when the wait is cancelled: the wait takes it back first, through a
    second cancellation too, as asyncio.Condition.wait() does (checked against it)."""
    async def scenario(cond: Any, lock: Any, owned: Callable[[], bool],
                       ready: Callable[[Any], bool], asleep: Callable[[Any], bool]) -> List[str]:
        order: List[str] = []

        async def waiter() -> None:
            async with cond:
                try:
                    await cond.wait()
                except asyncio.CancelledError:
                    order.append(f"cancelled, holding={owned()}")
                    raise
        task = asyncio.ensure_future(waiter())
        await until(lambda: _async(ready(task)))
        await lock.acquire()  # another task holds the lock
        task.cancel()
        await asyncio.sleep(0.2)
        await until(lambda: _async(asleep(task)))  # waiting for the lock
        task.cancel()  # cancelled again while it waits for the lock
        await asyncio.sleep(0.2)
        order.append("holder releases")
        lock.release()
        kind, _ = await settle(task)
        order.append(kind)
        return order

    name = _name()

    async def body(ac: Any) -> Tuple[List[str], List[str]]:
        reference = asyncio.Condition()
        expected = await scenario(reference, reference, reference.locked,
                                  lambda task: bool(reference._waiters), lambda task: True)
        cond = aio.DistCondition(name, client=ac)
        holder = aio.DistLock(name, client=ac)
        got = await scenario(cond, holder, cond._lock.owned,
                             lambda task: client.zcard(cond._keys.queue) == 1 and asleep(task),
                             asleep)
        return expected, got

    expected, got = run(url, body)
    assert expected == ["holder releases", "cancelled, holding=True", "cancelled"]
    assert got == expected
    assert keys(client, name) == [f"distlock:{{{name}}}:fence"]


async def _wait_releasing_if_held(cond: Any) -> bool:
    await cond.acquire()
    try:
        return bool(await cond.wait())
    finally:
        if cond._lock.owned():  # (see test_cancelled_when_a_reply_is_cut_off[condition-join])
            await cond.release()


async def _notify_all(cond: Any) -> None:
    async with cond:
        await cond.notify_all()


def test_condition_cancelled_at_every_step(url: str, client: redis.Redis) -> None:
    """Cancelled anywhere (taking the lock, joining the queue, asleep, taking the lock back):
    the lock ends free and nothing but the lock's fence counter is left."""
    _short_lifetimes()
    name = _name()

    async def body(ac: Any) -> List[str]:
        seen = []
        for steps, delay in STEPS:
            cond = aio.DistCondition(name, client=ac)
            task = asyncio.ensure_future(_wait_releasing_if_held(cond))
            await cancel_later(task, steps, delay)
            kind, value = await settle(task, partial(_notify_all, cond))
            seen.append(kind)
            assert kind == "cancelled" or (kind, value) == ("ok", True), (steps, delay, value)
            await until(cond.locked, negate=True)
            await until(lambda: _async(set(keys(client, name)) <= {f"distlock:{{{name}}}:fence"}))
        return seen

    assert "cancelled" in run(url, body, bound=BOUND * 4)


# --- barrier ----------------------------------------------------------------------------------------

def _trip_record_only(client: redis.Redis, barrier: Any) -> List[str]:
    """``barrier``'s keys, leaving out the record of its latest generation (the state hash with
    only generation numbers, which runs out with the parties' leases), as tests/primitives/test_barrier.py
    accepts it at rest."""
    state = barrier._keys.state
    left = keys(client, barrier.name)
    if state in left:
        assert set(client.hkeys(state)) <= {b"g", b"o", b"k"}, client.hgetall(state)
        assert 0 < client.pttl(state) <= distlock.configure().lease * 1000
        left.remove(state)
    return left


def test_barrier_asyncio_surface(url: str, client: redis.Redis) -> None:
    name = _name()

    async def body(ac: Any) -> None:
        barrier = aio.DistBarrier(name, 3, client=ac)
        assert barrier.parties == 3  # a plain value, as asyncio's property
        for query in (barrier.n_waiting(), barrier.broken()):
            with pytest.raises(TypeError, match="await"):
                bool(query)
        assert await barrier.n_waiting() == 0 and await barrier.broken() is False
        parties = [asyncio.ensure_future(barrier.wait()) for _ in range(2)]
        await until(lambda: _eq(barrier.n_waiting(), 2))

        async def enter() -> int:
            async with barrier as index:  # asyncio.Barrier's __aenter__ gives the index
                return index
        assert sorted([await enter(), *await asyncio.gather(*parties)]) == [0, 1, 2]
        assert await barrier.n_waiting() == 0
        one = aio.DistBarrier(_name(), 1, client=ac)
        assert [await one.wait(), await one.wait(0), await one.wait(-1)] == [0, 0, 0]
    run(url, body)
    assert _trip_record_only(client, aio.DistBarrier(name, 3)) == []


async def _eq(query: Awaitable[Any], value: Any) -> bool:
    return await query == value


async def _eq_query(query: Callable[[], Awaitable[Any]], value: Any) -> bool:
    return await query() == value


def test_barrier_tasks_get_distinct_indices_every_generation(url: str, client: redis.Redis) -> None:
    name = _name()

    async def body(ac: Any) -> List[List[int]]:
        async def party() -> List[int]:
            barrier = aio.DistBarrier(name, 5, client=ac)
            return [await barrier.wait() for _ in range(4)]
        return await asyncio.gather(*(party() for _ in range(5)))

    results = run(url, body, bound=BOUND * 2)
    for gen in range(4):
        assert sorted(r[gen] for r in results) == [0, 1, 2, 3, 4]


def test_barrier_broken_barrier_error_is_asyncios(url: str, client: redis.Redis) -> None:
    assert aio.BrokenBarrierError is BROKEN  # asyncio.BrokenBarrierError on Python 3.11+
    name = _name()

    async def body(ac: Any) -> None:
        barrier = aio.DistBarrier(name, 3, client=ac)
        parties = [asyncio.ensure_future(barrier.wait()) for _ in range(2)]
        await until(lambda: _eq(barrier.n_waiting(), 2))
        change = barrier.abort()  # not awaited: it still breaks the barrier
        with pytest.raises(TypeError, match="await"):
            bool(change)
        for party in parties:
            with pytest.raises(BROKEN) as info:
                await party
            assert type(info.value) is BROKEN
        assert await barrier.broken() is True and await barrier.n_waiting() == 0
        with pytest.raises(BROKEN):
            await barrier.wait()  # broken until reset
        barrier.reset()  # not awaited either
        await until(barrier.broken, negate=True)
        assert sorted(await asyncio.gather(*(barrier.wait() for _ in range(3)))) == [0, 1, 2]
    run(url, body)


def test_barrier_reset_breaks_waiters_but_not_the_barrier(url: str, client: redis.Redis) -> None:
    async def body(ac: Any) -> None:
        barrier = aio.DistBarrier(_name(), 3, client=ac)
        parties = [asyncio.ensure_future(barrier.wait()) for _ in range(2)]
        await until(lambda: _eq(barrier.n_waiting(), 2))
        assert await barrier.reset() is None
        results = await asyncio.gather(*parties, return_exceptions=True)
        assert [type(r) for r in results] == [BROKEN] * 2
        assert await barrier.broken() is False
        assert sorted(await asyncio.gather(*(barrier.wait() for _ in range(3)))) == [0, 1, 2]
    run(url, body)


def test_barrier_timeout_breaks_it(url: str, client: redis.Redis) -> None:
    """asyncio.Barrier has no timeout; DistBarrier keeps threading's, and a timeout breaks it."""
    async def body(ac: Any) -> None:
        for barrier, timeout in ((aio.DistBarrier(_name(), 3, client=ac), 0.3),
                                 (aio.DistBarrier(_name(), 3, timeout=0.3, client=ac), None)):
            results = await asyncio.gather(barrier.wait(timeout), barrier.wait(timeout),
                                           return_exceptions=True)
            assert [type(r) for r in results] == [BROKEN] * 2
            assert await barrier.broken() is True
            await barrier.reset()
        zero = aio.DistBarrier(_name(), 2, client=ac)
        with pytest.raises(BROKEN):
            await zero.wait(0)
        assert await zero.broken() is True
        await zero.reset()
    run(url, body)


def test_barrier_action_runs_once_per_generation_in_the_loop(url: str, client: redis.Redis) -> None:
    async def body(ac: Any) -> None:
        loop = asyncio.get_running_loop()
        runs: List[Any] = []
        released: List[int] = []

        def action() -> None:
            runs.append(asyncio.get_running_loop() is loop)

        barrier = aio.DistBarrier(_name(), 3, action, client=ac)

        async def party() -> None:
            for gen in range(3):
                await barrier.wait()
                released.append(len(runs) - gen)  # 1: the action of this generation ran first
        await asyncio.gather(*(party() for _ in range(3)))
        assert runs == [True] * 3 and released == [1] * 9

        def boom() -> None:
            raise ZeroDivisionError("boom")
        failing = aio.DistBarrier(_name(), 3, boom, client=ac)
        results = await asyncio.gather(*(failing.wait() for _ in range(3)), return_exceptions=True)
        assert sorted(type(r).__name__ for r in results) == ["BrokenBarrierError", "BrokenBarrierError",
                                                             "ZeroDivisionError"]
        assert all(isinstance(r, (BROKEN, ZeroDivisionError)) for r in results)
        assert await failing.broken() is True
        await failing.reset()
    run(url, body)


def test_barrier_bad_arguments_as_the_blocking_class(url: str, client: redis.Redis) -> None:
    for args, kwargs in [((1, 2), {}), (("", 2), {}), (("x", 0), {}), (("x", -1), {}),
                         (("x", 1.5), {}), (("x", "3"), {}), (("x", None), {}),
                         (("x", 2), {"action": 42}), (("x", 2), {"timeout": "1"}),
                         (("x", 2), {"timeout": math.inf}), (("x", 2), {"timeout": math.nan})]:
        expected = outcome(partial(distlock.DistBarrier, *args, **kwargs))
        assert expected[0] != "ok", (args, kwargs)
        assert outcome(partial(aio.DistBarrier, *args, **kwargs)) == expected, (args, kwargs)
    _same_signature_errors(distlock.DistBarrier, aio.DistBarrier, ("x", 2, None, None, None),
                           {"bogus": 1})

    async def body(ac: Any) -> None:
        sync_barrier = distlock.DistBarrier(_name(), 2, client=client)
        async_barrier = aio.DistBarrier(_name(), 2, client=ac)
        for timeout in ["1", 1j, [1], math.inf, 1e100]:
            expected = outcome(partial(sync_barrier.wait, timeout))
            assert expected[0] != "ok", timeout
            assert await outcome_of(async_barrier.wait(timeout)) == expected, timeout
        assert await async_barrier.broken() is False and await async_barrier.n_waiting() == 0
    run(url, body)


def test_barrier_threads_and_tasks_are_parties_of_one_barrier(url: str, client: redis.Redis) -> None:
    name = _name()
    sync_barrier = distlock.DistBarrier(name, 4, client=client)
    got: List[int] = []

    async def body(ac: Any) -> List[int]:
        threads = [in_thread(lambda: got.append(sync_barrier.wait(BOUND))) for _ in range(2)]
        barrier = aio.DistBarrier(name, 4, client=ac)
        await until(lambda: _eq(barrier.n_waiting(), 2))
        indices = await asyncio.gather(barrier.wait(BOUND), barrier.wait(BOUND))
        for thread in threads:
            await joined(thread)
        return indices

    indices = run(url, body)
    assert sorted(indices + got) == [0, 1, 2, 3]


@pytest.mark.skipif(sys.version_info < (3, 11), reason="asyncio.Barrier is new in Python 3.11")
def test_barrier_cancelled_party_leaves_it_filling_as_asyncio(url: str, client: redis.Redis) -> None:
    """A party cancelled while the barrier fills leaves without breaking it; the others go on
    waiting for a full count. The same scenario on asyncio.Barrier gives the same results."""
    async def scenario(barrier: Any, n_waiting: Callable[[], Awaitable[int]],
                       broken: Callable[[], Awaitable[bool]],
                       ready: Callable[[Any], bool]) -> Tuple[Any, ...]:
        first = asyncio.ensure_future(barrier.wait())
        await until(lambda: _eq(n_waiting(), 1))
        second = asyncio.ensure_future(barrier.wait())
        await until(lambda: _eq(n_waiting(), 2))
        await until(lambda: _async(ready(first)))
        first.cancel()
        with pytest.raises(asyncio.CancelledError):
            await first
        after_cancel = (await n_waiting(), await broken())
        rest = [asyncio.ensure_future(barrier.wait()) for _ in range(2)]
        results = await asyncio.gather(second, *rest)
        return after_cancel, len(results), all(0 <= r < 3 for r in results), await broken()

    name = _name()

    async def body(ac: Any) -> Tuple[Any, Any]:
        reference = asyncio.Barrier(3)
        expected = await scenario(reference, lambda: _async(reference.n_waiting),
                                  lambda: _async(reference.broken), lambda task: True)
        barrier = aio.DistBarrier(name, 3, client=ac)
        return expected, await scenario(barrier, barrier.n_waiting, barrier.broken, asleep)

    expected, got = run(url, body)
    assert expected == ((1, False), 3, True, False)
    assert got == expected
    assert _trip_record_only(client, aio.DistBarrier(name, 3)) == []


@pytest.mark.parametrize("delay", QUEUED_DELAYS)
def test_barrier_cancelled_while_waiting(url: str, client: redis.Redis, delay: float) -> None:
    name = _name()

    async def body(ac: Any) -> None:
        barrier = aio.DistBarrier(name, 2, client=ac)
        task = asyncio.ensure_future(barrier.wait())
        await waiting(task, lambda: client.zcard(barrier._keys.waiters) == 1)
        await cancel_later(task, delay=delay)
        with pytest.raises(asyncio.CancelledError):
            await task
        assert (await barrier.n_waiting(), await barrier.broken()) == (0, False)
        assert _trip_record_only(client, barrier) == []
        assert sorted(await asyncio.gather(barrier.wait(), barrier.wait())) == [0, 1]
    run(url, body)
    assert _trip_record_only(client, aio.DistBarrier(name, 2)) == []


def test_barrier_cancelled_at_every_step(url: str, client: redis.Redis) -> None:
    """Cancel a party of a barrier of two at every step; then, if it still waits (a
    cancellation that did not take), another party releases it. The barrier ends usable,
    with no party left in it."""
    _short_lifetimes()
    name = _name()

    async def body(ac: Any) -> List[str]:
        seen = []
        for steps, delay in STEPS:
            barrier = aio.DistBarrier(name, 2, client=ac)
            first = asyncio.ensure_future(barrier.wait())
            await cancel_later(first, steps, delay)
            done, _ = await asyncio.wait({first}, timeout=1.0)
            second = None
            if not done:  # still waiting: a cancellation that did not take, or a slow one
                second = asyncio.ensure_future(barrier.wait())
                await asyncio.wait({first})
            seen.append("cancelled" if first.cancelled() else "ok")
            if not first.cancelled():
                assert second is not None
                assert sorted([first.result(), await second]) == [0, 1], (steps, delay)
            elif second is not None:  # it left after all: the newcomer waits alone
                await until(partial(_eq_query, barrier.n_waiting, 1))
                second.cancel()
                await settle(second, barrier.wait)
            await until(partial(_eq_query, barrier.n_waiting, 0))
            if await barrier.broken():  # see test_cancelled_when_a_reply_is_cut_off[barrier-arrival]
                await barrier.reset()
        return seen

    assert "cancelled" in run(url, body, bound=BOUND * 4)
    barrier = aio.DistBarrier(name, 2)
    _until_sync(lambda: _trip_record_only(client, barrier) in ([], [barrier._keys.broken]))


# --- read/write lock ---------------------------------------------------------------------------------

def _fence_only(name: str) -> List[str]:
    return [f"distlock:{{{name}}}:fence"]


def test_a_cancelled_waiting_writer_wakes_the_readers_refused_behind_it(url: str,
                                                                        client: redis.Redis) -> None:
    """A waiting writer keeps new readers out (writer preference). When its wait is cancelled
    it leaves the queue as a script that, as the last waiting writer, wakes the readers
    refused behind it: with a wait cap longer than their timeout, only that hint lets them in.
    (It used to leave with a bare ZREM, and they waited out their timeout.)"""
    name = _name()
    distlock.configure(wait_cap=60.0)
    holder = distlock.DistReadWriteLock(name, client=client).read_lock()
    assert holder.acquire(blocking=False)

    async def body(ac: Any) -> bool:
        rw = aio.DistReadWriteLock(name, client=ac)
        writer = asyncio.ensure_future(rw.write_lock().acquire(timeout=BOUND * 3))
        await until(lambda: _async(client.zcard(f"distlock:{{{name}}}:rw:q") == 1))
        async def read_once() -> bool:  # a read hold is its task's: taken and given back here
            reader = rw.read_lock()
            got = bool(await reader.acquire(timeout=BOUND))
            if got:
                await reader.release()
            return got

        second = asyncio.ensure_future(read_once())
        await asyncio.sleep(0.3)  # refused behind the writer, and waiting on its hint
        assert not second.done()
        writer.cancel()
        with pytest.raises(asyncio.CancelledError):
            await writer
        assert await second
        return True

    hints = client.pubsub()
    hints.subscribe(f"distlock:{{{name}}}:rw:wake")  # the readers' channel
    try:
        assert run(url, body, bound=BOUND * 2) is True
        # the hint that let the reader in (not its last try at its timeout)
        for _ in range(10):
            message = hints.get_message(timeout=1.0)
            if message and message["type"] == "message":
                assert message["data"] == b"*"
                break
        else:
            raise AssertionError("no hint on the readers' channel")
    finally:
        hints.close()
        holder.release()
    assert keys(client, name) == _fence_only(name)


def test_rwlock_readers_share_writers_exclude(url: str, client: redis.Redis) -> None:
    """Tasks take both sides at random: all readers can be inside at once, and no write hold
    overlaps any other hold (each hold recorded on the loop's clock)."""
    import random
    name = _name()

    async def body(ac: Any) -> List[Tuple[str, float, float, int]]:
        rw = aio.DistReadWriteLock(name, client=ac)
        inside, everyone = [0], asyncio.Event()

        async def reader() -> None:  # four readers meet inside: they overlap
            async with rw.read_lock():
                inside[0] += 1
                if inside[0] == 4:
                    everyone.set()
                await asyncio.wait_for(everyone.wait(), BOUND)
        await asyncio.gather(*(reader() for _ in range(4)))

        loop = asyncio.get_running_loop()
        intervals: List[Tuple[str, float, float, int]] = []

        async def worker(ops: str, seed: int) -> None:
            rng = random.Random(seed)
            lock = aio.DistReadWriteLock(name, client=ac)
            for op in ops:
                side = lock.read_lock() if op == "r" else lock.write_lock()
                assert await side.acquire(timeout=BOUND) is True
                start, token = loop.time(), side.token
                await asyncio.sleep(rng.uniform(0.001, 0.005))
                end = loop.time()
                await side.release()
                intervals.append((op, start, end, token))
        await asyncio.gather(*(worker(ops, i) for i, ops in
                               enumerate(["rrwrrw", "rwrrwr", "wrrrrw", "rrrwrr"])))
        return intervals

    intervals = run(url, body, bound=BOUND * 3)
    assert len(intervals) == 24
    _sem_rw_check(intervals)
    assert keys(client, name) == _fence_only(name)


def _sem_rw_check(intervals: List[Tuple[str, float, float, int]]) -> None:
    for w in (iv for iv in intervals if iv[0] == "w"):
        for other in intervals:
            if other is not w:
                assert not (w[1] < other[2] and other[1] < w[2]), f"write {w} overlaps {other}"
    tokens = [iv[3] for iv in intervals]
    assert len(set(tokens)) == len(tokens)


def test_rwlock_sides_are_owned_by_the_task(url: str, client: redis.Redis) -> None:
    name = _name()

    async def body(ac: Any) -> None:
        rw = aio.DistReadWriteLock(name, client=ac)
        read, write = rw.read_lock(), rw.write_lock()
        assert rw.read_lock() is read and rw.write_lock() is write
        with pytest.raises(TypeError, match="await"):
            bool(read.locked())
        with pytest.raises(TypeError, match="async with"):
            with read:
                pass
        async with write:
            async with write:  # the task re-enters
                assert write._recursion_count() == 2
                assert re.search(r"<locked distlock\.asyncio\.DistWriteLock .*owner=task-\d+ count=2",
                                 repr(write)), repr(write)

            async def elsewhere() -> Tuple[bool, bool]:  # another task, another owner
                return (await rw.read_lock().acquire(blocking=False),
                        await write.acquire(blocking=False))
            assert await asyncio.ensure_future(elsewhere()) == (False, False)

            async def release_elsewhere() -> None:
                write.release()
            with pytest.raises(LockNotOwnedError):
                await asyncio.ensure_future(release_elsewhere())
            async with read:  # a downgrade: never refused
                assert await read.locked() is True
        assert await write.locked() is False and await read.locked() is False
        async with read:
            assert "owner=task-" in repr(read)
            with pytest.raises(RuntimeError, match="upgrad"):  # refused, not a deadlock
                await write.acquire()
            with pytest.raises(RuntimeError, match="upgrad"):
                await write.acquire(timeout=30)

            async def reader() -> bool:
                side = rw.read_lock()
                got = await side.acquire(blocking=False)
                if got:
                    await side.release()
                return got
            assert await asyncio.ensure_future(reader()) is True  # readers share
        assert "<unlocked distlock.asyncio.DistReadLock" in repr(read)
    run(url, body)
    assert keys(client, name) == _fence_only(name)


def test_rwlock_upgrade_by_a_single_try_returns_false(url: str, client: redis.Redis) -> None:
    """As in the blocking shell: a task that holds only the read lock gets False from a single
    try for the write lock (no deadlock to refuse), and RuntimeError from one that would wait."""
    name = _name()

    async def body(ac: Any) -> None:
        rw = aio.DistReadWriteLock(name, client=ac)
        read, write = rw.read_lock(), rw.write_lock()
        async with read:
            token = read.token
            assert await write.acquire(blocking=False) is False
            assert await write.acquire(False) is False
            assert await write.acquire(timeout=0) is False
            assert await write.try_lock() is False
            assert await write.try_lock(0) is False
            with pytest.raises(RuntimeError, match="upgrad"):
                await write.try_lock(None)
            assert not write.owned() and write._recursion_count() == 0
            assert read.owned() and read._recursion_count() == 1 and read.token == token
            assert client.zcard(RWKeys.of("distlock:", name).queue) == 0  # never queued

            async def other_task() -> bool:  # no upgrader: refused by this task's read hold
                return bool(await write.acquire(blocking=False))
            assert await asyncio.ensure_future(other_task()) is False
        assert await write.acquire(blocking=False) is True  # the read lock released: granted
        await write.release()
    run(url, body)
    assert keys(client, name) == _fence_only(name)


def test_rwlock_release_without_await_still_releases(url: str, client: redis.Redis) -> None:
    name = _name()

    async def body(ac: Any) -> None:
        rw = aio.DistReadWriteLock(name, client=ac)
        await rw.write_lock().acquire()

        async def read() -> bool:
            side = aio.DistReadWriteLock(name, client=ac).read_lock()
            got = await side.acquire(timeout=BOUND)
            await side.release()
            return got
        reader = asyncio.ensure_future(read())
        await until(lambda: _async(_subscribers(client, rw.read_lock()._rw.reader_channel) >= 1))
        rw.write_lock().release()  # as asyncio users write it
        assert await reader is True
        assert not rw.write_lock().owned()
    run(url, body)
    assert keys(client, name) == _fence_only(name)


def test_rwlock_acquire_right_after_an_unawaited_release(url: str, client: redis.Redis) -> None:
    """``release()`` acts at once (its bookkeeping is done in the call): an acquire the same
    task makes next is a new hold, whatever the release's script is doing meanwhile."""
    name = _name()

    async def body(ac: Any) -> Tuple[bool, int, bool]:
        read = aio.DistReadWriteLock(name, client=ac).read_lock()
        await read.acquire()
        pending = read.release()
        got = await read.acquire()
        await pending
        state = (got, read._recursion_count(), await read.locked())
        if read.owned():
            await read.release()
        return state

    assert run(url, body) == (True, 1, True)


def _subscribers(client: redis.Redis, channel: str) -> int:
    return int(client.pubsub_numsub(channel)[0][1])


def test_rwlock_bad_arguments_as_the_blocking_class(url: str, client: redis.Redis) -> None:
    for args, kwargs in [((1,), {}), (("",), {}), (("x",), {"lease": 0}), (("x",), {"lease": -1}),
                         (("x",), {"lease": "1"}), (("x",), {"lease": math.nan})]:
        expected = outcome(partial(distlock.DistReadWriteLock, *args, **kwargs))
        assert expected[0] != "ok", (args, kwargs)
        assert outcome(partial(aio.DistReadWriteLock, *args, **kwargs)) == expected, (args, kwargs)
    _same_signature_errors(distlock.DistReadWriteLock, aio.DistReadWriteLock, ("x", None),
                           {"bogus": 1})

    async def body(ac: Any) -> None:
        sync_rw = distlock.DistReadWriteLock(_name(), client=client)
        async_rw = aio.DistReadWriteLock(_name(), client=ac)
        for side in ("read_lock", "write_lock"):
            for args, kwargs in [((False, 1), {}), ((True, -2), {}), (("x",), {}), ((True, "1"), {}),
                                 ((), {"timeout": math.nan})]:
                expected = outcome(partial(getattr(sync_rw, side)().acquire, *args, **kwargs))
                got = await outcome_of(getattr(async_rw, side)().acquire(*args, **kwargs))
                assert got == expected, (side, args, kwargs)
                if expected[0] == "ok":
                    # a non-bool blocking, which this interpreter's threading takes (3.12 and
                    # newer; the blocking shell follows it, and the asyncio shell the blocking
                    # one): both took the lock
                    assert args == ("x",), (side, args, kwargs, expected)
                    getattr(sync_rw, side)().release()
                    await getattr(async_rw, side)().release()
            with pytest.raises(LockNotOwnedError):
                getattr(async_rw, side)().release()  # in the call, not awaited
    run(url, body)


def test_rwlock_threads_and_tasks_exclude_each_other(url: str, client: redis.Redis) -> None:
    name = _name()
    sync_rw = distlock.DistReadWriteLock(name, client=client)
    order: List[str] = []

    def thread_reads(ready: threading.Event, go: threading.Event) -> None:
        with sync_rw.read_lock():
            ready.set()
            go.wait(BOUND)
            order.append("thread releases the read lock")

    async def body(ac: Any) -> None:
        rw = aio.DistReadWriteLock(name, client=ac)
        ready, go = threading.Event(), threading.Event()
        thread = in_thread(lambda: thread_reads(ready, go))
        await asyncio.get_running_loop().run_in_executor(None, ready.wait, BOUND)
        assert await rw.write_lock().acquire(blocking=False) is False  # the thread reads

        async def let_the_thread_go() -> None:  # once this task waits as a writer
            await until(lambda: _async(client.zcard(rw.write_lock()._rw.queue) == 1))
            go.set()
        helper = asyncio.ensure_future(let_the_thread_go())
        assert await rw.write_lock().acquire(timeout=BOUND) is True  # a task-owned hold
        order.append("task writes")
        await helper
        await joined(thread)
        # the other way round: a thread waits for the task's write lock
        got: List[bool] = []
        done = threading.Event()

        def thread_waits_to_read() -> None:
            got.append(sync_rw.read_lock().acquire(timeout=BOUND))
            done.wait(BOUND)
            sync_rw.read_lock().release()
        reader = in_thread(thread_waits_to_read)
        await until(lambda: _async(_subscribers(client, rw.read_lock()._rw.reader_channel) >= 1))
        assert got == []
        await rw.write_lock().release()
        await until(lambda: _async(got == [True]))
        assert await rw.read_lock().locked() is True  # the thread's read hold
        assert await rw.write_lock().acquire(blocking=False) is False
        done.set()
        await joined(reader)
        assert await rw.read_lock().locked() is False
    run(url, body)
    assert order == ["thread releases the read lock", "task writes"]
    assert keys(client, name) == _fence_only(name)


def test_rwlock_blocking_repr_while_a_task_holds(url: str, client: redis.Redis) -> None:
    name = _name()
    shared = redis.Redis.from_url(url)  # the asyncio client's session: no client names

    async def body(ac: Any) -> str:
        async with aio.DistReadWriteLock(name, client=ac).write_lock():
            side = distlock.DistReadWriteLock(name, client=shared).write_lock()
            assert side.acquire(blocking=False) is False  # this thread: another owner
            return repr(side)

    async def main() -> str:
        aclient = aredis.Redis.from_url(url)
        try:
            return await body(aclient)
        finally:
            await aclient.aclose()
    try:
        shown = asyncio.run(main())
    finally:
        shared.close()
    assert "distlock.DistWriteLock object" in shown


@pytest.mark.parametrize("delay", QUEUED_DELAYS)
@pytest.mark.parametrize("waits", ["writer", "reader"])
def test_rwlock_cancelled_while_waiting(url: str, client: redis.Redis, delay: float, waits: str) -> None:
    """A writer cancelled while queued leaves the queue (readers are no longer held back); a
    reader cancelled while a writer holds leaves nothing either."""
    name = _name()

    async def body(ac: Any) -> None:
        rw = aio.DistReadWriteLock(name, client=ac)
        holder = rw.read_lock() if waits == "writer" else rw.write_lock()
        await holder.acquire()
        other = aio.DistReadWriteLock(name, client=ac)
        side = other.write_lock() if waits == "writer" else other.read_lock()
        task = asyncio.ensure_future(side.acquire())
        if waits == "writer":
            await waiting(task, lambda: client.zcard(rw.write_lock()._rw.queue) == 1)
        else:
            await waiting(task, lambda: _subscribers(client, rw.read_lock()._rw.reader_channel))
        await cancel_later(task, delay=delay)
        with pytest.raises(asyncio.CancelledError):
            await task
        assert not client.exists(rw.write_lock()._rw.queue)
        if waits == "writer":  # a new reader is not held back by a writer that left
            async def reader() -> bool:
                r = aio.DistReadWriteLock(name, client=ac).read_lock()
                got = await r.acquire(blocking=False)
                if got:
                    await r.release()
                return got
            assert await asyncio.ensure_future(reader()) is True
        await holder.release()
        assert await side.acquire(blocking=False) is True  # free
        await side.release()
    run(url, body)
    assert keys(client, name) == _fence_only(name)


@pytest.mark.parametrize("side_name", ["write_lock", "read_lock"])
def test_rwlock_cancelled_at_every_step(url: str, client: redis.Redis, side_name: str) -> None:
    """Cancel a waiting acquire of either side at every step: the lock ends free, and nothing
    but the fence counter is left (once what a reply cut off left behind has run out: see
    test_cancelled_when_a_reply_is_cut_off)."""
    _short_lifetimes()
    name = _name()

    async def body(ac: Any) -> List[str]:
        seen = []
        for steps, delay in STEPS:
            rw = aio.DistReadWriteLock(name, client=ac)
            holder = rw.read_lock() if side_name == "write_lock" else rw.write_lock()
            assert await holder.acquire(timeout=BOUND) is True
            poke = once(holder.release)
            task = asyncio.ensure_future(_take_and_give_back(ac, name, side_name))
            await cancel_later(task, steps, delay)
            kind, value = await settle(task, poke)
            seen.append(kind)
            assert kind == "cancelled" or (kind, value) == ("ok", True), (steps, delay, value)
            await poke()
            await until(lambda: _async(keys(client, name) == _fence_only(name)))
            assert await rw.read_lock().locked() is False and await rw.write_lock().locked() is False
        return seen

    assert "cancelled" in run(url, body, bound=BOUND * 4)


async def _take_and_give_back(ac: Any, name: str, side_name: str) -> bool:
    """Take one side of the read/write lock, then release it (in this task: it owns it)."""
    side = getattr(aio.DistReadWriteLock(name, client=ac), side_name)()
    got = await side.acquire()
    await side.release()
    return bool(got)


def test_rwlock_cancelled_release_still_completes(url: str, client: redis.Redis) -> None:
    name = _name()

    async def body(ac: Any) -> None:
        for steps in range(6):
            for side_name in ("read_lock", "write_lock"):
                held = asyncio.Event()

                async def hold_then_release(side_name: str = side_name,
                                            held: asyncio.Event = held) -> None:
                    side = getattr(aio.DistReadWriteLock(name, client=ac), side_name)()
                    await side.acquire()
                    held.set()
                    await side.release()  # a task-owned hold: released by its task
                task = asyncio.ensure_future(hold_then_release())
                await held.wait()
                await cancel_later(task, steps)  # the task awaits its release (or it is done)
                assert (await settle(task))[0] in ("cancelled", "ok")
                rw = aio.DistReadWriteLock(name, client=ac)
                await until(rw.read_lock().locked, negate=True)  # released all the same
                await until(rw.write_lock().locked, negate=True)
    run(url, body)
    assert set(keys(client, name)) <= set(_fence_only(name))


# --- a cancellation where a reply is lost, at each script of each wait ----------------------------

class CutReply:
    """Hold back the reply to the ``nth`` run of script ``script`` (after the server ran it)
    until the task awaiting it is cancelled: the cancellation lands exactly where it cuts a
    reply off, the one place where what the server did is unknown to the wait."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, script: str, nth: int) -> None:
        from distlock._redis.aport import AsyncPort
        self.script, self.left, self.hit = script, nth, False
        original = AsyncPort.run
        cut = self

        async def run(port: Any, name: str, keys: Any, args: Any) -> Any:
            reply = await original(port, name, keys, args)
            if name == cut.script and cut.left > 0:
                cut.left -= 1
                if cut.left == 0:
                    cut.hit = True
                    await asyncio.sleep(BOUND * 2)  # cancelled here: the reply is lost
            return reply
        monkeypatch.setattr(AsyncPort, "run", run)

    async def reached(self) -> None:
        await until(lambda: _async(self.hit))


async def _cut_and_cancel(cut: CutReply, task: asyncio.Future[Any]) -> None:
    await cut.reached()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def _free_read(ac: Any, name: str) -> bool:
    """Can a new reader (another task) take the read lock now?"""
    async def read() -> bool:
        side = aio.DistReadWriteLock(name, client=ac).read_lock()
        got = await side.acquire(blocking=False)
        if got:
            await side.release()
        return got
    return await asyncio.ensure_future(read())


async def _cut_sem_first_try(ac: Any, name: str, client: redis.Redis, cut: Any) -> None:
    sem = aio.DistSemaphore(name, 1, client=ac)
    await _cut_and_cancel(cut, asyncio.ensure_future(sem.acquire()))
    assert keys(client, name) == []  # a grant the reply would have told of was given back
    assert await sem.acquire(blocking=False) is True
    await sem.release()


async def _cut_sem_waiting_try(ac: Any, name: str, client: redis.Redis, cut: Any) -> None:
    holder = aio.DistSemaphore(name, 1, client=ac)
    await holder.acquire()  # the 1st sem_acquire; the waiter's first try is the 2nd
    sem = aio.DistSemaphore(name, 1, client=ac)
    await _cut_and_cancel(cut, asyncio.ensure_future(sem.acquire()))
    await holder.release()
    assert set(keys(client, name)) <= {sem._keys.queue}  # no permit (the entry: documented)
    assert await sem.acquire(blocking=False) is True
    await sem.release()


async def _cut_event_wait(ac: Any, name: str, client: redis.Redis, cut: Any) -> None:
    event = aio.DistEvent(name, client=ac)
    await _cut_and_cancel(cut, asyncio.ensure_future(event.wait(0.3)))
    assert keys(client, name) == []


async def _cut_condition_wait(ac: Any, name: str, client: redis.Redis, cut: Any) -> None:
    cond = aio.DistCondition(name, client=ac)
    seen: List[bool] = []

    async def waiter() -> None:
        async with cond:
            try:
                await cond.wait(0.3)
            except asyncio.CancelledError:
                seen.append(cond._lock.owned())
                raise
    await _cut_and_cancel(cut, asyncio.ensure_future(waiter()))
    assert seen == [True]  # the lock was taken back before the cancellation propagated
    assert await cond.locked() is False
    assert keys(client, name) == [f"distlock:{{{name}}}:fence"]  # no waiter left queued


async def _cut_barrier_wait(ac: Any, name: str, client: redis.Redis, cut: Any) -> None:
    barrier = aio.DistBarrier(name, 2, client=ac)
    await _cut_and_cancel(cut, asyncio.ensure_future(barrier.wait()))
    assert (await barrier.n_waiting(), await barrier.broken()) == (0, False)  # it left
    newcomer = asyncio.ensure_future(barrier.wait())
    done, _ = await asyncio.wait({newcomer}, timeout=0.5)
    assert not done, "a party that was cancelled tripped the barrier"
    newcomer.cancel()
    await settle(newcomer)


async def _cut_rw_uncontended(ac: Any, name: str, client: redis.Redis, cut: Any,
                              side_name: str) -> None:
    side = getattr(aio.DistReadWriteLock(name, client=ac), side_name)()
    await _cut_and_cancel(cut, asyncio.ensure_future(side.acquire()))
    assert keys(client, name) == _fence_only(name)  # a grant cut off was given back
    writer = aio.DistReadWriteLock(name, client=ac).write_lock()
    assert await writer.acquire(blocking=False) is True
    await writer.release()


async def _cut_rw_writer_waits(ac: Any, name: str, client: redis.Redis, cut: Any) -> None:
    reader = aio.DistReadWriteLock(name, client=ac).read_lock()
    await reader.acquire()
    writer = aio.DistReadWriteLock(name, client=ac).write_lock()
    await _cut_and_cancel(cut, asyncio.ensure_future(writer.acquire()))
    assert not client.exists(writer._rw.queue)  # no writer left queued...
    assert await _free_read(ac, name) is True  # ...to hold new readers back
    await reader.release()
    assert keys(client, name) == _fence_only(name)


async def _cut_lock_first_try(ac: Any, name: str, client: redis.Redis, cut: Any) -> None:
    """The control: DistLock gives back a grant whose reply was lost (test_aio_locks)."""
    lock = aio.DistLock(name, client=ac)
    await _cut_and_cancel(cut, asyncio.ensure_future(lock.acquire()))
    assert keys(client, name) == _fence_only(name)
    assert await lock.acquire(blocking=False) is True
    await lock.release()


async def _cut_fair_first_try(ac: Any, name: str, client: redis.Redis, cut: Any) -> None:
    """A fair lock's first try granted it, and its reply was lost: ``fair_leave`` gives it
    back (tests/primitives/test_fair.py has the rest of the fair lock)."""
    lock = aio.DistLock(name, client=ac, fair=True)
    await _cut_and_cancel(cut, asyncio.ensure_future(lock.acquire()))
    assert keys(client, name) == _fence_only(name)
    assert await lock.acquire(blocking=False) is True
    await lock.release()


async def _cut_fair_waiting_try(ac: Any, name: str, client: redis.Redis, cut: Any) -> None:
    """A fair waiter's queueing try ran and its reply was lost: the wait leaves the line."""
    holder = aio.DistLock(name, client=ac, fair=True)
    await holder.acquire()  # the 1st fair_acquire; the waiter's first try is the 2nd
    lock = aio.DistLock(name, client=ac, fair=True)
    await _cut_and_cancel(cut, asyncio.ensure_future(lock.acquire()))
    assert not client.exists(f"distlock:{{{name}}}:fq", f"distlock:{{{name}}}:fe")
    await holder.release()
    assert await lock.acquire(blocking=False) is True
    await lock.release()


CUT_CASES = [
    pytest.param("sem_acquire", 1, _cut_sem_first_try, id="semaphore-first-try"),
    pytest.param("sem_acquire", 3, _cut_sem_waiting_try, id="semaphore-waiting-try"),
    pytest.param("ev_wait", 1, _cut_event_wait, id="event-join"),
    pytest.param("ev_wait", 2, _cut_event_wait, id="event-last-look"),
    pytest.param("cond_wait", 1, _cut_condition_wait, id="condition-join"),
    pytest.param("cond_leave", 1, _cut_condition_wait, id="condition-last-look"),
    pytest.param("lock_acquire", 2, _cut_condition_wait, id="condition-take-the-lock-back"),
    pytest.param("bar_wait", 1, _cut_barrier_wait, id="barrier-arrival"),
    pytest.param("rw_read_acquire", 1,
                 lambda *a: _cut_rw_uncontended(*a, "read_lock"), id="rw-read-first-try"),
    pytest.param("rw_write_acquire", 1,
                 lambda *a: _cut_rw_uncontended(*a, "write_lock"), id="rw-write-first-try"),
    pytest.param("rw_write_acquire", 1, _cut_rw_writer_waits, id="rw-writer-first-try-queues"),
    pytest.param("rw_write_acquire", 2, _cut_rw_writer_waits, id="rw-writer-waiting-try"),
    pytest.param("lock_acquire", 1, _cut_lock_first_try, id="lock-first-try-control"),
    pytest.param("fair_acquire", 1, _cut_fair_first_try, id="fair-lock-first-try"),
    pytest.param("fair_acquire", 3, _cut_fair_waiting_try, id="fair-lock-waiting-try"),
]


@pytest.mark.parametrize("script,nth,scenario", CUT_CASES)
def test_cancelled_when_a_reply_is_cut_off(url: str, client: redis.Redis,
                                           monkeypatch: pytest.MonkeyPatch, script: str, nth: int,
                                           scenario: Any) -> None:
    """A wait cancelled after one of its scripts ran on the server, before the reply reached
    it: the cancellation propagates and the wait leaves nothing behind, as if the script had
    not run (a grant is given back, an entry taken out, the lock of a condition taken back)."""
    _short_lifetimes()  # what a failure leaves runs out soon
    name = _name()
    cut = CutReply(monkeypatch, script, nth)
    run(url, lambda ac: scenario(ac, name, client, cut))


# --- what Python 3.11's asyncio.wait_for does to a cancellation -------------------------------------

def test_cancellation_is_never_swallowed(url: str, client: redis.Redis) -> None:
    """Cancel a waiting acquire (and an event's wait) after 1 to 8 loop steps: each
    cancellation propagates; none is lost, leaving the wait to go on and take the permit."""
    name = _name()

    async def body(ac: Any) -> List[Tuple[str, int, str]]:
        outcomes = []
        for steps in range(1, 9):
            holder = aio.DistSemaphore(name, 1, client=ac)
            await holder.acquire()
            task = asyncio.ensure_future(aio.DistSemaphore(name, 1, client=ac).acquire())
            await cancel_later(task, steps)
            poke = once(holder.release)
            kind, _ = await settle(task, poke)
            await poke()
            if kind == "ok":
                await aio.DistSemaphore(name, 1, client=ac).release()
            outcomes.append(("semaphore", steps, kind))

            # a name of its own: a name is one lock, and a cancelled waiter's entry may give
            # the event's name its kind for a moment after the wait ended
            event = aio.DistEvent(name + ":event", client=ac)
            task = asyncio.ensure_future(event.wait())
            await cancel_later(task, steps)
            kind, _ = await settle(task, event.set)
            await event.clear()
            outcomes.append(("event", steps, kind))
        return outcomes

    outcomes = run(url, body, bound=BOUND * 3)
    assert [o for o in outcomes if o[2] != "cancelled"] == []


# --- clients ----------------------------------------------------------------------------------------

CLASSES = [("DistSemaphore", ("x", 1)), ("DistBoundedSemaphore", ("x", 1)), ("DistEvent", ("x",)),
           ("DistCondition", ("x",)), ("DistBarrier", ("x", 2)), ("DistReadWriteLock", ("x",))]


@pytest.mark.parametrize("cls,args", CLASSES, ids=[c for c, _ in CLASSES])
def test_client_kinds_are_checked(url: str, client: redis.Redis, cls: str, args: Tuple[Any, ...]) -> None:
    acls, scls = getattr(aio, cls), getattr(distlock, cls)
    with pytest.raises(TypeError) as info:
        acls(*args, client=client)  # a blocking client, to an asyncio class
    assert f"use distlock.{cls} with it" in str(info.value)
    assert f"distlock.asyncio.{cls} a redis.asyncio.Redis" in str(info.value)
    aclient = aredis.Redis.from_url(url)
    with pytest.raises(TypeError, match=r"asyncio client: use distlock\.asyncio\."):
        scls(*args, client=aclient)  # and the other way round
    with pytest.raises(TypeError, match="client must be"):
        acls(*args, client=42)
    acls(*args, client=aclient)  # the right kinds, and a URL, are taken (no I/O yet)
    acls(*args, client=url)
    asyncio.run(aclient.aclose())


def test_primitives_of_a_url_client_work(url: str, client: redis.Redis) -> None:
    name = _name()

    async def body(ac: Any) -> None:
        # one name per kind: a name is one lock (docs/guides/kinds.rst)
        async with aio.DistSemaphore(name + ":sem", 2, client=url):
            event = aio.DistEvent(name + ":event", client=url)
            await event.set()
            assert await aio.DistEvent(name + ":event", client=ac).is_set() is True  # one event
            await event.clear()
        barrier = aio.DistBarrier(name + ":barrier", 1, client=url)
        assert await barrier.wait() == 0
        cond = aio.DistCondition(name, client=url)
        async with cond:
            assert await cond.wait(0.01) is False
        rw = aio.DistReadWriteLock(name, client=url)
        async with rw.write_lock():
            assert await aio.DistReadWriteLock(name, client=ac).write_lock().locked() is True
    run(url, body)
