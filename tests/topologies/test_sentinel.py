"""distlock through Redis Sentinel: ``Sentinel(...).master_for(service)`` clients and
``redis+sentinel://`` URLs, in both shells, on a real set of one master, two replicas and three
sentinels (distlock/testing/sentinel.py), through SIGKILLed masters and their failovers.

The contract suites run through a Sentinel client too (tests/primitives/test_contract.py's ``@sentinel``
lock types). Timing is asserted only as generous bounds.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
import time
import uuid
from typing import Any, Callable, Dict, List, Optional, Tuple

import pytest
import redis
import redis.asyncio.sentinel
import redis.sentinel
from _procs import SPAWN
from _support import collect_garbage

import distlock
import distlock.asyncio as aio
from distlock import DistLock, DistSemaphore
from distlock._redis.clients import renewer, shareable
from distlock._redis.urls import async_client_from_url, check_url, client_from_url, sentinel_url
from distlock._session.config import resolve_async_client
from distlock.testing.sentinel import SentinelSet, aclose_sentinel, close_sentinel

#: The loosest upper bound on anything that should be quick: only a hang fails it.
BOUND = 30.0


def _name(prefix: str) -> str:
    return f"sn:{prefix}:{uuid.uuid4().hex[:10]}"


def _lock_key(name: str) -> str:
    return f"distlock:{{{name}}}"


def _until(check: Callable[[], Any], bound: float) -> bool:
    deadline = time.monotonic() + bound
    while not check() and time.monotonic() < deadline:
        time.sleep(0.02)
    return bool(check())


def _replicated(sentinel_set: SentinelSet) -> None:
    """Every write so far reached both replicas (WAIT on the master)."""
    master = sentinel_set.node_client(sentinel_set.master_addr())
    try:
        assert master.execute_command("WAIT", SentinelSet.REPLICAS, 5000) == SentinelSet.REPLICAS
    finally:
        master.close()


# --- URLs (no I/O) ----------------------------------------------------------------------------

def test_a_sentinel_url_is_parsed_without_io() -> None:
    parsed = sentinel_url("redis+sentinel://u:secret@h1:26380,h2,[::1]:5000/orders/3"
                          "?socket_timeout=2&sentinel_password=sp")
    assert parsed is not None
    assert parsed.sentinels == [("h1", 26380), ("h2", 26379), ("[::1]", 5000)]
    assert parsed.service == "orders"
    assert parsed.kwargs["db"] == 3
    assert parsed.kwargs["username"] == "u" and parsed.kwargs["password"] == "secret"
    assert parsed.kwargs["socket_timeout"] == 2.0
    assert "sentinel_password" not in parsed.kwargs
    assert parsed.sentinel_kwargs == {"socket_timeout": 2.0, "password": "sp"}
    tls = sentinel_url("rediss+sentinel://h1/orders")
    assert tls is not None and tls.kwargs["ssl"] is True and tls.sentinel_kwargs["ssl"] is True
    assert sentinel_url("redis://h1/0") is None
    assert sentinel_url("redis+cluster://h1:7000/") is None


@pytest.mark.parametrize("url,words", [
    ("redis+sentinel://h1:26379", "names its service"),
    ("redis+sentinel://h1:26379/", "names its service"),
    ("redis+sentinel://h1:port/orders", "host[:port]"),
    ("redis+sentinel://h1,,h2/orders", "host[:port]"),
    ("redis+sentinel:///orders", "host[:port]"),
    ("redis+sentinel://h1/orders/zero", "db is a number"),
])
def test_a_bad_sentinel_url_is_a_clear_value_error(url: str, words: str) -> None:
    with pytest.raises(ValueError) as caught:
        check_url(url)
    assert words in str(caught.value)
    assert not str(caught.value).endswith(".")
    with pytest.raises(ValueError):
        DistLock("x", client=url)
    with pytest.raises(ValueError):
        distlock.configure(url)


def test_a_sentinel_url_makes_master_clients_of_both_shells() -> None:
    url = "redis+sentinel://127.0.0.1:1,127.0.0.1:2/orders/2?socket_timeout=3"
    client = client_from_url(url)
    try:
        pool = client.connection_pool
        assert isinstance(pool, redis.sentinel.SentinelConnectionPool) and pool.is_master
        assert pool.service_name == "orders"
        assert pool.connection_kwargs["db"] == 2 and pool.connection_kwargs["socket_timeout"] == 3.0
        ports = [s.connection_pool.connection_kwargs["port"] for s in pool.sentinel_manager.sentinels]
        assert ports == [1, 2]
        assert not shareable(client)  # a session of its own: its master moves
    finally:
        client.close()
    aclient = async_client_from_url(url)
    assert isinstance(aclient.connection_pool, redis.asyncio.sentinel.SentinelConnectionPool)
    assert aclient.connection_pool.service_name == "orders"
    # a caller's timeouts reach the sentinels too (the CLI's connect timeout), unless the URL
    # sets them
    client = client_from_url(url, socket_connect_timeout=7)
    try:
        kwargs = client.connection_pool.sentinel_manager.sentinels[0].connection_pool.connection_kwargs
        assert kwargs["socket_connect_timeout"] == 7 and kwargs["socket_timeout"] == 3.0
    finally:
        client.close()


# --- the client and its twins -----------------------------------------------------------------

def test_the_watchdogs_twin_is_a_sentinel_client_of_its_own(sentinel_set: SentinelSet,
                                                            sentinel_client: Any) -> None:
    """The watchdog renews through a master client of the same Sentinel and service, on a pool
    of its own, bounded by the renew interval and without retries; it finds the master."""
    twin = renewer(sentinel_client, 2.0)
    assert twin is not None
    try:
        pool = twin.connection_pool
        assert isinstance(pool, redis.sentinel.SentinelConnectionPool)
        assert pool is not sentinel_client.connection_pool
        assert pool.sentinel_manager is sentinel_client.connection_pool.sentinel_manager
        assert pool.service_name == sentinel_client.connection_pool.service_name
        assert pool.connection_kwargs["socket_timeout"] == 2.0
        assert twin.ping() is True
        assert pool.master_address == sentinel_set.master_addr()
    finally:
        twin.close()


def test_every_primitive_works_through_a_sentinel_client(sentinel_client: Any) -> None:
    client = sentinel_client
    name = _name("all")  # one name per kind (a name is one lock: docs/guides/kinds.rst)
    with distlock.DistLock(name, client=client), distlock.DistRLock(name + "r", client=client):
        pass
    rw = distlock.DistReadWriteLock(name + ":rw", client=client)
    with rw.read_lock():
        pass
    with rw.write_lock():
        pass
    sem = distlock.DistBoundedSemaphore(name + ":sem", 2, client=client)
    assert sem.acquire() and sem.acquire() and not sem.acquire(blocking=False)
    sem.release()
    sem.release()
    event = distlock.DistEvent(name + ":event", client=client)
    threading.Timer(0.2, event.set).start()
    assert event.wait(BOUND)
    cond = distlock.DistCondition(name, client=client)
    with cond:
        assert cond.wait_for(lambda: True, 1)
    barrier = distlock.DistBarrier(name + ":barrier", 2, client=client)
    results: List[int] = []
    helper = threading.Thread(target=lambda: results.append(barrier.wait(BOUND)))
    helper.start()
    results.append(barrier.wait(BOUND))
    helper.join(BOUND)
    assert sorted(results) == [0, 1]


async def _aclose(aclient: Any) -> None:
    """Close an asyncio Sentinel master client and its Sentinel, once distlock's reader task
    has ended (as tests/support/_aio.py's run_in_loop does: a client closed under a live reader task
    once left asyncio.run's shutdown spinning)."""
    for _ in range(250):
        if len(asyncio.all_tasks()) <= 1:
            break
        await asyncio.sleep(0.02)
    await aclient.aclose()
    await aclose_sentinel(aclient.connection_pool.sentinel_manager)


def test_a_sentinel_url_serves_both_shells(sentinel_set: SentinelSet, sentinel_url: str) -> None:
    """The same lock through a redis+sentinel:// URL in both shells: they exclude each other."""
    name = _name("url")
    lock = DistLock(name, client=sentinel_url)
    assert lock.acquire()

    async def body() -> Tuple[bool, bool]:
        alock = aio.DistLock(name, client=sentinel_url)
        first = await alock.acquire(timeout=0.2)
        lock.release()
        second = await alock.acquire(timeout=BOUND)
        await alock.release()
        await _aclose(resolve_async_client(sentinel_url))  # the URL's client in this loop
        return first, second

    assert asyncio.run(body()) == (False, True)
    distlock.configure(sentinel_url)
    other = sentinel_set.client()
    try:
        with DistLock(name):
            assert DistLock(name, client=other).locked()
    finally:
        other.close()


def test_asyncio_sentinel_clients_work_and_keep_holds_in_a_blocking_twin(
        sentinel_set: SentinelSet, sentinel_client: Any) -> None:
    """``redis.asyncio.sentinel.Sentinel(...).master_for(...)`` in the asyncio shell: its
    holds live in a blocking Sentinel twin of the same sentinels and service."""
    name = _name("aio")

    async def body() -> None:
        aclient = sentinel_set.aclient()
        try:
            lock = aio.DistLock(name, client=aclient)
            sem = aio.DistSemaphore(name + ":sem", 2, client=aclient)  # a name is one lock
            async with lock:
                assert DistLock(name, client=sentinel_client).locked()
                async with sem:
                    assert await sem.acquire(timeout=0.5)
                    assert not await sem.acquire(timeout=0.1)
                    await sem.release()
            from distlock._session.ports import port_for

            twin = port_for(aclient).twin
            assert isinstance(twin.connection_pool, redis.sentinel.SentinelConnectionPool)
            assert twin.connection_pool.service_name == aclient.connection_pool.service_name
        finally:
            await _aclose(aclient)

    asyncio.run(body())


def test_a_replica_client_is_refused_with_a_clear_type_error(sentinel_set: SentinelSet) -> None:
    """``slave_for`` clients cannot take a lock (a replica refuses every write): TypeError at
    construction, in both shells."""
    manager = redis.sentinel.Sentinel(sentinel_set.sentinel_addrs)
    replica = manager.slave_for("distlock")
    try:
        with pytest.raises(TypeError, match="master_for"):
            DistLock("x", client=replica)
        with pytest.raises(TypeError, match="master_for"):
            distlock.configure(replica)
    finally:
        replica.close()
        close_sentinel(manager)
    amanager = redis.asyncio.sentinel.Sentinel(sentinel_set.sentinel_addrs)
    with pytest.raises(TypeError, match="master_for"):
        aio.DistLock("x", client=amanager.slave_for("distlock"))


def test_a_dispatcher_whose_client_is_gone_exits_quietly(sentinel_set: SentinelSet,
                                                         sentinel_client: Any) -> None:
    """A Sentinel client's session talks through a weak proxy of it. Closed and collected
    while its dispatcher still runs (idle, not yet unsubscribed), the dispatcher's reconnect
    finds it gone: the thread exits, with no exception."""
    name = _name("gone")
    holder = DistLock(name, client=sentinel_client)
    assert holder.acquire()
    other = sentinel_set.client()
    waiter = DistLock(name, client=other)
    assert waiter.acquire(timeout=0.2) is False  # it subscribed, through other's session
    tag = waiter._session().id[:8]
    threads = [t for t in threading.enumerate() if t.name == f"distlock-pubsub-{tag}"]
    assert threads and threads[0].is_alive()
    pool = other.connection_pool
    del waiter, other
    collect_garbage()
    pool.disconnect()  # breaks the dispatcher's connection: it reconnects through the proxy
    threads[0].join(BOUND)
    assert not threads[0].is_alive()
    holder.release()


# --- failover ---------------------------------------------------------------------------------

def _held(client: Any, prefix: str, lease: float, renew_interval: float) -> Tuple[Any, List[float]]:
    distlock.configure(lease=lease, renew_interval=renew_interval)
    lock = DistLock(_name(prefix), client=client)
    lost_at: List[float] = []
    lock.on_lost(lambda _: lost_at.append(time.monotonic()))
    assert lock.acquire()
    return lock, lost_at


def _waiting(client: Any, name: str) -> bool:
    """Whether a process waits for lock ``name``: its wake-up channel is subscribed."""
    return bool(client.pubsub_channels(f"distlock:{{{name}}}:wake:*"))


def _try(lock: Any, timeout: float) -> bool:
    """One bounded acquire during a failover: an error (no master yet, or the old one) counts
    as not acquired; it must come back within its bound and a generous slack."""
    started = time.monotonic()
    try:
        got = bool(lock.acquire(timeout=timeout))
    except (redis.ConnectionError, redis.TimeoutError, redis.ResponseError):
        got = False
    assert time.monotonic() - started < timeout + 5.0, "an acquire waited past its bound"
    return got


def _renewed(master: Any, key: str, bound: float) -> bool:
    """Whether a renewal reaches ``key`` on ``master`` within ``bound`` seconds: its TTL goes
    up between two reads. (Not "above the first read": a first read made right after a
    renewal is the highest the TTL ever gets, and a CI run met exactly that.)"""
    deadline = time.monotonic() + bound
    last = master.pttl(key)
    while time.monotonic() < deadline:
        time.sleep(0.02)
        now = master.pttl(key)
        if now > last:
            return True
        last = now
    return False


def test_a_replicated_hold_survives_the_failover_and_its_renewals_follow_the_master(
        sentinel_set: SentinelSet, sentinel_client: Any) -> None:
    """SIGKILL the master under a held lock that both replicas have, with a lease longer than
    the failover: the hold survives, the watchdog renews it on the promoted master, no rival
    gets it meanwhile, a waiter waits through the failover (its pub/sub connection follows
    the master) and gets the lock when it is released on the new master."""
    client = sentinel_client
    other, third = sentinel_set.client(), sentinel_set.client()
    try:
        lock, lost_at = _held(client, "kept", 8.0, 0.5)
        key = _lock_key(lock.name)
        _replicated(sentinel_set)
        waiter = DistLock(lock.name, client=third)
        outcome: List[Any] = []

        def wait() -> None:
            started = time.monotonic()
            try:
                outcome.append(waiter.acquire(timeout=25.0))
            except redis.RedisError as exc:
                outcome.append(exc)
            outcome.append(time.monotonic() - started)

        thread = threading.Thread(target=wait)
        thread.start()
        assert _until(lambda: _waiting(third, lock.name), 5)
        old, new = sentinel_set.kill_master()
        assert new != old
        rival = DistLock(lock.name, client=other)
        assert not _try(rival, 0.5)
        # renewals land on the new master: the key's TTL is refreshed there
        master = sentinel_set.node_client(new)
        try:
            assert master.exists(key)
            assert _renewed(master, key, 10.0), "no renewal on the new master"
            assert not lost_at and lock.owned()
            assert not outcome or outcome[0] is not True, "a second holder: the waiter"
            if not outcome:  # still waiting: its pub/sub connection followed the master
                assert _until(lambda: _waiting(master, lock.name), 10), \
                    "the waiter's subscription is not on the new master"
            lock.release()
            thread.join(BOUND)
            assert outcome and outcome[1] < 25.0 + 5.0, "the waiter waited past its bound"
            if outcome[0] is not True:
                # its try met the dead master before the sentinels named the new one: an
                # error at once (as on a cluster), never a silent False
                assert isinstance(outcome[0], redis.ConnectionError), outcome
                assert waiter.acquire(timeout=BOUND)
            waiter.release()
        finally:
            master.close()
    finally:
        other.close()
        third.close()


def double_grant(sentinel_set: SentinelSet, **lock_kwargs: Any) -> Dict[str, Any]:
    """The double grant that asynchronous replication allows, made deterministic: cut both
    replicas' link to the master and stop them (``cut_replicas``), grant a DistLock (with
    ``lock_kwargs``) on the master, SIGKILL it before the replicas hear of the grant, resume
    them and wait for the promotion; then a second client asks for the same lock.

    Returns what happened: ``granted`` (the first acquire's result, or the DistLockError it
    raised), ``second`` (whether the second client got the lock on the promoted master),
    ``double`` (both: two holders at once), and, when the first was granted, ``lost`` (whether
    its holder was told, ``on_lost``, by the time the second holds) and ``release`` (what its
    release did: "ok" or the exception type's name). With ``min_replicas`` equal to the number
    of replicas the grant must fail (``NotEnoughReplicasError``: the replicas are stopped) or
    survive the promotion: ``double`` is then False. The replicas stay stopped for the whole
    acquire: keep its ``replica_timeout`` well under a second (the sentinels' down-after),
    or the promotion waits for the sentinels to see them again."""
    first, second = sentinel_set.client(), sentinel_set.client()
    name = _name("double")
    result: Dict[str, Any] = {}
    try:
        lock = DistLock(name, client=first, **lock_kwargs)
        lost: List[float] = []
        lock.on_lost(lambda _: lost.append(time.monotonic()))
        assert first.ping()  # the client knows the master before the replicas are cut
        sentinel_set.cut_replicas()
        try:
            try:
                result["granted"] = lock.acquire(timeout=5.0)
            except distlock.DistLockError as exc:
                result["granted"] = exc
            old = sentinel_set.master_addr()
            look = sentinel_set.node_client(old)
            try:
                assert look.exists(_lock_key(name)) == (result["granted"] is True)
            finally:
                look.close()
            sentinel_set.kill(old)
        finally:
            sentinel_set.resume_replicas()
        new = sentinel_set.wait_promotion(old)
        assert new != old
        rival = DistLock(name, client=second, lease=30.0)
        result["second"] = rival.acquire(timeout=BOUND)
        if result["granted"] is True:
            # the watchdog renews on the new master and finds the hold someone else's
            result["lost"] = _until(lambda: bool(lost), BOUND)
            try:
                lock.release()
                result["release"] = "ok"
            except Exception as exc:  # noqa: BLE001 - reported to the caller
                result["release"] = type(exc).__name__
        result["double"] = result["granted"] is True and result["second"] is True
        if result["second"]:
            rival.release()
        return result
    finally:
        first.close()
        second.close()


#: (lock kwargs, whether two holders are expected): with k = 0 the grant the replicas never saw
#: is gone after the failover; with k = the number of replicas (2) it cannot be: the grant is
#: refused (NotEnoughReplicasError) or it survives the promotion.
DOUBLE_GRANT_CASES = [({}, True), ({"min_replicas": 2, "replica_timeout": 0.3}, False)]


@pytest.mark.parametrize("lock_kwargs,double", DOUBLE_GRANT_CASES,
                         ids=[",".join(f"{k}={v}" for k, v in kw.items()) or "k=0"
                              for kw, _ in DOUBLE_GRANT_CASES])
def test_the_double_grant_of_asynchronous_replication(
        sentinel_set: SentinelSet, sentinel_client: Any, lock_kwargs: Dict[str, Any],
        double: bool) -> None:
    """With k = 0 (no min_replicas): a grant the replicas never saw is gone after the
    failover, and a second client gets the same lock on the promoted master. The first
    holder is told (on_lost) and its release raises LockLostError: never silent. With
    ``min_replicas=2`` (every replica) the same sequence gives no double grant: the grant is
    refused and undone on the master (NotEnoughReplicasError, the replicas being cut off), so
    the second client is the only holder."""
    distlock.configure(lease=3.0, renew_interval=0.5)
    result = double_grant(sentinel_set, **lock_kwargs)
    if double:
        assert result == {"granted": True, "second": True, "double": True, "lost": True,
                          "release": "LockLostError"}
    else:
        assert not result["double"], result
        assert isinstance(result["granted"], distlock.NotEnoughReplicasError), result
        assert (result["granted"].acknowledged, result["granted"].required) == (0, 2)
        assert result["second"] is True, result


def test_a_waiter_through_a_failover_gets_the_lock_or_raises_within_its_bound(
        sentinel_set: SentinelSet, sentinel_client: Any) -> None:
    """A waiter whose holder dies with the master (the grant not replicated: cut) either gets
    the lock on the promoted master or raises a connection error, within its timeout plus
    slack: never a hang, never a silent False before its time."""
    holder_client, waiter_client = sentinel_set.client(), sentinel_client
    name = _name("waiting")
    holder = DistLock(name, client=holder_client, lease=60.0)
    waiter = DistLock(name, client=waiter_client)
    outcome: List[Any] = []

    def wait() -> None:
        started = time.monotonic()
        try:
            outcome.append(waiter.acquire(timeout=20.0))
        except redis.RedisError as exc:
            outcome.append(exc)
        outcome.append(time.monotonic() - started)

    try:
        sentinel_set.cut_replicas()
        try:
            assert holder.acquire()  # a grant the replicas never see
            thread = threading.Thread(target=wait)
            thread.start()
            assert _until(lambda: _waiting(waiter_client, name), 5)
            old = sentinel_set.master_addr()
            sentinel_set.kill(old)
        finally:
            sentinel_set.resume_replicas()
        sentinel_set.wait_promotion(old)
        thread.join(BOUND)
        assert not thread.is_alive()
        assert outcome[1] < 20.0 + 5.0, "the waiter waited past its bound"
        if outcome[0] is True:
            waiter.release()
        else:
            assert isinstance(outcome[0], redis.RedisError), f"a silent {outcome[0]!r}"
            assert waiter.acquire(timeout=BOUND)
            waiter.release()
    finally:
        holder_client.close()


def test_a_semaphore_keeps_its_permits_out_through_a_failover(
        sentinel_set: SentinelSet, sentinel_client: Any) -> None:
    """Two permits of two out (replicated), master SIGKILLed: after the promotion no third
    permit is granted, the holders' releases work on the new master, and the permits given
    back can be taken again."""
    distlock.configure(lease=8.0, renew_interval=0.5)
    name = _name("sem")
    sem = DistSemaphore(name, 2, client=sentinel_client)
    lost: List[Any] = []
    sem.on_lost(lost.append)
    assert sem.acquire() and sem.acquire()
    _replicated(sentinel_set)
    sentinel_set.kill_master()
    other = sentinel_set.client()
    try:
        rival = DistSemaphore(name, 2, client=other)
        assert not _try(rival, 0.5)
        sem.release()
        assert rival.acquire(timeout=BOUND)
        assert not rival.acquire(timeout=0.2)
        rival.release()
        sem.release()
        assert not lost
    finally:
        other.close()


def test_asyncio_holds_follow_the_master(sentinel_set: SentinelSet, sentinel_client: Any) -> None:
    """An asyncio hold through a Sentinel client survives a failover (replicated), is renewed
    on the promoted master by its blocking twin's watchdog and released there."""
    distlock.configure(lease=8.0, renew_interval=0.5)
    name = _name("aio-failover")

    async def body() -> None:
        aclient = sentinel_set.aclient()
        try:
            lock = aio.DistLock(name, client=aclient)
            lost: List[Any] = []
            lock.on_lost(lost.append)
            assert await lock.acquire()
            _replicated(sentinel_set)
            await asyncio.get_running_loop().run_in_executor(None, sentinel_set.kill_master)
            master = sentinel_set.node_client(sentinel_set.master_addr())
            try:
                key = _lock_key(name)
                renewed = await asyncio.get_running_loop().run_in_executor(
                    None, _renewed, master, key, 10.0)
                assert renewed, "no renewal on the new master"
            finally:
                master.close()
            await lock.release()
            assert not lost
            assert await lock.acquire(timeout=BOUND)
            await lock.release()
        finally:
            await _aclose(aclient)

    asyncio.run(body())


def test_a_demoted_master_is_an_error_never_a_silent_false(sentinel_set: SentinelSet,
                                                             sentinel_client: Any) -> None:
    """SENTINEL FAILOVER demotes the live master: a script sent on a connection to it meets
    READONLY, which surfaces as an error (redis-py's Sentinel connection turns it into a
    ConnectionError and drops the connection) or, through a new connection, runs on the new
    master. Never a False. The next call works on the new master."""
    name = _name("demoted")
    lock = DistLock(name, client=sentinel_client)
    assert lock.acquire(blocking=False) is True
    lock.release()  # the session now has a connection to the master, idle in the pool
    _replicated(sentinel_set)
    old = sentinel_set.master_addr()
    sentinel_set._conn(sentinel_set.sentinel_addrs[0]).execute_command("SENTINEL", "FAILOVER", "distlock")
    sentinel_set.wait_promotion(old)
    assert _until(lambda: sentinel_set.role(old) == "slave", BOUND)
    outcomes = []
    deadline = time.monotonic() + BOUND
    while time.monotonic() < deadline:
        try:
            outcomes.append(lock.acquire(blocking=False))
            break
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            # a timeout too: the demoted master, resyncing from the new one on a loaded
            # machine, may answer late (an error all the same, which is the point)
            outcomes.append(type(exc).__name__)
            time.sleep(0.1)
    assert outcomes[-1] is True, outcomes
    assert False not in outcomes
    lock.release()


class _StaleSentinel(redis.sentinel.Sentinel):
    """A Sentinel whose first answers name a replica as the master (``stale``): what a client
    sees that still talks to a master demoted behind its back."""

    def __init__(self, *args: Any, stale: List[Tuple[str, int]], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.stale = list(stale)
        #: while set, every answer names it (however many lookups the client's threads make)
        self.always: Optional[Tuple[str, int]] = None

    def discover_master(self, service_name: str) -> Any:
        if self.always is not None:
            return self.always
        return self.stale.pop(0) if self.stale else super().discover_master(service_name)


class _AsyncStaleSentinel(redis.asyncio.sentinel.Sentinel):
    def __init__(self, *args: Any, stale: List[Tuple[str, int]], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.stale = list(stale)

    async def discover_master(self, service_name: str) -> Any:
        return self.stale.pop(0) if self.stale else await super().discover_master(service_name)


def test_a_script_that_meets_readonly_goes_once_more_to_the_master_the_sentinels_name(
        sentinel_set: SentinelSet, sentinel_client: Any) -> None:
    """A connection to a replica that the client took for the master (a demoted master)
    answers READONLY: the script wrote nothing, so it is sent once more, on a connection to the
    master the sentinels name now, in both shells. Where they still name the replica, it is a
    ConnectionError, never a False."""
    replica = sentinel_set.replica_addrs()[0]
    master = sentinel_set.node_client(sentinel_set.master_addr())
    name = _name("readonly")
    manager = _StaleSentinel(sentinel_set.sentinel_addrs, stale=[replica],
                             sentinel_kwargs={"socket_timeout": 1.0})
    client = manager.master_for("distlock", socket_timeout=5.0)
    try:
        lock = DistLock(name, client=client)
        assert lock.acquire(blocking=False) is True
        assert master.exists(_lock_key(name))
        lock.release()
        manager.always = replica  # every look names the replica: nowhere to go
        client.connection_pool.disconnect()
        with pytest.raises(redis.ConnectionError):
            lock.acquire(blocking=False)
        manager.always = None
        assert lock.acquire(blocking=False) is True
        lock.release()

        async def body() -> None:
            amanager = _AsyncStaleSentinel(sentinel_set.sentinel_addrs, stale=[replica],
                                           sentinel_kwargs={"socket_timeout": 1.0})
            aclient = amanager.master_for("distlock", socket_timeout=5.0)
            try:
                alock = aio.DistLock(name, client=aclient)
                assert await alock.acquire(blocking=False) is True
                assert master.exists(_lock_key(name))
                await alock.release()
            finally:
                await _aclose(aclient)

        asyncio.run(body())
    finally:
        client.close()
        close_sentinel(manager)
        master.close()


# --- across processes and the CLI -------------------------------------------------------------

def test_exclusion_across_processes_through_sentinel(sentinel_url: str, sentinel_client: Any) -> None:
    """3 processes x 60 GET/SET increments under the lock, each through its own Sentinel
    client (tests/support/_workers.py, the same worker as the single-server test): the total is
    exact."""
    import _workers

    name = _name("procs")
    with SPAWN.Pool(3) as pool:
        done = pool.starmap(_workers.count_under_lock,
                            [(sentinel_url, "DistLock", name, f"{name}:counter", 60, False)] * 3)
    assert sum(done) == 180
    assert int(sentinel_client.get(f"{name}:counter")) == 180


def _cli(*args: str, url: Optional[str] = None, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
    """``python -m distlock ARGS`` to completion; ``url``: as ``$DISTLOCK_URL``."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [os.getcwd(), env.get("PYTHONPATH")]))
    env.pop("DISTLOCK_URL", None)
    if url is not None:
        env["DISTLOCK_URL"] = url
    return subprocess.run([sys.executable, "-m", "distlock", *args], capture_output=True,
                          text=True, timeout=timeout, env=env, stdin=subprocess.DEVNULL)


def test_the_cli_with_a_sentinel_url(sentinel_url: str, sentinel_client: Any) -> None:
    """``distlock run``, ``status``, ``list`` and ``release --force`` take a sentinel URL, as
    ``--url`` or ``$DISTLOCK_URL``."""
    name = _name("cli")
    ran = _cli("run", "--url", sentinel_url, name, "--", sys.executable, "-c", "print('inside')")
    assert ran.returncode == 0, ran.stderr
    assert "inside" in ran.stdout
    lock = DistLock(name, client=sentinel_client, lease=60.0)
    assert lock.acquire()
    status = _cli("status", name, url=sentinel_url)
    assert status.returncode == 0, status.stderr
    assert name in status.stdout and "held" in status.stdout.lower()
    listed = _cli("list", "--url", sentinel_url)
    assert listed.returncode == 0, listed.stderr
    assert name in listed.stdout
    top = _cli("top", "--json", "--url", sentinel_url)
    assert top.returncode == 0, top.stderr
    assert name in top.stdout
    freed = _cli("release", "--force", "--url", sentinel_url, name)
    assert freed.returncode == 0, freed.stderr
    assert not lock.locked()
    bad = _cli("status", "--url", "redis+sentinel://127.0.0.1:1", name)
    assert bad.returncode == 2 and "names its service" in bad.stderr


def test_the_demo_runs_on_a_sentinel_set(sentinel_url: str, sentinel_client: Any) -> None:
    """``distlock demo --url redis+sentinel://...``: its workers count under the lock through
    the sentinels' master, and lose no update."""
    done = _cli("demo", "--url", sentinel_url, "--workers", "2", "--increments", "20", timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "DistLock" in done.stdout


def test_the_cli_names_an_unreachable_sentinel_set() -> None:
    """No sentinel answers: exit 69 (EX_UNAVAILABLE) with a message, not a traceback."""
    from distlock.testing.server import free_port

    done = _cli("status", "--url", f"redis+sentinel://127.0.0.1:{free_port()}/distlock", "x")
    assert done.returncode == 69, done.stderr
    assert "Traceback" not in done.stderr
