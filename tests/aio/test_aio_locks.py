"""distlock.asyncio's locks where asyncio differs from threading, and what only asyncio has:
awaitables that are not truth values, a release that acts at once, cancellation, task owners,
callbacks in the loop, sync and async primitives of one name, shared connections.

The contract shared with threading runs in tests/primitives/test_contract.py (the ``aio.*`` lock types).
Each test runs its coroutine with ``asyncio.run`` on a loop of its own.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from typing import Any, List

import pytest
import redis
import redis.asyncio as aredis
from _aio import keys, run_in_loop
from _support import collect_garbage

import distlock
import distlock.asyncio as aio
from distlock import LockLostError, LockNotOwnedError
from distlock._session.ports import live_ports

pytestmark = pytest.mark.real_redis

BOUND = 20.0


def _name(prefix: str = "aio") -> str:
    return f"{prefix}:{uuid.uuid4().hex[:10]}"


def run(url: str, body: Any) -> Any:
    return run_in_loop(url, body, BOUND, f"aio-{uuid.uuid4().hex[:6]}")

# --- awaitables -----------------------------------------------------------------------------

def test_queries_are_not_truth_values(url: str, client: redis.Redis) -> None:
    async def body(ac: Any) -> None:
        lock = aio.DistLock(_name(), client=ac)
        with pytest.raises(TypeError, match="await"):
            if lock.locked():
                pass
        assert await lock.locked() is False
        assert await lock.acquire() is True
        assert await lock.locked() is True
        pending = lock.release()
        with pytest.raises(TypeError, match="await"):
            bool(pending)
        await pending
    run(url, body)


def test_release_without_await_still_releases(url: str, client: redis.Redis) -> None:
    name = _name()

    async def body(ac: Any) -> None:
        lock = aio.DistLock(name, client=ac)
        await lock.acquire()
        lock.release()  # as asyncio users write it
        assert not lock.owned()  # at once, in this process
        for _ in range(200):
            if not await lock.locked():
                break
            await asyncio.sleep(0.01)
        assert await lock.locked() is False
    run(url, body)
    assert keys(client, name) == [f"distlock:{{{name}}}:fence"]


def test_misuse_raises_at_once(url: str, client: redis.Redis) -> None:
    async def body(ac: Any) -> None:
        lock, rlock = aio.DistLock(_name(), client=ac), aio.DistRLock(_name(), client=ac)
        with pytest.raises(RuntimeError):
            lock.release()  # no await: the error is not deferred
        with pytest.raises(LockNotOwnedError):
            rlock.release()
        with pytest.raises(TypeError, match="async with"):
            with lock:
                pass
    run(url, body)


def test_same_arguments_checks_and_errors_as_sync(url: str, client: redis.Redis) -> None:
    async def body(ac: Any) -> None:
        alock = aio.DistLock(_name(), client=ac)
        slock = distlock.DistLock(_name(), client=client)
        for args, kwargs in [((False, 1), {}), ((True, -2), {}), (("x",), {}), ((True, "1"), {}),
                             ((), {"timeout": float("nan")})]:
            try:
                slock.acquire(*args, **kwargs)
            except Exception as exc:  # noqa: BLE001
                expected: Any = (type(exc), str(exc))
            else:
                slock.release()
                expected = None
            try:
                got = await alock.acquire(*args, **kwargs)
            except Exception as exc:  # noqa: BLE001
                assert (type(exc), str(exc)) == expected, (args, kwargs)
            else:
                await alock.release()
                assert expected is None and got is True
        with pytest.raises(ValueError):
            await alock.try_lock(timeout=-1)
    run(url, body)


# --- clients --------------------------------------------------------------------------------

def test_client_kinds_are_checked(url: str, client: redis.Redis) -> None:
    with pytest.raises(TypeError, match=r"distlock\.DistLock"):
        aio.DistLock("x", client=client)
    with pytest.raises(TypeError, match=r"distlock\.asyncio\.DistRLock"):
        distlock.DistRLock("x", client=aredis.Redis.from_url(url))
    with pytest.raises(TypeError):
        aio.DistLock("x", client=object())


def test_url_and_default_serve_both_shells(url: str, client: redis.Redis,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    name = _name()
    distlock.configure(url)
    try:
        async def body(ac: Any) -> None:
            lock = aio.DistLock(name)  # the default: the configured URL
            async with lock:
                assert client.exists(f"distlock:{{{name}}}")
            by_url = aio.DistLock(name, client=url)
            async with by_url:
                pass
        run(url, body)
        distlock.configure(client)  # a blocking client serves only the blocking classes

        async def refused(ac: Any) -> None:
            with pytest.raises(RuntimeError, match="asyncio"):
                await aio.DistLock(name).acquire()
        run(url, refused)
    finally:
        distlock._session.config._default = None
        distlock._session.config._default_client = None
        distlock._session.config._default_async = None


# --- sync and async together ------------------------------------------------------------------

def test_sync_and_async_of_one_name_exclude_and_wake_each_other(url: str, client: redis.Redis) -> None:
    name = _name()
    sync_lock = distlock.DistLock(name, client=client)
    assert sync_lock.acquire()
    released_at: List[float] = []

    def release_later() -> None:
        time.sleep(0.3)
        released_at.append(time.monotonic())
        sync_lock.release()

    async def body(ac: Any) -> float:
        lock = aio.DistLock(name, client=ac)
        assert await lock.acquire(blocking=False) is False
        thread = threading.Thread(target=release_later)
        thread.start()
        try:
            assert await lock.acquire(timeout=BOUND) is True
            woke = time.monotonic() - released_at[0]
        finally:
            thread.join()
        # and the other way round: a blocking acquirer waits for the task's release
        got: List[bool] = []
        waiter = threading.Thread(target=lambda: got.append(sync_lock.acquire(timeout=BOUND)))
        waiter.start()
        await asyncio.sleep(0.2)
        assert not got
        await lock.release()
        await asyncio.get_running_loop().run_in_executor(None, waiter.join, BOUND)
        assert got == [True]
        sync_lock.release()
        return woke

    woke = run(url, body)
    assert woke < distlock._core.settings.settings().wait_cap  # woken by the hint, not the polling bound


# --- owners ---------------------------------------------------------------------------------

def test_rlock_is_owned_by_the_task(url: str, client: redis.Redis) -> None:
    async def body(ac: Any) -> None:
        rlock = aio.DistRLock(_name(), client=ac)
        await rlock.acquire()
        await rlock.acquire()  # re-entry by the same task
        other = asyncio.ensure_future(rlock.acquire(blocking=False))
        assert await other is False  # another task is another owner

        async def release_elsewhere() -> None:
            rlock.release()
        with pytest.raises(RuntimeError):
            await asyncio.ensure_future(release_elsewhere())
        await rlock.release()
        await rlock.release()
        assert await rlock.locked() is False
    run(url, body)


def test_lock_may_be_released_by_any_task(url: str, client: redis.Redis) -> None:
    async def body(ac: Any) -> None:
        lock = aio.DistLock(_name(), client=ac)
        await lock.acquire()

        async def release_elsewhere() -> None:
            await lock.release()
        await asyncio.ensure_future(release_elsewhere())
        assert await lock.locked() is False
    run(url, body)


def test_task_that_ends_holding_keeps_the_hold(url: str, client: redis.Redis) -> None:
    """As in threading: a hold outlives the task that took it (the watchdog renews it)."""
    name = _name()
    distlock.configure(lease=1.0, renew_interval=0.3)

    async def body(ac: Any) -> None:
        lock = aio.DistRLock(name, client=ac)
        await asyncio.ensure_future(lock.acquire())  # that task is over now
        await asyncio.sleep(2.0)  # two leases
        assert await lock.locked() is True
        assert await aio.DistLock(name, client=ac).acquire(blocking=False) is False
    run(url, body)
    assert client.exists(f"distlock:{{{name}}}")
    client.delete(f"distlock:{{{name}}}")


# --- cancellation ---------------------------------------------------------------------------

@pytest.mark.parametrize("at", [0.0, 0.001, 0.005, 0.02, 0.1, 0.5])
def test_cancelled_acquire_leaves_nothing(url: str, client: redis.Redis, at: float) -> None:
    """Cancel a waiting acquire at several moments: subscribing, in a try, asleep."""
    name = _name()

    async def body(ac: Any) -> None:
        holder = aio.DistLock(name, client=ac)
        await holder.acquire()
        waiter = aio.DistLock(name, client=ac)
        task = asyncio.ensure_future(waiter.acquire())
        await asyncio.sleep(at)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert not waiter.owned()
        await holder.release()
        assert await waiter.acquire(blocking=False) is True  # the lock is free
        await waiter.release()
    run(url, body)
    assert keys(client, name) == [f"distlock:{{{name}}}:fence"]


def test_cancelled_uncontended_acquire_at_every_step(url: str, client: redis.Redis) -> None:
    """Cancel a free lock's acquire after each number of loop steps: either it has the lock
    (the acquire returned) or nothing is left of it."""
    name = _name()

    async def body(ac: Any) -> None:
        lock = aio.DistLock(name, client=ac)
        for steps in range(12):
            task = asyncio.ensure_future(lock.acquire())
            for _ in range(steps):
                await asyncio.sleep(0)
            task.cancel()
            try:
                got = await task
            except asyncio.CancelledError:
                assert not lock.owned()
                assert await lock.locked() is False, steps
            else:
                assert got is True
                await lock.release()
    run(url, body)
    assert keys(client, name) in ([], [f"distlock:{{{name}}}:fence"])


def test_cancelled_release_still_completes(url: str, client: redis.Redis) -> None:
    name = _name()

    async def body(ac: Any) -> None:
        for steps in range(6):
            lock = aio.DistLock(name, client=ac)
            await lock.acquire()

            async def release(lock: Any = lock) -> None:
                await lock.release()
            task = asyncio.ensure_future(release())
            for _ in range(steps + 1):  # the first step calls release()
                await asyncio.sleep(0)
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                pass
            for _ in range(200):
                if not await lock.locked():
                    break
                await asyncio.sleep(0.01)
            assert await lock.locked() is False, steps
    run(url, body)
    assert keys(client, name) == [f"distlock:{{{name}}}:fence"]


def test_timeout_context_cancels_cleanly(url: str, client: redis.Redis) -> None:
    name = _name()

    async def body(ac: Any) -> None:
        holder = aio.DistLock(name, client=ac)
        await holder.acquire()
        waiter = aio.DistLock(name, client=ac)
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(waiter.acquire(), 0.2)
        await holder.release()
    run(url, body)
    assert keys(client, name) == [f"distlock:{{{name}}}:fence"]


# --- callbacks ------------------------------------------------------------------------------

def test_on_lost_runs_in_the_loop(url: str, client: redis.Redis) -> None:
    name = _name()
    distlock.configure(lease=1.0, renew_interval=0.3)

    async def body(ac: Any) -> None:
        loop = asyncio.get_running_loop()
        lock = aio.DistLock(name, client=ac)
        seen: List[Any] = []
        done = asyncio.Event()

        def plain(subject: Any) -> None:
            seen.append(("plain", subject, asyncio.get_running_loop() is loop,
                         threading.current_thread() is threading.main_thread()))

        async def coro(subject: Any) -> None:
            seen.append(("coro", subject, asyncio.get_running_loop() is loop, True))
            done.set()
        lock.on_lost(plain)
        lock.on_lost(coro)
        await lock.acquire()
        client.delete(f"distlock:{{{name}}}")  # the hold is gone: the watchdog will see it
        await asyncio.wait_for(done.wait(), BOUND)
        assert seen == [("plain", lock, True, True), ("coro", lock, True, True)]
        with pytest.raises(LockLostError):
            await lock.release()
    run(url, body)


# --- shared resources -----------------------------------------------------------------------

def _connections(client: redis.Redis) -> int:
    return len([c for c in client.client_list() if c.get("name", "").startswith("aio-")])


@pytest.mark.parametrize("tasks", [10, 300])
def test_waiting_tasks_share_connections(url: str, client: redis.Redis, tasks: int) -> None:
    name = _name()

    async def body(ac: Any) -> int:
        holder = aio.DistLock(name, client=ac)
        await holder.acquire()
        waiters = [asyncio.ensure_future(aio.DistLock(name, client=ac).acquire()) for _ in range(tasks)]
        await asyncio.sleep(1.5)
        used = _connections(client)
        await holder.release()
        for waiter in asyncio.as_completed(waiters):
            assert await waiter is True
        # each waiter got the lock once; give each back so the next one proceeds
        return used

    async def orderly(ac: Any) -> int:
        holder = aio.DistLock(name, client=ac)
        await holder.acquire()
        locks = [aio.DistLock(name, client=ac) for _ in range(tasks)]

        async def one(lock: Any) -> None:
            async with lock:
                pass
        waiters = [asyncio.ensure_future(one(lock)) for lock in locks]
        await asyncio.sleep(1.5)
        used = _connections(client)
        await holder.release()
        await asyncio.gather(*waiters)
        return used

    used = run(url, orderly)
    assert 1 <= used <= 8, used  # the pub/sub one plus a few pooled: flat in the number of tasks
    assert keys(client, name) == [f"distlock:{{{name}}}:fence"]


def test_nothing_left_running(url: str, client: redis.Redis) -> None:
    name = _name()

    seen: List[int] = []

    async def body(ac: Any) -> None:
        seen.append(id(ac))
        before = asyncio.all_tasks()
        holder = aio.DistLock(name, client=ac)
        await holder.acquire()
        task = asyncio.ensure_future(aio.DistLock(name, client=ac).acquire(timeout=0.3))
        assert await task is False
        await holder.release()
        for _ in range(100):  # the reader task exits once no channel is left
            if asyncio.all_tasks() == before:
                break
            await asyncio.sleep(0.02)
        assert asyncio.all_tasks() == before
    run(url, body)
    collect_garbage()
    assert not live_ports().get(seen[0])  # the client is gone, and its port with it


# --- belief keeps time (docs/safety.rst) ------------------------------------------------------

@pytest.mark.parametrize("kind", ["DistLock", "DistRLock"])
def test_belief_ends_at_a_fixed_leases_deadline(url: str, client: redis.Redis, kind: str) -> None:
    """The asyncio shell keeps the same rule as the blocking one: past a fixed lease's local
    deadline ``owned()``, ``token`` and ``valid_for()`` say "not held" with no round trip,
    ``on_lost`` runs in the loop, another holder gets the lock, and the late ``release()``
    raises LockLostError."""
    async def body(ac: Any) -> None:
        name = _name()
        lock = getattr(aio, kind)(name, client=ac, lease=0.3)
        lost: List[float] = []
        lock.on_lost(lambda _lock: lost.append(time.monotonic()))
        before = time.monotonic()
        assert await lock.acquire() is True
        after = time.monotonic()
        valid, owned = lock.valid_for(), lock.owned() and lock.token is not None
        assert valid <= 0.3
        if time.monotonic() < before + 0.3:  # a loaded machine may stall past the lease
            assert owned and valid > 0.0
        while time.monotonic() < after + 0.3:
            await asyncio.sleep(0.01)
        assert not lock.owned() and lock.token is None and lock.valid_for() == 0.0
        for _ in range(1000):
            if lost:
                break
            await asyncio.sleep(0.01)
        assert lost, "on_lost never ran"
        other = aio.DistLock(name, client=ac)
        assert await other.acquire(timeout=10) is True
        await other.release()
        with pytest.raises(LockLostError):
            await lock.release()

    run(url, body)
