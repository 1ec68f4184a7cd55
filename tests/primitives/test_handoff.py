"""The in-process hand-off (docs/guides/locks.rst, "Hand-off in the process").

A default lock's release that frees the lock while a thread (or a task) of its own process
waits for it, and the lock would stay with the process anyway (its quantum, or nobody else
waits), hands the lock to that waiter in its own script: a new token, the waiter's owner and
lease. The waiter is woken in the process: no try of its own, no pub/sub.

Checked here against a real server:
- the hand-off itself, in both shells, on one server and on the cluster: one round trip, no
  PUBLISH, a larger token, the waiter the owner in Redis;
- the script's rule: never past another waiting process once the quantum is over, never
  past a fair waiter;
- the races: a hand-off that meets a wait as it ends (taken, or given back when the wait
  ended with an error), and one whose news was lost (the waiter's next try finds it its own);
- fairness: hand-offs within a process never lengthen its quantum, so a waiting process
  still gets its turn.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any, Dict, List, Optional

import pytest
import redis
from _procs import recv
from _support import previous_script

import distlock
import distlock.asyncio as aio
from distlock import DistLock, DistRLock
from distlock._redis import dispatcher
from distlock._session.session import session_for

pytestmark = pytest.mark.real_redis


def _calls(client: Any) -> Dict[str, int]:
    """Every command the server ran so far, by name (INFO commandstats), on every node."""
    if isinstance(client, redis.RedisCluster):
        merged: Dict[str, int] = {}
        for node in client.get_primaries():
            for k, v in client.info("commandstats", target_nodes=node).items():
                merged[k] = merged.get(k, 0) + int(v["calls"])
        return merged
    return {k: int(v["calls"]) for k, v in client.info("commandstats").items()}


def _delta(before: Dict[str, int], after: Dict[str, int], name: str) -> int:
    key = f"cmdstat_{name}"
    return after.get(key, 0) - before.get(key, 0)


def _waiting_here(client: Any, name: str) -> bool:
    """Whether a thread of this process waits for ``name`` (asleep on its channel, past a try)."""
    session = session_for(client)
    channel = DistLock(name, client=client)._keys.waiter_channel(session.id)
    board = session.dispatcher
    with board.mutex:
        chan = board.channels.get(channel)
        return chan is not None and any(w.taker is not None for w in chan.waiters)


def _queued(client: Any, name: str, n: int = 1) -> None:
    """Wait until ``n`` waiters of this process sleep on ``name``'s channel, each after its
    try (a taker is set by the try)."""
    session = session_for(client)
    channel = DistLock(name, client=client)._keys.waiter_channel(session.id)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        boards = session.dispatcher.boards().values() if hasattr(session.dispatcher, "boards") \
            else [session.dispatcher]
        for board in boards:
            with board.mutex:
                chan = board.channels.get(channel)
                if chan is not None and sum(w.taker is not None for w in chan.waiters) >= n:
                    return
        time.sleep(0.01)
    raise AssertionError(f"{n} waiters never queued on {name!r}")


@pytest.mark.cluster_too
@pytest.mark.parametrize("cls", [DistLock, DistRLock])
def test_a_release_hands_the_lock_to_a_thread_of_its_process(client: Any, cls: Any) -> None:
    """One round trip, the release's own: the waiting thread returns holding the lock, with a
    larger token, and nothing is published."""
    distlock.configure(wait_cap=60.0)  # only the hand-off can wake the waiter in time
    holder = cls("local", client=client, lease=60)
    assert holder.acquire()
    holder.release()  # the first run of each script loads it (NOSCRIPT): not what we count
    assert holder.acquire()
    first = holder.token
    got: List[Any] = []

    def waiter() -> None:
        lock = cls("local", client=client, lease=60)
        got.append(lock.acquire(timeout=60))
        got.append((lock.token, lock.owned()))
        done.wait(30)
        lock.release()

    done = threading.Event()
    thread = threading.Thread(target=waiter)
    thread.start()
    try:
        _queued(client, "local")
        time.sleep(0.1)  # past its try: asleep on its channel
        before = _calls(client)
        holder.release()
        deadline = time.monotonic() + 30
        while len(got) < 2 and time.monotonic() < deadline:
            time.sleep(0.005)
        after = _calls(client)
        assert got[0] is True
        token, owned = got[1]
        assert owned and token > first
        assert _delta(before, after, "evalsha") == 1  # the release alone
        assert _delta(before, after, "publish") + _delta(before, after, "spublish") == 0
        owners = [k for k in client.hkeys(holder._keys.lock) if not k.startswith(b":")]
        assert len(owners) == 1 and owners[0].decode().startswith(session_for(client).id)
    finally:
        done.set()
        thread.join(30)
    assert not client.exists(holder._keys.lock)


def test_a_release_hands_the_lock_to_a_task_of_its_loop(url: str) -> None:
    """The asyncio shell: tasks of one event loop hand the lock to each other the same way."""
    async def main() -> None:
        client = redis.asyncio.Redis.from_url(url)
        look = redis.Redis.from_url(url)
        try:
            distlock.configure(wait_cap=60.0)
            holder = aio.DistLock("local-aio", client=client, lease=60)
            assert await holder.acquire()
            await holder.release()  # the first run of each script loads it: not counted
            assert await holder.acquire()
            first = holder.token
            waiter = aio.DistLock("local-aio", client=client, lease=60)
            task = asyncio.ensure_future(waiter.acquire(timeout=60))
            await asyncio.sleep(0.3)  # it tried, and sleeps on its channel
            before = _calls(look)
            await holder.release()
            assert await asyncio.wait_for(task, 30) is True
            after = _calls(look)
            assert waiter.owned() and waiter.token > first
            assert _delta(before, after, "evalsha") == 1
            assert _delta(before, after, "publish") == 0
            await waiter.release()
            assert not look.exists(holder._keys.lock)
        finally:
            await client.aclose() if hasattr(client, "aclose") else await client.close()
            look.close()
    asyncio.run(main())


# --- the script's rule -------------------------------------------------------------------------

def _release_args(lock: Any, session: Any, how: str) -> Any:
    """lock_release's keys and args for ``lock``'s hold, handing to owner 'me:waiter'."""
    keys = lock._keys
    hold = lock._hold
    channel = keys.waiter_channel(session.id)
    return ((keys.lock, keys.queue, keys.fence, lock._fair_keys.deadlines),
            (hold.owner, hold.token, 1, how, "me:waiter", 60000, 120000, "host:1", 1, channel, "0"))


@pytest.mark.parametrize("how, foreign, handed", [
    ("y", False, True),   # nobody else waits: it stays in the process
    ("k", True, True),    # another process waits, but this one is in its quantum
    ("y", True, False),   # its quantum is over and another process waits: that one's turn
    ("", True, False),    # no yield rule (barge_limit=inf): the waiting process is woken
])
def test_the_release_hands_over_only_when_the_lock_stays_with_the_process(
        client: Any, how: str, foreign: bool, handed: bool) -> None:
    lock = DistLock("rule", client=client, lease=60)
    assert lock.acquire()
    session = session_for(client)
    keys = lock._keys
    now_ms = int(client.time()[0]) * 1000
    client.zadd(keys.queue, {keys.waiter_channel(session.id): now_ms + 60000})
    if foreign:
        client.zadd(keys.queue, {keys.waiter_channel("another-process"): now_ms + 60000})
    client.hset(keys.lock, ":w", 1)
    names, args = _release_args(lock, session, how)
    # read before the script runs: the hold it hands away behind the lock object's back may be
    # reported lost at once (the watchdog's read-back, renewal.check_round), and a lost hold
    # has no token
    token = lock.token
    reply = int(session.run("lock_release", names, args))
    if handed:
        assert reply <= -2
        assert int(client.hget(keys.lock, ":t")) == -1 - reply > token
        assert client.hget(keys.lock, "me:waiter") == b"1"
        assert 59000 < client.pttl(keys.lock) <= 60000
        # this process' entry went with its last waiter; another's stays
        assert client.zscore(keys.queue, keys.waiter_channel(session.id)) is None
        client.delete(keys.lock)
    else:
        assert reply == 0
        assert client.hget(keys.lock, "me:waiter") is None
    lock._forget(lock._hold)
    session.drop_hold(lock._hold) if lock._hold is not None else None
    client.delete(keys.lock, keys.queue)


def test_no_hand_over_past_a_fair_waiter(client: Any) -> None:
    """A free lock with live fair waiters is theirs first (docs/guides/locks.rst, mixed modes)."""
    lock = DistLock("rule-fair", client=client, lease=60)
    assert lock.acquire()
    session = session_for(client)
    now_ms = int(client.time()[0]) * 1000
    client.zadd(lock._fair_keys.deadlines, {"someone:nonce": now_ms + 60000})
    names, args = _release_args(lock, session, "k")
    assert int(session.run("lock_release", names, args)) == 0
    assert not client.exists(lock._keys.lock)
    hold = lock._hold
    lock._forget(hold)
    session.drop_hold(hold)
    client.delete(lock._fair_keys.deadlines)


def test_a_hand_off_whose_news_was_lost_is_the_waiters_at_its_next_try(client: Any) -> None:
    """The release's reply was lost after it handed the lock over: the waiter was not told.
    Its next try finds the hold its own (its owner, a token): granted, its lease lengthened
    to what it asks for, not refused for the lease's length."""
    lock = DistLock("news", client=client, lease=60)
    keys = lock._keys
    session = session_for(client)
    client.hset(keys.lock, mapping={"me:waiter": 1, ":t": 42, ":i": "host:1", ":l": 500, ":w": 1})
    client.pexpire(keys.lock, 500)
    channel = keys.waiter_channel(session.id)
    reply = session.run("lock_acquire", lock._acquire_keys,
                        ("me:waiter", 60000, 120000, "host:1", "w", 1, channel, 7000, "0"))
    assert int(reply) == 42
    assert client.pttl(keys.lock) > 59000
    assert client.zscore(keys.queue, channel) is None
    # someone else's try is still refused
    other = session.run("lock_acquire", lock._acquire_keys,
                        ("me:other", 60000, 120000, "host:1", "w", 1, channel, 7000, "0"))
    assert int(other) < 0
    client.delete(keys.lock, keys.queue)


