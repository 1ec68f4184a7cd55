"""Redlock in the asyncio shell (``distlock.asyncio.DistLock(name, client=[...])`` with
``redis.asyncio.Redis`` masters), on five real masters (distlock/testing/redlock.py): the same plans as
the blocking classes, driven by an asyncio fan-out; sync and async holders of one name exclude
each other."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from typing import Any, Awaitable, Callable, List

import pytest
import redis.asyncio as aredis

import distlock
import distlock.asyncio as aio
from distlock import LockLostError, QuorumError
from distlock.testing.redlock import LEASE

pytestmark = pytest.mark.real_redis

BOUND = 20.0


def _name(prefix: str) -> str:
    return f"redlock-aio:{prefix}:{uuid.uuid4().hex[:10]}"


def _key(name: str) -> str:
    return f"distlock:{{{name}}}"


def run(redlock: Any, body: Callable[[List[aredis.Redis]], Awaitable[Any]]) -> Any:
    """``body(masters)`` in a fresh loop with an asyncio client per master; the loop's own
    tasks (distlock's readers) are let end and the clients closed before the loop closes."""
    async def main() -> Any:
        masters = [aredis.Redis.from_url(url, socket_timeout=5) for url in redlock.urls]
        try:
            return await asyncio.wait_for(body(masters), BOUND * 2)
        finally:
            for _ in range(150):
                if len(asyncio.all_tasks()) <= 1:
                    break
                await asyncio.sleep(0.02)
            for m in masters:
                await m.aclose()
    return asyncio.run(main())


@pytest.mark.parametrize("cls", [aio.DistLock, aio.DistRLock])
def test_grant_on_every_master_and_release(redlock: Any, cls: Any) -> None:
    name = _name("grant")

    async def body(masters: List[aredis.Redis]) -> Any:
        lock = cls(name, client=masters)
        assert await lock.acquire() is True
        tokens = [int(redlock.admin(i).hget(_key(name), ":t")) for i in range(5)]
        assert lock.token == max(tokens)
        assert await lock.locked() is True
        await lock.release()
        assert await lock.locked() is False

    run(redlock, body)
    assert all(not redlock.admin(i).exists(_key(name)) for i in range(5))


def test_sync_and_async_exclude_each_other(redlock: Any, redlock_clients: list) -> None:
    name = _name("mixed")
    sync_lock = distlock.DistLock(name, client=redlock_clients)

    async def body(masters: List[aredis.Redis]) -> Any:
        lock = aio.DistLock(name, client=masters)
        async with lock:
            assert await asyncio.to_thread(sync_lock.acquire, False) is False
        assert await asyncio.to_thread(sync_lock.acquire, False) is True
        assert await lock.acquire(blocking=False) is False
        waiter = asyncio.ensure_future(lock.acquire(timeout=BOUND))
        await asyncio.sleep(0.2)
        await asyncio.to_thread(sync_lock.release)
        assert await waiter is True  # woken by the sync release
        await lock.release()

    run(redlock, body)


def test_watchdog_keeps_an_async_hold(redlock: Any) -> None:
    async def body(masters: List[aredis.Redis]) -> Any:
        lock = aio.DistLock(_name("watchdog"), client=masters)
        lost: List[Any] = []
        lock.on_lost(lost.append)
        assert await lock.acquire()
        await asyncio.sleep(LEASE * 2)
        assert lock.owned() and not lost
        await lock.release()

    run(redlock, body)


@pytest.mark.parametrize("cls", [aio.DistLock, aio.DistRLock])
def test_tasks_taking_turns_follow_the_quorums_rules(redlock: Any, cls: Any,
                                                      caplog: pytest.LogCaptureFixture) -> None:
    """Tasks of one loop take turns on one name. A quorum keeps no lock for the releasing
    process (the yield rule is for one server or a cluster), so a release wakes the next
    waiter itself and leaves no ``lock_nudge`` to the watchdog, which no quorum runs: every
    turn is taken, and no job of the session fails."""
    name = _name("turns")
    caplog.set_level(logging.ERROR, logger="distlock")
    box = {"n": 0}

    async def body(masters: List[aredis.Redis]) -> Any:
        lock = cls(name, client=masters)
        assert lock._shares is False

        async def worker() -> None:
            for _ in range(10):
                async with lock:
                    value = box["n"]
                    await asyncio.sleep(0)
                    box["n"] = value + 1

        await asyncio.gather(*(worker() for _ in range(3)))

    run(redlock, body)
    assert box["n"] == 30
    assert [r.getMessage() for r in caplog.records] == []


def test_three_masters_killed_async_acquire_raises(redlock: Any) -> None:
    for i in (2, 3, 4):
        redlock.kill(i)

    async def body(masters: List[aredis.Redis]) -> Any:
        lock = aio.DistLock(_name("three-down"), client=masters)
        with pytest.raises(QuorumError) as info:
            await lock.acquire(blocking=False)
        assert (info.value.answered, info.value.required) == (2, 3)
        started = time.monotonic()
        with pytest.raises(QuorumError):
            await lock.acquire(timeout=1.0)
        assert 0.9 <= time.monotonic() - started < 1.0 + BOUND

    run(redlock, body)


def test_async_hold_reported_lost(redlock: Any) -> None:
    name = _name("lost")

    async def body(masters: List[aredis.Redis]) -> Any:
        lock = aio.DistLock(name, client=masters)
        lost = asyncio.Event()
        lock.on_lost(lambda _: lost.set())
        assert await lock.acquire()
        for i in (0, 1, 2):
            redlock.admin(i).delete(_key(name))
        await asyncio.wait_for(lost.wait(), BOUND)
        with pytest.raises(LockLostError):
            await lock.release()

    run(redlock, body)


def test_a_lost_reply_is_undone_behind_the_async_try(redlock: Any) -> None:
    name = _name("lost-reply")

    async def body(masters: List[aredis.Redis]) -> Any:
        warm = aio.DistLock(_name("warm"), client=masters)
        assert await warm.acquire()
        await warm.release()
        lock = aio.DistLock(name, client=masters)
        redlock.pause(0)
        try:
            assert await lock.acquire()
            session = lock._session()
            hold = lock._current(session)
            assert sorted(session.executor.parts[(hold.key, hold.owner)].tokens) == [1, 2, 3, 4]
        finally:
            redlock.resume(0)
        deadline = time.monotonic() + BOUND
        while redlock.admin(0).exists(_key(name)) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert not redlock.admin(0).exists(_key(name))
        await lock.release()

    run(redlock, body)


def test_asyncio_list_checks() -> None:
    import redis

    with pytest.raises(TypeError, match=r"client\[0\] is a blocking client"):
        aio.DistLock("x", client=[redis.Redis(port=40000), aredis.Redis(port=40001)])
    with pytest.raises(TypeError, match="only DistLock and DistRLock"):
        aio.DistSemaphore("x", client=[aredis.Redis(port=40000)])
    with pytest.raises(ValueError, match="same server"):
        aio.DistLock("x", client=[aredis.Redis(port=40000), aredis.Redis(port=40000)])
    with pytest.raises(ValueError, match="must not be empty"):
        aio.DistRLock("x", client=[])
