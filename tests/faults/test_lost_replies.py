"""A state change whose reply was lost is reconciled by reading state, never by sending the
script again (docs/design.rst, principle 13), in both shells. The failpoints
(``distlock.testing.failpoints``) run a script on the server and then lose its reply, or make
it too late.

The regression: a re-entry (``HINCRBY`` on the hold) whose reply was lost left Redis one level
deeper than the caller's count; after the caller's balanced releases the hold stayed, owned()
stayed True and the watchdog renewed it until the process exited.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any, Callable, Dict, Tuple

import faults
import pytest
import redis
from _aio import run_in_loop

import distlock
import distlock.asyncio as aio
from distlock.testing.failpoints import LATE, LOST, arm

pytestmark = pytest.mark.real_redis


def _name() -> str:
    return f"lost-{uuid.uuid4().hex[:10]}"


#: kind -> (how to make it in the blocking shell, in the asyncio one, the re-entry's script
#: and which call of that script it is, the key of its hold)
KINDS: Dict[str, Tuple[Callable[..., Any], Callable[..., Any], Tuple[str, int], Callable[[str], str]]] = {
    "DistRLock": (lambda n, c: distlock.DistRLock(n, client=c),
                  lambda n, c: aio.DistRLock(n, client=c),
                  ("lock_acquire", 2), lambda n: f"distlock:{{{n}}}"),
    # a fair lock's grant is fair_acquire's; its re-entry is lock_acquire's
    "DistRLock.fair": (lambda n, c: distlock.DistRLock(n, client=c, fair=True),
                       lambda n, c: aio.DistRLock(n, client=c, fair=True),
                       ("lock_acquire", 1), lambda n: f"distlock:{{{n}}}"),
    "DistWriteLock": (lambda n, c: distlock.DistReadWriteLock(n, client=c).write_lock(),
                      lambda n, c: aio.DistReadWriteLock(n, client=c).write_lock(),
                      ("rw_write_acquire", 2), lambda n: f"distlock:{{{n}}}:rw:w"),
}


def _depth(client: redis.Redis, key: str) -> int:
    """The reentrancy count Redis keeps for the one owner of hold ``key`` (0: no hold)."""
    fields = {k.decode(): v for k, v in client.hgetall(key).items()}
    counts = [int(v) for k, v in fields.items() if not k.startswith(":")]
    return counts[0] if counts else 0


@pytest.mark.parametrize("how", [LOST, LATE])
@pytest.mark.parametrize("kind", sorted(KINDS))
def test_a_reentry_whose_reply_was_lost_does_not_leak_the_lock(client: redis.Redis, how: str,
                                                               kind: str) -> None:
    make, _, (script, nth), key_of = KINDS[kind]
    name = _name()
    lock = make(name, client)
    points = arm(lock)
    points.fail(script, nth, how)  # the re-entry: it runs, then its reply is lost
    with points.active():
        assert lock.acquire()
        with pytest.raises((redis.ConnectionError, redis.TimeoutError)):
            lock.acquire()
    assert [c.kind for c in points.counted(script)][-1] == how
    # The re-entry raised, so the caller holds one level, and Redis agrees. A lost reply is a
    # reset connection: the hold is not believed until the renewal round that the reset starts
    # confirms it (the belief rule), which it does at once.
    assert _depth(client, key_of(name)) == 1
    assert faults.wait_until(lock.owned, 10)
    lock.release()  # balanced
    assert not lock.owned()
    assert not client.exists(key_of(name))
    other = make(name, distlock_client(client))
    assert other.acquire(blocking=False)  # free now, not after the process exits
    other.release()


@pytest.mark.parametrize("how", [LOST, LATE])
@pytest.mark.parametrize("kind", sorted(KINDS))
def test_an_async_reentry_whose_reply_was_lost_does_not_leak_the_lock(url: str, client: redis.Redis,
                                                                      how: str, kind: str) -> None:
    _, make, (script, nth), key_of = KINDS[kind]
    name = _name()

    async def body(ac: Any) -> None:
        lock = make(name, ac)
        points = arm(lock)
        points.fail(script, nth, how)
        with points.active():
            assert await lock.acquire()
            with pytest.raises((redis.ConnectionError, redis.TimeoutError)):
                await lock.acquire()
        assert _depth(client, key_of(name)) == 1
        assert await _confirmed(lock, 10)  # as above: the reset's renewal round confirms it
        await lock.release()
        assert not lock.owned()
        assert not client.exists(key_of(name))

    run_in_loop(url, body, 20.0, f"lost-{uuid.uuid4().hex[:6]}")
    other = KINDS[kind][0](name, distlock_client(client))
    assert other.acquire(blocking=False)
    other.release()


async def _confirmed(lock: Any, within: float) -> bool:
    """Whether ``lock.owned()`` comes back True within ``within`` seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while not lock.owned():
        if loop.time() > deadline:
            return False
        await asyncio.sleep(0.01)
    return True