# --- the races -------------------------------------------------------------------------------

def _hand_as_it_leaves(monkeypatch: Any, holder: Any, fail: bool,
                       deadline: Optional[float] = None) -> List[int]:
    """Make the waiter's wait end (its sleep returns, or raises if ``fail``) right after the
    holder's release, in another thread, handed it the lock: the hand-off meets a wait that
    is about to leave its queue. With ``deadline`` (monotonic), the first sleep first waits
    past it, so that the wait, woken with nothing, is out of time."""
    handed: List[int] = []
    real_sleep = dispatcher.Dispatcher.sleep

    def sleep(self: Any, waiter: Any, head_bound: float, limit: Any = None) -> bool:
        if not handed and waiter.taker is not None:
            if deadline is not None:
                time.sleep(max(0.0, deadline - time.monotonic()))
            t = threading.Thread(target=holder.release)
            t.start()
            t.join(30)
            handed.append(1)
            if fail:
                raise RuntimeError("interrupted as the lock was handed")
            return False  # as if the bound ran out: the wait is at its deadline
        return bool(real_sleep(self, waiter, head_bound, limit))

    monkeypatch.setattr(dispatcher.Dispatcher, "sleep", sleep)
    return handed


def test_a_wait_that_ends_as_the_lock_is_handed_takes_it(client: Any, monkeypatch: Any) -> None:
    """The hold was handed just as the wait ran out of time: it returns True, holding it."""
    holder = DistLock("race", client=client, lease=60)
    assert holder.acquire()
    # a timeout a loaded machine reaches the first sleep within (0.2 s did not, once, and
    # the wait ran out before anything was handed); the sleep waits it out
    timeout = 5.0
    handed = _hand_as_it_leaves(monkeypatch, holder, fail=False,
                                deadline=time.monotonic() + timeout + 0.05)
    waiter = DistLock("race", client=client, lease=60)
    assert waiter.acquire(timeout=timeout) is True
    assert handed and waiter.owned()
    assert int(client.hget(waiter._keys.lock, ":t")) == waiter.token
    waiter.release()
    assert not client.exists(waiter._keys.lock)


