"""``async with lock.bound():``: the block stops when its hold is lost, the exit raises
LockLostError with the hold's name, token and cause, and no cancellation is left behind in the
task (docs/guides/bound.rst).

Losses are made with the cap (``max_hold``), a fixed lease, and a takeover the watchdog's
renewal finds; the tests wait on what the task sees, with generous bounds, and judge no timing.
"""

from __future__ import annotations

import asyncio
import pickle
import sys
import uuid
from typing import Any, List

import pytest
import redis
from _aio import run_in_loop

import distlock
import distlock.asyncio as aio
from distlock import LockLostError

pytestmark = pytest.mark.real_redis

BOUND = 20.0
CAP = 0.3


def _name() -> str:
    return f"bound:{uuid.uuid4().hex[:10]}"


def run(url: str, body: Any) -> Any:
    return run_in_loop(url, body, BOUND)


def _no_cancellation_pending() -> None:
    task = asyncio.current_task()
    assert task is not None
    if sys.version_info >= (3, 11):
        assert task.cancelling() == 0


@pytest.mark.parametrize("kind", ["lock", "rlock", "write", "read"])
def test_a_healthy_block_runs_to_its_end_and_releases(url: str, client: redis.Redis, kind: str) -> None:
    name = _name()

    async def body(ac: Any) -> None:
        lock = {"lock": lambda: aio.DistLock(name, client=ac),
                "rlock": lambda: aio.DistRLock(name, client=ac),
                "write": lambda: aio.DistReadWriteLock(name, client=ac).write_lock(),
                "read": lambda: aio.DistReadWriteLock(name, client=ac).read_lock()}[kind]()
        async with lock.bound() as scope:
            assert lock.owned() and scope is not None
            await asyncio.sleep(0.05)
        assert not lock.owned()
        await asyncio.sleep(0.01)  # nothing pending
        _no_cancellation_pending()
    run(url, body)
    assert [k for k in client.keys(f"*{name}*") if not k.endswith(b":fence")] == []


@pytest.mark.parametrize("how", ["max_hold", "lease", "takeover"])
def test_a_lost_hold_stops_the_block_and_the_exit_raises(url: str, client: redis.Redis, how: str) -> None:
    name = _name()
    if how == "takeover":
        distlock.configure(lease=5.0, renew_interval=0.1)

    async def body(ac: Any) -> None:
        kwargs = {"max_hold": CAP} if how == "max_hold" else {"lease": 0.5} if how == "lease" else {}
        lock = aio.DistLock(name, client=ac, **kwargs)
        reached: List[str] = []
        with pytest.raises(LockLostError) as caught:
            async with lock.bound() as scope:
                token = scope._hold.token  # (lock.token is None once the hold is lost)
                reached.append("start")
                if how == "takeover":  # someone else's hold now: the next renewal finds it
                    await asyncio.get_running_loop().run_in_executor(
                        None, lambda: client.hset(f"distlock:{{{name}}}", ":t", 1))
                await asyncio.sleep(BOUND)  # cancelled here (or at the await above)
                reached.append("end")
        assert reached == ["start"]
        error = caught.value
        assert error.name == name and error.token == token
        expected = {"max_hold": "held longer than max_hold", "lease": "its lease of 0.5 s ran out",
                    "takeover": "gone or someone else's"}[how]
        assert error.cause is not None and expected in error.cause, error.cause
        assert expected in str(error)
        assert isinstance(error.__cause__, asyncio.CancelledError)
        _no_cancellation_pending()
        await asyncio.sleep(0.05)  # the task goes on: nothing pending escapes the block
        assert not lock.owned()
    run(url, body)


def test_the_loss_racing_the_exit_never_escapes_the_block(url: str, client: redis.Redis) -> None:
    """The block ends near the cap, at many offsets: either it ends normally, or the
    ``async with`` raises LockLostError; never a CancelledError after the block."""
    async def body(ac: Any) -> None:
        outcomes = {"clean": 0, "lost": 0}
        for i in range(24):
            lock = aio.DistLock(_name(), client=ac, max_hold=0.1)
            try:
                async with lock.bound():
                    await asyncio.sleep(0.07 + 0.0025 * i)  # from well before the cap to after it
                outcomes["clean"] += 1
            except LockLostError:
                outcomes["lost"] += 1
            for _ in range(3):
                await asyncio.sleep(0)  # a pending cancellation would be delivered here
            _no_cancellation_pending()
        assert sum(outcomes.values()) == 24
    run(url, body)


