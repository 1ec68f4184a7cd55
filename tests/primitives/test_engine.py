"""Finding 6: one wait engine under every primitive, one way out of every wait.

Before Core v2 each of six modules had its own wait loop, and each cleaned up differently (or
not at all) when a wait was interrupted. Now every wait runs ``_core.wait_policy.policy`` through
``_primitives.engine.wait``; these tests show that every primitive goes through it, and that a
KeyboardInterrupt in the middle of a wait leaves no waiter of this process behind: not in the
session's pub/sub channels, not in Redis (where a queue entry would keep other processes
waiting, or waking this one, for nothing).
"""

from __future__ import annotations

import functools
import threading
from typing import Any, Callable, Dict, Iterator, List, Tuple

import pytest
import redis

from distlock import (
    DistBarrier,
    DistCondition,
    DistEvent,
    DistLock,
    DistReadWriteLock,
    DistRLock,
    DistSemaphore,
)
from distlock._primitives import engine as _engine
from distlock._redis.dispatcher import Dispatcher

Setup = Callable[[redis.Redis, redis.Redis, str], Tuple[Callable[[float], Any], Any, Callable[[], None]]]


def _lock(kind: Any) -> Setup:
    def setup(mine: redis.Redis, theirs: redis.Redis, name: str) -> Tuple[Any, Any, Any]:
        holder, waiter = kind(name, client=theirs), kind(name, client=mine)
        holder.acquire()
        return (lambda t: waiter.acquire(timeout=t)), waiter, holder.release
    return setup


def _rw(side: str) -> Setup:
    def setup(mine: redis.Redis, theirs: redis.Redis, name: str) -> Tuple[Any, Any, Any]:
        holder = DistReadWriteLock(name, client=theirs)
        held = holder.write_lock() if side == "read" else holder.read_lock()
        held.acquire()
        rw = DistReadWriteLock(name, client=mine)
        waiter = rw.read_lock() if side == "read" else rw.write_lock()
        return (lambda t: waiter.acquire(timeout=t)), waiter, held.release
    return setup


def _semaphore(mine: redis.Redis, theirs: redis.Redis, name: str) -> Tuple[Any, Any, Any]:
    holder, waiter = DistSemaphore(name, 1, client=theirs), DistSemaphore(name, 1, client=mine)
    holder.acquire()
    return (lambda t: waiter.acquire(timeout=t)), waiter, holder.release


def _event(mine: redis.Redis, theirs: redis.Redis, name: str) -> Tuple[Any, Any, Any]:
    event = DistEvent(name, client=mine)
    return event.wait, event, lambda: None


def _condition(mine: redis.Redis, theirs: redis.Redis, name: str) -> Tuple[Any, Any, Any]:
    cond = DistCondition(name, client=mine)

    def waiting(t: float) -> Any:
        with cond:
            return cond.wait(t)
    return waiting, cond, lambda: None


def _barrier(mine: redis.Redis, theirs: redis.Redis, name: str) -> Tuple[Any, Any, Any]:
    barrier = DistBarrier(name, 2, client=mine)

    def waiting(t: float) -> Any:
        try:
            return barrier.wait(t)
        except threading.BrokenBarrierError:
            return "broken"
    return waiting, barrier, barrier.reset


PRIMITIVES: Dict[str, Setup] = {
    "DistLock": _lock(DistLock),
    "DistRLock": _lock(DistRLock),
    "DistLock.fair": _lock(functools.partial(DistLock, fair=True)),
    "DistReadLock": _rw("read"),
    "DistWriteLock": _rw("write"),
    "DistSemaphore": _semaphore,
    "DistEvent": _event,
    "DistCondition": _condition,
    "DistBarrier": _barrier,
}
TIMED_OUT = {"DistBarrier": "broken", "DistCondition": False}


@pytest.fixture
def pair(backend: Any, client: redis.Redis) -> Iterator[Tuple[redis.Redis, redis.Redis]]:
    """Two clients with sessions of their own: two "processes". ``client`` cleans up after
    the test (keys, sessions, threads), as for every other test."""
    mine, theirs = backend.client(), backend.client()
    yield mine, theirs
    mine.close()
    theirs.close()