def test_a_wait_that_fails_as_the_lock_is_handed_gives_it_back(client: Any, monkeypatch: Any) -> None:
    """The wait ended with an error as the hold was handed: the error propagates, and the
    lock is given back at once (free for anyone, not held until its lease runs out)."""
    holder = DistLock("race-error", client=client, lease=60)
    assert holder.acquire()
    handed = _hand_as_it_leaves(monkeypatch, holder, fail=True)
    waiter = DistLock("race-error", client=client, lease=60)
    with pytest.raises(RuntimeError, match="interrupted"):
        waiter.acquire(timeout=10)
    assert handed and not waiter.owned()
    deadline = time.monotonic() + 10
    while client.exists(waiter._keys.lock) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not client.exists(waiter._keys.lock)
    rival = DistLock("race-error", client=client)
    assert rival.acquire(blocking=False)
    rival.release()


# --- fairness ---------------------------------------------------------------------------------

def _other_process(url: str, name: str, conn: Any) -> None:
    client = redis.Redis.from_url(url)
    lock = DistLock(name, client=client)
    conn.send("waiting")
    started = time.monotonic()
    ok = lock.acquire(timeout=20)
    conn.send((ok, time.monotonic() - started))
    if ok:
        lock.release()


def test_hand_offs_within_a_process_keep_its_quantum(url: str, client: Any, children: Any) -> None:
    """Two threads of this process take the lock in turns, handing it to each other; another
    process waits. Hand-offs never start a new quantum, so that process gets its turn once
    this one's quantum is over (about 1 s here), well within the 20 s it waits; the
    threads go on for 40 s unless it reports first (a quantum that each hand-off started again
    would keep the lock in this process all that time)."""
    name = "quantum"
    # quanta of 1 s (2 s shared by two processes): long against this machine's delays, short
    # against the other process' 20 s
    distlock.configure(barge_limit=2.0)
    stop = threading.Event()

    def loop() -> None:
        lock = DistLock(name, client=client)
        end = time.monotonic() + 40
        while not stop.is_set() and time.monotonic() < end:
            if lock.acquire(timeout=5):
                # release only once the other thread waits (or the test is over): every
                # release then has a thread of its own to hand the lock to
                while not stop.is_set() and not _waiting_here(client, name):
                    time.sleep(0.0005)
                lock.release()

    threads = [threading.Thread(target=loop) for _ in range(2)]
    for t in threads:
        t.start()
    try:
        time.sleep(0.5)  # the two are taking turns
        conn = children.start(_other_process, url, name)
        assert recv(conn) == "waiting"
        ok, _waited = recv(conn, 60)
        assert ok is True
    finally:
        stop.set()
        for t in threads:
            t.join(30)