def test_an_outside_cancellation_still_cancels(url: str, client: redis.Redis) -> None:
    name = _name()

    async def body(ac: Any) -> None:
        lock = aio.DistLock(name, client=ac)
        entered = asyncio.Event()

        async def work() -> None:
            async with lock.bound():
                entered.set()
                await asyncio.sleep(BOUND)

        task = asyncio.ensure_future(work())
        await entered.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert not await lock.locked()  # released on the way out
    run(url, body)


@pytest.mark.skipif(sys.version_info < (3, 11), reason="3.9 and 3.10 have no Task.uncancel: "
                    "a loss and an outside cancellation at once end as LockLostError there")
def test_an_outside_cancellation_wins_over_a_loss_at_the_same_time(url: str, client: redis.Redis) -> None:
    async def body(ac: Any) -> None:
        lock = aio.DistLock(_name(), client=ac)
        entered = asyncio.Event()

        async def work() -> None:
            async with lock.bound() as scope:
                entered.set()
                scope._cancel()  # as the watchdog would ask, in the loop
                asyncio.current_task().cancel()  # type: ignore[union-attr]
                await asyncio.sleep(BOUND)

        task = asyncio.ensure_future(work())
        await entered.wait()
        with pytest.raises(asyncio.CancelledError):
            await task
    run(url, body)


def test_a_lock_taken_elsewhere_is_a_timeout(url: str, client: redis.Redis) -> None:
    name = _name()

    async def body(ac: Any) -> None:
        holder = aio.DistLock(name, client=ac)
        await holder.acquire()
        with pytest.raises(TimeoutError):
            async with aio.DistLock(name, client=ac).bound(timeout=0.1):
                raise AssertionError("not reached")
        with pytest.raises(TimeoutError, match="blocking=False"):
            async with aio.DistLock(name, client=ac).bound(blocking=False):
                raise AssertionError("not reached")
        with pytest.raises(ValueError):
            aio.DistLock(name, client=ac).bound(blocking=False, timeout=1)
        scope = holder.bound()
        await holder.release()
        async with scope:
            pass
        with pytest.raises(RuntimeError, match="used once"):
            async with scope:
                pass
        _no_cancellation_pending()
    run(url, body)


def test_lock_lost_error_pickles_with_its_cause() -> None:
    error = LockLostError("lost", name="n", token=7, cause="held longer than max_hold (1 s)")
    again = pickle.loads(pickle.dumps(error))
    assert (type(again), str(again), again.name, again.token, again.cause) == \
        (LockLostError, "lost", "n", 7, "held longer than max_hold (1 s)")


def test_a_suspended_hold_is_not_a_loss(url: str, client: redis.Redis) -> None:
    """A suspension (the watchdog's connection was reset) stops belief until a renewal
    confirms the hold; it does not stop the block, which the confirmation lets run on."""
    distlock.configure(lease=5.0, renew_interval=0.1)
    name = _name()

    async def body(ac: Any) -> None:
        lock = aio.DistLock(name, client=ac)
        async with lock.bound():
            session = lock._port().session
            session.watchdog.suspend("test: as if the connection was reset")
            for _ in range(int(BOUND / 0.02)):
                if lock.owned():
                    break
                await asyncio.sleep(0.02)
            assert lock.owned()  # confirmed, and the block was never cancelled
        _no_cancellation_pending()
    run(url, body)


@pytest.mark.skipif(sys.version_info < (3, 11), reason="Task.cancelling is 3.11+")
def test_a_cancellation_the_task_swallowed_before_does_not_hide_the_loss(
        url: str, client: redis.Redis) -> None:
    async def body(ac: Any) -> None:
        task = asyncio.current_task()
        assert task is not None
        task.cancel()
        try:
            await asyncio.sleep(1)
        except asyncio.CancelledError:
            pass  # swallowed, not uncancelled: the task keeps cancelling() == 1
        base = task.cancelling()
        lock = aio.DistLock(_name(), client=ac, max_hold=CAP)
        with pytest.raises(LockLostError):
            async with lock.bound():
                await asyncio.sleep(BOUND)
        assert task.cancelling() == base
    run(url, body)