@pytest.mark.parametrize("kind", list(PRIMITIVES))
def test_every_primitive_waits_through_the_one_engine(
        kind: str, pair: Tuple[redis.Redis, redis.Redis], monkeypatch: pytest.MonkeyPatch) -> None:
    mine, theirs = pair
    calls: List[Any] = []
    real = _engine.policy

    def spy(*args: Any, **kwargs: Any) -> Any:
        calls.append(args)
        return real(*args, **kwargs)

    monkeypatch.setattr(_engine, "policy", spy)
    wait, _, cleanup = PRIMITIVES[kind](mine, theirs, f"engine:{kind}")
    try:
        assert wait(0.2) == TIMED_OUT.get(kind, False)
    finally:
        cleanup()
    assert len(calls) == 1


def _our_entries(client: redis.Redis, name: str, session_id: str) -> List[Tuple[str, bytes]]:
    """Members of the name's sorted sets that belong to the session ``session_id``."""
    found = []
    for key in client.scan_iter(match=f"distlock:{{{name}}}*"):
        if client.type(key) == b"zset":
            found += [(key.decode(), m) for m in client.zrange(key, 0, -1) if session_id.encode() in m]
    return found


@pytest.mark.parametrize("kind", list(PRIMITIVES))
def test_an_interrupted_wait_leaves_nothing_behind(
        kind: str, pair: Tuple[redis.Redis, redis.Redis], monkeypatch: pytest.MonkeyPatch) -> None:
    """KeyboardInterrupt in the middle of a wait (here: raised from its sleep) propagates, and
    the waiter is gone from this process' channels and from every queue in Redis (the
    semaphore's waiter takes its own queue entry off with a ZREM, not a try)."""
    mine, theirs = pair
    name = f"interrupted:{kind}"

    def interrupted(self: Any, waiter: Any, bound: float, limit: Any = None) -> bool:
        raise KeyboardInterrupt

    wait, primitive, cleanup = PRIMITIVES[kind](mine, theirs, name)
    session = primitive._session()
    monkeypatch.setattr(Dispatcher, "sleep", interrupted)
    try:
        with pytest.raises(KeyboardInterrupt):
            wait(5.0)
        assert all(not chan.waiters for chan in session.dispatcher.channels.values())
        left = _our_entries(mine, name, session.id)
        assert left == []
        if kind == "DistBarrier":
            assert primitive.broken  # the generation could not complete: broken at once
    finally:
        monkeypatch.undo()
        cleanup()


@pytest.mark.parametrize("kind", ["DistLock", "DistEvent"])
def test_a_wait_interrupted_while_it_subscribes_leaves_no_waiter(
        kind: str, pair: Tuple[redis.Redis, redis.Redis], monkeypatch: pytest.MonkeyPatch) -> None:
    """Ctrl-C while the waiter subscribes (before the engine has it in hand): the dispatcher
    takes it off its queue itself, so the process is not left 'waiting' for ever (its pub/sub
    thread would never go idle, and its session never retire)."""
    mine, theirs = pair
    wait, primitive, cleanup = PRIMITIVES[kind](mine, theirs, f"subscribe-interrupted:{kind}")
    session = primitive._session()

    real = redis.client.PubSub.subscribe
    me = threading.current_thread()

    def interrupted(self: Any, *channels: Any, **kwargs: Any) -> Any:
        if threading.current_thread() is me:  # not in the dispatcher's own thread
            raise KeyboardInterrupt
        return real(self, *channels, **kwargs)

    monkeypatch.setattr(redis.client.PubSub, "subscribe", interrupted)
    try:
        with pytest.raises(KeyboardInterrupt):
            wait(5.0)
        assert not session.dispatcher.busy()
        assert all(not chan.waiters and chan.refs == 0 for chan in session.dispatcher.channels.values())
    finally:
        monkeypatch.undo()
        cleanup()