# --- rolling upgrades -------------------------------------------------------------------------

def test_a_process_of_the_previous_release_never_gets_a_hold_it_does_not_believe(client: Any) -> None:
    """A rolling upgrade. A hand-off goes only to a thread of the releasing process, which runs
    this release by construction: a process still running the previous release (b49bc5c,
    tests/compat) is never handed anything. Whichever of the two gets the lock after the
    release (its waiting entry counts as another process's), Redis's owner is the one caller
    that believes it holds the lock: the previous release's try is refused while this
    release's waiter believes it holds the lock, and granted once that hold is given back."""
    acquire, release = previous_script("lock_acquire"), previous_script("lock_release")
    holder = DistLock("mixed", client=client, lease=60)
    keys = (holder._keys.lock, holder._keys.fence, holder._keys.queue)
    old_channel = holder._keys.waiter_channel("previous-release")

    def old_try() -> int:  # a queued waiter's try, as the previous release sends it
        return int(client.eval(acquire, 3, *keys, "old:1", 30000, "h:old", "w", "1", old_channel, 30000))

    def owners() -> List[bytes]:
        return [k for k in client.hkeys(keys[0]) if not k.startswith(b":")]

    assert holder.acquire()
    first = holder.token
    assert old_try() < 0  # refused, and now registered as a waiting process
    got: List[Any] = []
    done = threading.Event()

    def waiter() -> None:
        lock = DistLock("mixed", client=client, lease=60)
        got.append(lock.acquire(timeout=30))
        got.append((lock.token, lock.owned(), lock._current(lock._session()).owner))
        done.wait(30)
        if lock.owned():
            lock.release()

    thread = threading.Thread(target=waiter)
    thread.start()
    try:
        _queued(client, "mixed")
        holder.release()  # another process is registered: no hand-over outside a quantum
        token = old_try()
        if token > 0:
            # the previous release's process got it: this release's waiter must not believe
            assert owners() == [b"old:1"] and not got
            assert int(client.eval(release, 2, keys[0], keys[2], "old:1", token)) == 0
        deadline = time.monotonic() + 30
        while len(got) < 2 and time.monotonic() < deadline:
            time.sleep(0.005)
        assert got and got[0] is True, "this release's waiter never got the lock"
        new_token, owned, owner = got[1]
        assert owned and new_token > max(token, first)
        assert owners() == [owner.encode()]  # the one that believes is Redis's owner
        assert old_try() < 0  # refused while it believes
    finally:
        done.set()
        thread.join(30)
    # Given back. The release may first keep the lock for the next waiting process (the yield
    # rule's short reservation), which the previous release reads as held: its next try
    # after the reservation ends gets it.
    deadline = time.monotonic() + 20
    while (token := old_try()) < 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert token > new_token and owners() == [b"old:1"]
    assert int(client.eval(release, 2, keys[0], keys[2], "old:1", token)) == 0
    client.delete(keys[2])