def distlock_client(client: redis.Redis) -> redis.Redis:
    """Another client of the same server, with a session of its own (another process)."""
    kwargs = client.connection_pool.connection_kwargs
    return redis.Redis(host=kwargs["host"], port=kwargs["port"],
                       client_name=f"other-{uuid.uuid4().hex[:6]}")


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_a_lost_reentry_that_cannot_be_read_either_is_given_back_by_the_last_release(
        client: redis.Redis, monkeypatch: pytest.MonkeyPatch, kind: str) -> None:
    """The re-entry's reply is lost and so is the read that would tell whether it ran (the
    server is out of reach a moment): the levels stay in doubt, and the caller's last release,
    whose reply shows the surplus, gives it back."""
    make, _, (script, nth), key_of = KINDS[kind]
    name = _name()
    lock = make(name, client)
    points = arm(lock)
    points.fail(script, nth, LOST)
    executor = lock._session().executor
    reads = executor.read

    def read_fails_once(*command: Any) -> Any:
        monkeypatch.setattr(executor, "read", reads)
        raise redis.ConnectionError("the read was lost too (injected)")

    with points.active():
        assert lock.acquire()
        monkeypatch.setattr(executor, "read", read_fails_once)
        with pytest.raises(redis.ConnectionError):
            lock.acquire()
    assert executor.read is reads  # the read was tried, and failed
    assert _depth(client, key_of(name)) == 2  # one level more than the caller counts
    lock.release()
    assert not lock.owned()
    assert not client.exists(key_of(name))


#: a wait whose first try's reply is lost, in both shells: (the primitive, made on a client,
#: and the rival state that makes it wait; the script of its first try; the entry that try
#: left, which must be taken off at once, not left for its whole entry lease: 61 s here)
WAITS: Dict[str, Tuple[Callable[..., Any], Callable[..., Any], Callable[[Any], Any], str, str]] = {
    "DistEvent": (lambda n, c: distlock.DistEvent(n, client=c), lambda n, c: aio.DistEvent(n, client=c),
                  lambda rival: None, "ev_wait", ":ev:w"),
    "DistSemaphore": (lambda n, c: distlock.DistSemaphore(n, 1, client=c),
                      lambda n, c: aio.DistSemaphore(n, 1, client=c),
                      lambda rival: rival.acquire(), "sem_acquire", ":sem:q"),
    "DistWriteLock": (lambda n, c: distlock.DistReadWriteLock(n, client=c).write_lock(),
                      lambda n, c: aio.DistReadWriteLock(n, client=c).write_lock(),
                      lambda rival: rival.acquire(), "rw_write_acquire", ":rw:q"),
}


def _gone(client: redis.Redis, key: str, within: float) -> bool:
    deadline = time.monotonic() + within
    while client.exists(key):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


@pytest.mark.parametrize("how", [LOST, LATE])
@pytest.mark.parametrize("kind", sorted(WAITS))
def test_a_wait_whose_first_reply_was_lost_leaves_no_entry_behind(client: redis.Redis, url: str,
                                                                   kind: str, how: str) -> None:
    """The first try of a wait ran (it queued the waiter) and its reply was lost: the wait
    raises at once, and the entry it made is taken off by the session's chores worker, not
    left to run out (an entry lease is 61 s with the default settings), in both shells."""
    make, amake, hold, script, suffix = WAITS[kind]
    name = _name()
    other = distlock_client(client)
    rival = make(name, other)
    hold(rival)
    try:
        waiter = make(name, client)
        points = arm(waiter)
        points.fail(script, 1, how)
        with points.active():
            with pytest.raises((redis.ConnectionError, redis.TimeoutError)):
                waiter.acquire(timeout=5) if kind != "DistEvent" else waiter.wait(timeout=5)
        assert _gone(client, f"distlock:{{{name}}}{suffix}", 20.0), "the entry was left to run out"

        async def body(aclient: Any) -> None:
            awaiter = amake(name, aclient)
            apoints = arm(awaiter)
            apoints.fail(script, 1, how)
            with apoints.active():
                with pytest.raises((redis.ConnectionError, redis.TimeoutError)):
                    await (awaiter.acquire(timeout=5) if kind != "DistEvent" else awaiter.wait(timeout=5))
        run_in_loop(url, body)
        assert _gone(client, f"distlock:{{{name}}}{suffix}", 20.0), "the entry was left to run out (asyncio)"
    finally:
        if kind != "DistEvent":
            rival.release()
        other.close()
