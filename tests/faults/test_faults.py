"""Fault tolerance: every exclusive primitive keeps its promises when things break (issue 7).

Each scenario runs for every entry of ``faults.PRIMITIVES``; adding a primitive there adds it
here. Timing assertions are one-sided: "not before the lease" (a lower bound, which a slow
machine only makes easier) and "within a generous bound" (an upper bound far above what is
expected).

The margin of scenario 5, as the docs state it: ``acquire(timeout=T)`` returns or raises within
``T + 2 * B`` (plus scheduling slack), where ``B`` is the longest the client takes to give up
on one command: ``socket_timeout * (retries + 1)`` plus its retry backoff. distlock never starts
a Redis command after the caller's deadline, except the one SUBSCRIBE it may send on its way into
the wait, so at most two commands can be in flight past it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
import threading
import time
import warnings
from typing import Any, Callable, Dict, Iterator, List, Optional

import faults
import pytest
import redis
import redis.asyncio
from _support import lease_left_ms, renewals_seen, start
from faults import PRIMITIVES, FaultProxy, FencedResource, Holder
from redis.backoff import NoBackoff
from redis.retry import Retry

import distlock
from distlock import LockLostError, LockNotOwnedError
from distlock._session import watchdog as watchdog_module
from distlock._session.session import reset_sessions, session_for
from distlock.testing.server import RedisServer

KINDS = sorted(PRIMITIVES)

#: Short leases for the watchdog in these tests (configure(lease=..., renew_interval=...)).
FAST = {"lease": 1.0, "renew_interval": 0.3}
#: Settings of a taker whose belief the test reads after long steps (see test_2).
TAKER = {"lease": 5.0, "renew_interval": 0.3}
#: Settings of a holder kept by its watchdog until the test kills it: renewals every 0.3 s with
#: 2.7 s of slack. With FAST's 0.7 s, a loaded machine's late first renewal (it opens the
#: watchdog's connection: on a cluster, a slot map too) let the hold run out before the kill.
WATCHED = {"lease": 3.0, "renew_interval": 0.3}

#: Client of the blackhole tests: gives up on one command after B = (1 + 1) * 0.5 = 1.0 s.
SOCKET_TIMEOUT = 0.5
RETRIES = 1
B = SOCKET_TIMEOUT * (RETRIES + 1)
#: Scheduling slack on top of the documented margin, for a slow, busy 2-core machine.
SLACK = 3.0


# --- fixtures and helpers ------------------------------------------------------------------

@pytest.fixture
def proxy(backend: Any, url: str) -> Iterator[FaultProxy]:
    assert backend.server is not None or url
    port = int(url.rsplit(":", 1)[1].split("/")[0])
    with FaultProxy("127.0.0.1", port) as px:
        try:
            yield px
        finally:
            # the sessions close while the proxy still answers: their connections close at once
            # instead of waiting out a blackhole or a dead peer
            reset_sessions()


@pytest.fixture
def holders() -> Iterator[Callable[..., Holder]]:
    made: List[Holder] = []

    def start(*args: Any, **kwargs: Any) -> Holder:
        holder = Holder(*args, **kwargs)
        made.append(holder)
        return holder

    try:
        yield start
    finally:
        for holder in made:
            holder.cleanup()


@pytest.fixture
def resource(tmp_path: Any) -> FencedResource:
    return FencedResource(str(tmp_path))


def make(kind: str, name: str, client: Any, lease: Optional[float] = None) -> Any:
    return PRIMITIVES[kind].make(name, client, lease)


def rival(kind: str, name: str, client: Any, lease: Optional[float] = None) -> Any:
    """What contends with a holder of ``kind`` (a read lock's rival is the write lock)."""
    return PRIMITIVES[kind].rival(name, client, lease)


EXCLUSIVE = [k for k in KINDS if PRIMITIVES[k].exclusive]
#: Scenario 9 runs thousands of holds per kind. DistCondition's acquire and release are its
#: DistRLock's own bound methods (as in threading), so its run would be DistRLock's again; its
#: waits have their own scenario at the end of this file.
CHECKED = [k for k in EXCLUSIVE if k != "DistCondition"]


def holds_token(client: Any, name: str, token: Optional[int]) -> bool:
    """True when a hash of ``name`` carries fencing token ``token`` (the hold is alive)."""
    for key in client.scan_iter(match=f"distlock:{{{name}}}*"):
        kind = client.type(key)
        if kind == b"hash" and client.hget(key, ":t") == str(token).encode():
            return True
        if kind == b"zset" and any(f"#{token}@".encode() in m or m.endswith(f"#{token}".encode())
                                   for m in client.zrange(key, 0, -1)):
            return True
    return False


def bounded_client(port: int) -> redis.Redis[Any]:
    return redis.Redis(host="127.0.0.1", port=port, socket_timeout=SOCKET_TIMEOUT,
                       socket_connect_timeout=SOCKET_TIMEOUT, retry=Retry(NoBackoff(), RETRIES))


def numsub(client: Any, channel: str) -> int:
    return int(dict(client.pubsub_numsub(channel)).get(channel.encode(), 0))


def pubsub_clients(client: Any) -> set[str]:
    """Ids of the server's pub/sub connections that have at least one subscription."""
    return {c["id"] for c in client.client_list(_type="pubsub") if int(c.get("sub", 0)) > 0}


def waited_channel(session: Any, name: str) -> Optional[str]:
    """The channel of ``name`` this session is subscribed to (a write lock's waiters may use
    another channel than the lock's ``:wake``)."""
    for channel in session.subscribed_channels():
        if f"{{{name}}}" in channel:
            return str(channel)
    return None


# --- 1. holder killed with SIGKILL -------------------------------------------------------------

@pytest.mark.cluster_too
@pytest.mark.real_redis
@pytest.mark.parametrize("lease", [1.0, None], ids=["explicit-lease", "watchdog"])
@pytest.mark.parametrize("kind", KINDS)
def test_1_sigkill_holder_frees_after_lease_never_before(
        url: str, client: Any, holders: Any, kind: str, lease: Optional[float]) -> None:
    name = f"s1-{kind}"
    holder = holders(url, kind, name, lease=lease, settings=FAST if lease is not None else WATCHED)
    _, first, acquired_at = holder.event("acquired")[:3]
    assert first is not None
    if lease is None:  # the watchdog keeps the hold alive: its renewals reach the server
        renewals_seen(lambda: lease_left_ms(client, name), 2, what=f"{name} (its watchdog's)")
    killed = time.monotonic()
    holder.kill()

    probe = rival(kind, name, client)
    sent = time.monotonic()
    left = lease_left_ms(client, name)
    # The hold outlives its holder until its lease runs out: it must still be there, unless a
    # loaded machine took that long to look (time.monotonic() is one clock for the host).
    ran_out = acquired_at + lease if lease is not None else killed + WATCHED["lease"]
    assert left > 0 or sent >= ran_out - 0.010, "the hold vanished with its holder, before its lease ran out"
    tried = time.monotonic()
    refused = not probe.acquire(blocking=False)
    if not refused:  # only where the lease had run out by then (a loaded machine): see below
        probe.release()
    assert refused or tried >= sent + left / 1000.0 - 0.010, \
        "a try took the lock before the killed holder's lease ran out"
    assert probe.acquire(timeout=left / 1000.0 + 15.0) is True
    got = time.monotonic()
    try:
        assert got >= sent + left / 1000.0 - 0.010, "acquired before the killed holder's lease ran out"
        assert probe.token > first
    finally:
        probe.release()


# --- 2. holder stopped past its lease, then continued ------------------------------------------

@pytest.mark.cluster_too
@pytest.mark.real_redis
@pytest.mark.parametrize("lease", [1.0, None], ids=["explicit-lease", "watchdog"])
@pytest.mark.parametrize("kind", KINDS)
def test_2_sigstop_past_lease_then_sigcont(
        url: str, client: Any, holders: Any, resource: FencedResource, kind: str,
        lease: Optional[float]) -> None:
    # The holder runs on FAST; the taker's lease is longer, so that a loaded machine's late
    # renewal cannot end its belief while the checks below run (they read that belief).
    distlock.configure(**TAKER)
    name = f"s2-{kind}"
    holder = holders(url, kind, name, lease=lease, settings=FAST)
    old = holder.event("acquired")[1]
    holder.send("write", resource, old)
    assert holder.event("write")[1] is True

    holder.stop()
    mine = rival(kind, name, client)
    assert mine.acquire(timeout=20), "nobody could take over from the stopped holder"
    try:
        new = mine.token
        assert new > old
        assert resource.write(new, "taker")
        holder.cont()
        if lease is None:
            holder.event("on_lost", timeout=20)  # the watchdog found the hold someone else's
        holder.send("write", resource, old)
        assert holder.event("write")[1] is False, "the fenced resource took a stale write"
        holder.send("release")
        assert holder.event("release")[1] == "LockLostError"
        if lease is not None:
            holder.event("on_lost", timeout=10)  # found by release() itself
        assert not holder.has_event("on_lost"), "on_lost ran twice"
        assert mine.owned() and mine.token == new, "the late release touched the new hold"
        assert lease_left_ms(client, name) > 0
    finally:
        mine.release()
    holder.send("exit")
    accepted = [w.token for w in resource.log() if w.accepted]
    assert accepted == sorted(accepted) and old in accepted and new in accepted
    assert [w for w in resource.log() if not w.accepted] != []


# --- 3. Redis restarted without persistence ----------------------------------------------------

@pytest.mark.real_redis
@pytest.mark.slow
@pytest.mark.parametrize("kind", KINDS)
def test_3_redis_restart_while_held_and_waited(backend: Any, url: str, client: Any, kind: str) -> None:
    distlock.configure(**FAST)
    timeout = 10.0
    before: List[int] = []
    names = [f"s3-{kind}-watchdog", f"s3-{kind}-lease"]
    held = [make(kind, names[0], client), make(kind, names[1], client, lease=30.0)]
    lost: Dict[int, float] = {}
    for i, lock in enumerate(held):
        for _ in range(3):  # a few grants, so the fence counters have a history
            assert lock.acquire(blocking=False)
            before.append(lock.token)
            lock.release()
        assert lock.acquire(blocking=False)
        before.append(lock.token)
        lock.on_lost(lambda _lock, i=i: lost.setdefault(i, time.monotonic()))

    after: List[int] = []
    after_lock = threading.Lock()
    errors: List[BaseException] = []

    def wait_for(name: str) -> str:
        lock = rival(kind, name, client, lease=5.0)
        deadline = time.monotonic() + timeout
        while True:
            try:
                ok = lock.acquire(timeout=max(0.1, deadline - time.monotonic()))
                break
            except redis.exceptions.ConnectionError as exc:
                # the server was down at a try (allowed, raised at once); as a caller would,
                # try again until the wait's own deadline: a slow restart is not a failure
                errors.append(exc)
                if time.monotonic() >= deadline:
                    return "ConnectionError"
                time.sleep(0.2)
        if ok:
            with after_lock:
                after.append(lock.token)
            lock.release()
        return str(ok)

    waiters = [start(lambda n=n: wait_for(n), f"waiter-{n}") for n in names for _ in range(2)]
    session = session_for(client)
    assert faults.wait_until(lambda: all(waited_channel(session, n) is not None for n in names), 10)
    assert faults.wait_until(lambda: all(numsub(client, str(waited_channel(session, n))) >= 1
                                         for n in names), 10)
    faults.restart_server(backend)
    for waiter in waiters:
        waiter.finish(timeout + 30.0)
        assert waiter.error is None, repr(waiter.error)
        assert waiter.result in ("True", "False", "ConnectionError")
        assert waiter.elapsed <= timeout + 15.0
    # Woken when the dispatcher's subscription is confirmed again, most take the freed locks.
    assert sum(w.result == "True" for w in waiters) >= len(names), ([w.result for w in waiters], errors)

    # The watchdog's holder learns it by itself, the explicit lease's at release().
    assert faults.wait_until(lambda: 0 in lost, 15), "the watchdog did not report the lost lease"
    for lock in held:
        with pytest.raises(LockLostError):
            lock.release()
    assert 1 in lost
    for name in names:  # grants after the restart, by waiters or by a fresh lock
        lock = rival(kind, name, client)
        assert lock.acquire(timeout=10)
        after.append(lock.token)
        lock.release()
    assert min(after) > max(before), (before, after)


# --- 4. the pub/sub connection is killed while waiters wait ---------------------------------

@pytest.mark.real_redis
@pytest.mark.parametrize("how", ["client-kill", "proxy-reset", "proxy-drop"])
@pytest.mark.parametrize("kind", KINDS)
def test_4_pubsub_connection_killed_while_waiting(
        client: Any, proxy: FaultProxy, kind: str, how: str) -> None:
    distlock.configure(wait_cap=0.5)
    name = f"s4-{kind}"
    user = client if how == "client-kill" else proxy.client()
    holder = make(kind, name, client)
    assert holder.acquire(blocking=False)
    got: List[int] = []

    def wait() -> bool:
        lock = rival(kind, name, user)
        ok = bool(lock.acquire(timeout=30))
        if ok:
            got.append(lock.token)
            lock.release()
        return ok

    waiters = [start(wait, f"waiter-{i}") for i in range(3)]
    session = session_for(user)
    try:
        assert faults.wait_until(lambda: waited_channel(session, name) is not None, 10)
        channel = waited_channel(session, name)
        before = pubsub_clients(client)
        if how == "client-kill":
            assert faults.kill_pubsub(client) >= 1
        elif how == "proxy-reset":
            assert proxy.reset_pubsub() >= 1
        else:
            proxy.drop_pubsub(True)
        if how != "proxy-drop":
            # A new pub/sub connection (the dispatcher's, or redis-py's own retry inside it)
            # is subscribed to the channel again.
            assert faults.wait_until(
                lambda: bool(pubsub_clients(client) - before) and numsub(client, channel) >= 1,
                10), "the pub/sub connection was not re-established"
    finally:
        holder.release()
    released = time.monotonic()
    for waiter in waiters:
        waiter.finish(40)
        assert waiter.error is None, repr(waiter.error)
        assert waiter.result is True
        # The bound: each waiter polls at least every wait_cap * queue_cap_factor = 5 s.
        assert waiter.ended_at - released < 20.0
    assert len(got) == 3 and len(set(got)) == 3


# --- 5. blackhole during acquire(timeout=1) ---------------------------------------------------

@pytest.mark.real_redis
@pytest.mark.parametrize("when", ["before", "while-waiting", "latency"])
@pytest.mark.parametrize("kind", KINDS)
def test_5_blackhole_during_acquire(client: Any, proxy: FaultProxy, kind: str, when: str) -> None:
    """acquire(timeout=1) through a blackholed (or slow) link returns or raises within
    1 + 2 * B + slack, where B is the client's bound on one command (see the module doc)."""
    distlock.configure(wait_cap=0.5)
    name = f"s5-{kind}"
    other = make(kind, name, client)
    assert other.acquire(blocking=False)
    victim_client = bounded_client(proxy.port)
    try:
        victim = rival(kind, name, victim_client)

        def attempt() -> Any:
            return victim.acquire(timeout=1)

        assert start(attempt).finish(10).result is False  # connections are up, all is well
        if when == "before":
            proxy.blackhole()
            worker = start(attempt)
        elif when == "while-waiting":
            worker = start(attempt)
            time.sleep(0.3)
            proxy.blackhole()
        else:
            proxy.delay(SOCKET_TIMEOUT * 0.8 * 1000)  # each way: every reply comes too late
            worker = start(attempt)
        worker.finish(60)
        assert worker.elapsed <= 1.0 + 2 * B + SLACK, worker.elapsed
        if worker.error is not None:
            assert isinstance(worker.error, (redis.exceptions.ConnectionError,
                                             redis.exceptions.TimeoutError)), repr(worker.error)
        else:
            assert worker.result is False
        assert not victim.owned()
    finally:
        proxy.heal()
        proxy.delay(0)
        other.release()
        victim_client.close()


@pytest.mark.real_redis
@pytest.mark.parametrize("lease", [1.0, None], ids=["explicit-lease", "watchdog"])
@pytest.mark.parametrize("kind", KINDS)
def test_5_lost_grant_reply_does_not_outlive_its_lease(
        client: Any, proxy: FaultProxy, kind: str, lease: Optional[float]) -> None:
    """The server grants, the reply is lost: the caller gets an error, and the orphan hold
    ends with its lease (nobody renews it)."""
    orphan_lease = 4.0  # longer than B, or the orphan would be gone before the error arrives
    distlock.configure(lease=orphan_lease, renew_interval=1.0)
    name = f"s5r-{kind}"
    victim_client = bounded_client(proxy.port)
    try:
        victim = make(kind, name, victim_client, lease=None if lease is None else orphan_lease)
        assert victim.acquire(blocking=False)  # scripts loaded, connection up
        victim.release()
        proxy.blackhole("replies")
        worker = start(lambda: victim.acquire(timeout=1)).finish(60)
        assert worker.elapsed <= 1.0 + 2 * B + SLACK
        assert isinstance(worker.error, (redis.exceptions.ConnectionError,
                                         redis.exceptions.TimeoutError)), repr(worker.error)
        assert not victim.owned()
        left = lease_left_ms(client, name)
        assert 0 < left <= orphan_lease * 1000, "the orphan grant has no lease, or a longer one"
        time.sleep(left / 1000.0 + 0.5)  # past its lease, with watchdog rounds in between
        assert lease_left_ms(client, name) < 0, "the orphan grant outlived its lease"
        probe = make(kind, name, client)
        assert probe.acquire(blocking=False)
        probe.release()
    finally:
        proxy.heal()
        victim_client.close()


@pytest.mark.real_redis
@pytest.mark.parametrize("kind", ["DistLock"])  # the bound is the session's, whatever the primitive
def test_5_client_without_socket_timeout_cannot_hang(client: Any, proxy: FaultProxy, kind: str) -> None:
    """A client with socket_timeout=None would wait for ever on a blackholed server; the
    session talks through a twin bounded by DEFAULT_IO_TIMEOUT (see distlock._redis.clients), so
    acquire(timeout=1) still raises within 1 + 2 * DEFAULT_IO_TIMEOUT + slack."""
    from distlock._redis.clients import DEFAULT_IO_TIMEOUT

    name = f"s5n-{kind}"
    other = make(kind, name, client)
    assert other.acquire(blocking=False)
    unbounded = proxy.client(socket_timeout=None, socket_connect_timeout=None,
                             retry=Retry(NoBackoff(), 0))
    try:
        victim = rival(kind, name, unbounded)
        assert start(lambda: victim.acquire(blocking=False)).finish(10).result is False
        proxy.blackhole()
        worker = start(lambda: victim.acquire(timeout=1)).finish(60)
        assert worker.elapsed <= 1.0 + 2 * DEFAULT_IO_TIMEOUT + SLACK, worker.elapsed
        assert isinstance(worker.error, (redis.exceptions.ConnectionError,
                                         redis.exceptions.TimeoutError)), repr(worker.error)
    finally:
        proxy.heal()
        other.release()
        unbounded.close()


@pytest.mark.real_redis
def test_5_a_batch_on_a_client_without_socket_timeout_cannot_hang(client: Any, proxy: FaultProxy) -> None:
    """The executor's pipelines (a read hold's check, which ``distlock run --shared`` makes
    every second) go through a twin bounded by DEFAULT_IO_TIMEOUT when the client's own
    connections have no socket timeout: in a blackhole they raise, they do not wait for ever."""
    from distlock._redis.clients import DEFAULT_IO_TIMEOUT
    from distlock._session.session import session_for

    unbounded = proxy.client(socket_timeout=None, socket_connect_timeout=None,
                             retry=Retry(NoBackoff(), 0))
    try:
        executor = session_for(unbounded).executor
        batch = executor.batch()
        batch.command("PING")
        assert batch.execute() == [True]
        proxy.blackhole()
        batch = executor.batch()
        batch.command("PING")
        worker = start(batch.execute).finish(60)
        assert worker.elapsed <= 2 * DEFAULT_IO_TIMEOUT + SLACK, worker.elapsed
        assert isinstance(worker.error, (redis.exceptions.ConnectionError,
                                         redis.exceptions.TimeoutError)), repr(worker.error)
    finally:
        proxy.heal()
        unbounded.close()


@pytest.mark.real_redis
@pytest.mark.parametrize("kind", KINDS)
def test_5_watchdog_reports_a_lease_lost_in_a_blackhole(client: Any, proxy: FaultProxy, kind: str) -> None:
    """The holder's link to Redis goes silent: its watchdog's renewals time out (they have their
    own connection, bounded by the renew interval, without retries), so on_lost fires about
    when the lease runs out, not after the client's own minute of retries."""
    distlock.configure(**FAST)
    name = f"s5w-{kind}"
    default_client = proxy.client()  # this redis-py's defaults: 5 s timeouts, 10 retries
    try:
        lock = make(kind, name, default_client)
        assert start(lambda: lock.acquire(blocking=False)).finish(10).result is True
        lost: List[float] = []
        lock.on_lost(lambda _lock: lost.append(time.monotonic()))
        time.sleep(FAST["lease"])  # renewals go through
        assert not lost
        proxy.blackhole()
        cut = time.monotonic()
        assert faults.wait_until(lambda: bool(lost), FAST["lease"] + 10.0), "lease lost in silence"
        assert lost[0] - cut <= FAST["lease"] + 2 * FAST["renew_interval"] + SLACK
        assert faults.wait_until(lambda: lease_left_ms(client, name) < 0, 10)
        assert not lock.owned()
    finally:
        proxy.heal()
        default_client.close()


# --- 6. SCRIPT FLUSH in the middle of a run ---------------------------------------------------

@pytest.mark.cluster_too
@pytest.mark.parametrize("kind", KINDS)
def test_6_script_flush_mid_run(client: Any, kind: str) -> None:
    # What is tested is that renewals and grants reload their scripts, not how fast: a lease of
    # 4 s (renewed every 0.5 s) keeps a loaded machine's late renewal from looking like a loss.
    distlock.configure(lease=4.0, renew_interval=0.5)
    name = f"s6-{kind}"
    kept = make(kind, f"{name}-kept", client)
    assert kept.acquire(blocking=False)
    lost: List[Any] = []
    kept.on_lost(lost.append)
    counter = f"s6-counter-{kind}"
    stop = threading.Event()

    def flusher() -> int:
        n = 0
        while not stop.is_set() and n < 400:
            client.script_flush()
            n += 1
            time.sleep(0.01)
        return n

    def work() -> int:
        lock = rival(kind, name, client)
        for _ in range(40):
            assert lock.acquire(timeout=20)
            try:
                client.set(counter, int(client.get(counter) or 0) + 1)
            finally:
                lock.release()
        return 40

    flush = start(flusher, "flusher")
    workers = [start(work, f"worker-{i}") for i in range(3)]
    try:
        for worker in workers:
            worker.finish(120)
            assert worker.error is None, repr(worker.error)
        time.sleep(2.0)  # renewals (four or so) across flushes
    finally:
        stop.set()
        flush.finish(30)
    assert flush.result > 10
    assert int(client.get(counter)) == 120
    assert kept.owned() and not lost, "a renewal failed for good after SCRIPT FLUSH"
    kept.release()


@pytest.mark.real_redis
def test_6_a_flush_after_every_load_still_runs(client: Any, monkeypatch: Any) -> None:
    """The worst of scenario 6, made certain: a SCRIPT FLUSH lands between every load and the
    run it was for. The retries' last try sends the script's body (EVAL), which cannot answer
    NOSCRIPT; an EVALSHA there let NoScriptError reach the user (seen once, as a failed
    test_6 on the fair lock under load)."""
    loads: List[int] = []
    real_load = client.script_load

    def load_then_flush(body: Any) -> Any:
        sha = real_load(body)
        loads.append(1)
        client.script_flush()
        return sha

    lock = distlock.DistLock("s6-always", client=client)
    monkeypatch.setattr(session_for(client).executor.client, "script_load", load_then_flush)
    client.script_flush()
    assert lock.acquire(blocking=False)
    client.script_flush()
    lock.release()
    assert loads and not lock.locked()


@pytest.mark.real_redis
def test_6_a_flush_after_every_load_still_runs_asyncio(url: str, client: Any,
                                                       monkeypatch: Any) -> None:
    from distlock._redis.aport import AsyncPort
    from distlock.asyncio import DistLock as AsyncDistLock

    flushes: List[int] = []
    real_send = AsyncPort._send

    async def send_then_flush(self: Any, *args: Any, then: Any = None) -> Any:
        reply = await real_send(self, *args, then=then)
        if args[:2] == ("SCRIPT", "LOAD"):
            client.script_flush()  # between this load and the run it was for
            flushes.append(1)
        return reply

    monkeypatch.setattr(AsyncPort, "_send", send_then_flush)

    async def main() -> None:
        aclient = redis.asyncio.Redis.from_url(url)
        try:
            lock = AsyncDistLock("s6-always-aio", client=aclient)
            client.script_flush()
            assert await lock.acquire()
            client.script_flush()
            await lock.release()
            assert not await lock.locked()
        finally:
            await aclient.aclose() if hasattr(aclient, "aclose") else await aclient.close()

    asyncio.run(main())
    assert flushes


@pytest.mark.real_redis
@pytest.mark.parametrize("wait", [False, True])
def test_6_a_flush_after_a_batchs_load_still_runs(client: Any, monkeypatch: Any,
                                                  wait: bool) -> None:
    """The watchdog's renewals go in a batch (a pipeline), which redis-py loads its scripts
    for before it runs: a SCRIPT FLUSH between the two left every renewal of a round with
    NOSCRIPT, and under a flush every 10 ms a semaphore's permit ran out unrenewed (seen as a
    failed test_sem_6 under load). The entries that answered NOSCRIPT go again with their
    bodies; here a flush follows every load, for certain."""
    real_load = redis.client.Pipeline.load_scripts

    def load_then_flush(pipe: Any) -> None:
        real_load(pipe)
        client.script_flush()

    monkeypatch.setattr(redis.client.Pipeline, "load_scripts", load_then_flush)
    client.script_flush()
    batch = session_for(client).executor.renewal_batch()
    batch.script("bar_info", ("s6b:{t}:a", "s6b:{t}:b", "s6b:{t}:c", "s6b:{t}:d"), (1000,))
    batch.command("PING")
    if wait:
        batch.wait(0, 1)
    assert batch.execute() == [[0, 0], True]
    assert batch.acked == ([0, 0] if wait else None)


def _flush_masters(cluster: Any) -> None:
    for host, port in cluster.masters():
        node = redis.Redis(host=host, port=port)
        try:
            node.script_flush()
        finally:
            node.close()


@pytest.mark.real_redis
def test_6_a_flush_after_every_load_still_runs_on_the_cluster(cluster: Any, cluster_client: Any,
                                                              monkeypatch: Any) -> None:
    """The cluster executor's NOSCRIPT path: after it loads a script on a node, it sends the
    body (EVAL), so a SCRIPT FLUSH that follows every load cannot make the send answer
    NOSCRIPT again (it ended on EVALSHA, and NoScriptError reached the caller)."""
    loads: List[int] = []
    real_load = redis.Redis.script_load

    def load_then_flush(self: Any, body: Any) -> Any:
        sha = real_load(self, body)
        loads.append(1)
        self.script_flush()
        return sha

    monkeypatch.setattr(redis.Redis, "script_load", load_then_flush)
    lock = distlock.DistLock("s6-always-cluster", client=cluster_client)
    _flush_masters(cluster)
    session_for(cluster_client).executor.loaded.clear()
    assert lock.acquire(blocking=False)
    _flush_masters(cluster)
    lock.release()
    assert loads and not lock.locked()


@pytest.mark.real_redis
def test_6_a_cluster_batch_flushed_before_every_round_still_runs(cluster: Any, cluster_client: Any,
                                                                 monkeypatch: Any) -> None:
    """The watchdog's renewals on a cluster go in one pipeline per node; an entry that answered
    NOSCRIPT goes again in the next round. With the scripts flushed before every round (and
    believed loaded, so that no SCRIPT LOAD goes first), only the last round's bodies (EVAL)
    get through: an EVALSHA there failed the renewal for good under a flush every 10 ms (seen
    as a failed test_6_script_flush_mid_run on the cluster)."""
    from distlock._redis import executor_cluster
    from distlock._redis.scripts import script_names

    executor = session_for(cluster_client).executor
    real_send = executor_cluster.ClusterBatch._send
    rounds: List[bool] = []

    def flush_then_send(self: Any, node: Any, indexes: Any, bodies: bool = False) -> Any:
        _flush_masters(cluster)
        executor.loaded.setdefault(node.name, set()).update(script_names())
        rounds.append(bodies)
        return real_send(self, node, indexes, bodies)

    monkeypatch.setattr(executor_cluster.ClusterBatch, "_send", flush_then_send)
    batch = executor.renewal_batch()
    batch.script("bar_info", ("s6c:{t}:a", "s6c:{t}:b", "s6c:{t}:c", "s6c:{t}:d"), (1000,))
    assert batch.execute() == [[0, 0]]
    assert rounds[-1] is True and rounds.count(False) >= 1


# --- 7. maxmemory reached under noeviction -----------------------------------------------------

def _fill_until_out_of_memory(full: redis.Redis, tag: str) -> None:
    """Write filler keys until the server refuses one (bounded: 10,000 keys of 1 KB)."""
    with pytest.raises(redis.exceptions.OutOfMemoryError):
        for i in range(10_000):
            full.set(f"filler:{tag}:{i}", "x" * 1024)


@pytest.mark.real_redis
@pytest.mark.parametrize("kind", KINDS)
def test_7_out_of_memory_release_and_renew_still_work(client: Any, kind: str) -> None:
    # A lease long enough that a loaded machine's late renewal is not taken for a refused one:
    # what is checked is that renewals reach the server out of memory (the lease grows).
    distlock.configure(lease=3.0, renew_interval=0.3)
    with RedisServer(extra_args=["--maxmemory-policy", "noeviction"]) as server:
        full = redis.Redis.from_url(server.url)
        try:
            watched = make(kind, f"s7-{kind}-w", full)
            leased = make(kind, f"s7-{kind}-l", full, lease=30.0)
            assert watched.acquire(blocking=False) and leased.acquire(blocking=False)
            if PRIMITIVES[kind].reentrant:
                assert watched.acquire(blocking=False)  # a level to give back under OOM
            lost: List[Any] = []
            watched.on_lost(lost.append)
            used = int(full.info("memory")["used_memory"])
            full.config_set("maxmemory", used + 256 * 1024)
            _fill_until_out_of_memory(full, "a")
            renewals_seen(lambda: lease_left_ms(full, f"s7-{kind}-w"), 1, what="the hold out of memory")
            full.script_flush()  # and the NOSCRIPT path out of memory
            renewals_seen(lambda: lease_left_ms(full, f"s7-{kind}-w"), 1,
                          what="the hold out of memory after SCRIPT FLUSH")
            assert watched.owned() and not lost, "renewal failed out of memory"
            # valkey-server counts its scripts' memory as used: the flush freed some of it
            _fill_until_out_of_memory(full, "b")
            with pytest.raises(redis.exceptions.OutOfMemoryError):
                make(kind, f"s7-{kind}-new", full).acquire(blocking=False)
            if PRIMITIVES[kind].reentrant:
                watched.release()  # one level
                assert watched.owned()
            watched.release()
            leased.release()
            assert lease_left_ms(full, f"s7-{kind}-w") < 0 and lease_left_ms(full, f"s7-{kind}-l") < 0
        finally:
            from distlock._session.session import reset_sessions

            reset_sessions()
            full.close()


# --- 8. connection pool exhausted by user code --------------------------------------------

@pytest.mark.real_redis
@pytest.mark.parametrize("pool_timeout", [0.2, 20.0], ids=["pool-timeout-short", "pool-timeout-default"])
@pytest.mark.parametrize("kind", KINDS)
def test_8_pool_exhausted_watchdog_renews_or_reports(url: str, client: Any, kind: str,
                                                     pool_timeout: float) -> None:
    distlock.configure(**FAST)
    pool = redis.BlockingConnectionPool.from_url(url, max_connections=2, timeout=pool_timeout)
    user = redis.Redis(connection_pool=pool)
    taken: List[Any] = []
    try:
        name = f"s8-{kind}"
        lock = make(kind, name, user)
        assert lock.acquire(blocking=False)
        lost: List[float] = []
        lock.on_lost(lambda _lock: lost.append(time.monotonic()))
        token = lock.token
        taken = [pool.get_connection() for _ in range(2)]  # user code takes every connection
        exhausted_at = time.monotonic()
        time.sleep(FAST["lease"] * 3)
        alive = holds_token(client, name, token)
        if not alive:
            # Not renewed: it must have said so, by the time its lease ran out (plus a round).
            assert lost, "the lease ran out while the watchdog stayed silent"
            assert lost[0] - exhausted_at < FAST["lease"] + 1.0
        for conn in taken:
            pool.release(conn)
        taken = []
        if alive:
            assert lock.owned() and not lost
            lock.release()
        else:
            with pytest.raises(LockLostError):
                lock.release()
    finally:
        for conn in taken:
            pool.release(conn)
        from distlock._session.session import reset_sessions

        reset_sessions()
        pool.disconnect()


# --- 9. mutual-exclusion checker -----------------------------------------------------------

@pytest.mark.cluster_too
@pytest.mark.real_redis
@pytest.mark.slow
@pytest.mark.parametrize("kind", CHECKED)
def test_9_mutual_exclusion_8_processes(url: str, client: Any, tmp_path: Any, kind: str) -> None:
    processes, holds = 8, 200
    res = FencedResource(str(tmp_path))
    procs = faults.start_checkers(url, kind, f"s9-{kind}", processes, holds, None, FAST, res,
                                  str(tmp_path))
    try:
        for proc in procs:
            proc.join(timeout=300)
        assert all(proc.exitcode == 0 for proc in procs), [p.exitcode for p in procs]
    finally:
        for proc in procs:
            if proc.is_alive():
                proc.kill()
                proc.join(timeout=10)
    intervals = faults.read_intervals(str(tmp_path), processes)
    assert len(intervals) == processes * holds
    assert all(iv[3] in ("ok", "LockLostError") for iv in intervals)
    faults.check_exclusion(intervals, res)


@pytest.mark.cluster_too
@pytest.mark.real_redis
@pytest.mark.slow
@pytest.mark.parametrize("kind", CHECKED)
def test_9_mutual_exclusion_with_sigstops(url: str, client: Any, tmp_path: Any, kind: str) -> None:
    """Random SIGSTOPs of holders past their lease: holds that ended well never overlap, and
    the fenced resource never accepts a token lower than one it accepted (stale writes were
    tried, and refused)."""
    processes, holds, lease = 8, 100, 0.5
    res = FencedResource(str(tmp_path))
    name = f"s9s-{kind}"
    # The run lasts at least 10 s, whatever the lock's speed: time for 3 to 6 stops of 1.25 s.
    procs = faults.start_checkers(url, kind, name, processes, holds, lease, {}, res, str(tmp_path),
                                  min_seconds=10.0)
    rng = random.Random(7)
    stopped = inside = 0
    try:
        deadline = time.monotonic() + 300
        while any(p.is_alive() for p in procs) and time.monotonic() < deadline:
            time.sleep(0.05 + rng.random() * 0.2)
            # 3 to 6 stops, and more (up to 60: a loaded machine's holders often release
            # between the look and the stop) until one stopped a holder inside its hold
            if stopped >= 60 or (stopped >= 6 and inside) or (stopped >= 3 and inside >= 2):
                continue
            info = held = None
            for key in client.scan_iter(match=f"distlock:{{{name}}}*"):
                if client.type(key) == b"hash" and client.hexists(key, ":i"):
                    info, held = client.hget(key, ":i"), key
            if not info:
                continue
            pid = int(info.rsplit(b":", 1)[1])
            if pid not in [p.pid for p in procs]:
                continue
            os.kill(pid, signal.SIGSTOP)
            try:
                # Stopped while the hold is still in Redis, once a release it may have sent
                # has surely been served: that hold ends stopped, past its lease (on a loaded
                # machine the holder may have released between the look and the stop).
                time.sleep(0.1)
                if client.hget(held, ":i") == info:
                    inside += 1
                    time.sleep(lease * 2.5)
                # else: it had released; a stop of 0.1 s, and the next try comes sooner (a
                # loaded machine misses often, and the children's run may last only 10 s)
            finally:
                os.kill(pid, signal.SIGCONT)
            stopped += 1
        for proc in procs:
            proc.join(timeout=max(1.0, deadline - time.monotonic()))
        assert all(proc.exitcode == 0 for proc in procs), [p.exitcode for p in procs]
    finally:
        for proc in procs:
            if proc.is_alive():
                os.kill(proc.pid, signal.SIGCONT)
                proc.kill()
                proc.join(timeout=10)
    assert stopped >= 3
    assert inside, "no stop fell inside a hold"
    intervals = faults.read_intervals(str(tmp_path), processes)
    faults.check_exclusion(intervals, res)
    assert any(iv[3] == "LockLostError" for iv in intervals), "no SIGSTOP fell inside a hold"


# --- 10. pre-fork servers -----------------------------------------------------------------

@pytest.mark.cluster_too
@pytest.mark.real_redis
@pytest.mark.parametrize("kind", KINDS)
def test_10_prefork_children_cannot_release_parents_hold(client: Any, kind: str) -> None:
    name = f"s10-{kind}"
    lock = make(kind, name, client)
    assert lock.acquire(blocking=False)
    token = lock.token
    pids = []
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # fork() with threads running
            for i in range(4):
                pid = os.fork()
                if pid == 0:  # pragma: no cover - the child
                    os._exit(_prefork_child(kind, name, lock, i, client))
                pids.append(pid)
        codes = []
        for pid in pids:
            deadline = time.monotonic() + 60
            while True:
                done, status = os.waitpid(pid, os.WNOHANG)
                if done:
                    codes.append(os.waitstatus_to_exitcode(status))
                    break
                if time.monotonic() > deadline:
                    os.kill(pid, signal.SIGKILL)
                    os.waitpid(pid, 0)
                    codes.append(-9)
                    break
                time.sleep(0.02)
        pids = []
        assert codes == [0, 0, 0, 0], codes
        assert lock.owned() and lock.token == token
        assert holds_token(client, name, token)
    finally:
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
            except (ProcessLookupError, ChildProcessError):
                pass
        lock.release()


def _prefork_child(kind: str, name: str, inherited: Any, i: int, client: Any) -> int:
    """Exit codes: 0 fine; 1 released the parent's hold; 2 could not take its own; 3 other."""
    try:
        if inherited.owned() or inherited.token is not None:
            return 1
        try:
            inherited.release()
            return 1
        except LockNotOwnedError:
            pass
        same = rival(kind, name, client)
        if same.acquire(blocking=False):
            return 1
        own = make(kind, f"{name}-child-{i}", client)
        if not own.acquire(timeout=10):
            return 2
        if own.token is None or not own.owned():
            return 2
        own.release()
        if inherited.owned():
            return 1
        return 0
    except BaseException:  # noqa: BLE001 - the child must always exit
        import traceback

        traceback.print_exc()
        return 3


# --- a condition's waiters through scenarios 3 and 4 --------------------------------------

needs_condition = pytest.mark.skipif(not hasattr(distlock, "DistCondition"),
                                     reason="DistCondition is not in this tree yet")


def _cond_waiter(client: Any, name: str, timeout: float,
                 holding: threading.Semaphore) -> Callable[[], Any]:
    """wait(timeout) under the lock; returns (wait's result or "ConnectionError", whether
    the lock was held afterwards). ``holding`` is released once the
    lock is taken, just before wait(). A wait that raises may leave the lock not held: it could
    not be taken back from a server that was down, and the release of a lock that was taken
    back may meet a connection the restart closed."""
    def wait() -> Any:
        cond = distlock.DistCondition(name, client=client)  # type: ignore[attr-defined]
        cond.acquire()
        holding.release()
        try:
            result: Any = cond.wait(timeout=timeout)
        except redis.exceptions.ConnectionError:
            result = "ConnectionError"
        owned = cond._is_owned()
        if owned:
            try:
                cond.release()
            except redis.exceptions.ConnectionError:
                result = "ConnectionError"
        return result, owned
    return wait


@needs_condition
@pytest.mark.real_redis
@pytest.mark.parametrize("fault", ["restart", "client-kill"])
def test_condition_waiters_survive_restart_and_pubsub_kill(backend: Any, url: str, client: Any,
                                                           fault: str) -> None:
    """cond.wait(timeout) never hangs: through a Redis restart each waiter returns (True or
    False, holding the lock) or raises ConnectionError within its timeout plus the margin;
    after a killed pub/sub connection, notify_all still wakes every waiter."""
    distlock.configure(wait_cap=0.5, **FAST)
    name = f"sc-{fault}"
    timeout = 8.0 if fault == "restart" else 30.0
    holding = threading.Semaphore(0)
    waiters = [start(_cond_waiter(client, name, timeout, holding), f"cond-waiter-{i}")
               for i in range(3)]
    session = session_for(client)
    for _ in waiters:  # each took the lock (and so the ones before it are waiting)
        assert holding.acquire(timeout=30)
    assert faults.wait_until(lambda: len(session.subscribed_channels()) >= 1, 10)
    time.sleep(0.5)  # the last has joined the queue too
    if fault == "restart":
        faults.restart_server(backend)
    else:
        before = pubsub_clients(client)
        assert faults.kill_pubsub(client) >= 1
        assert faults.wait_until(lambda: bool(pubsub_clients(client) - before), 10)
    cond = distlock.DistCondition(name, client=client)  # type: ignore[attr-defined]
    with cond:
        cond.notify_all()
    for waiter in waiters:
        waiter.join(timeout + 30.0)
    for waiter in waiters:
        waiter.finish(1.0)
        assert waiter.error is None, repr(waiter.error)
        assert waiter.elapsed <= timeout + 15.0
        result, owned = waiter.result
        if fault == "client-kill":
            assert result is True and owned, "a notified waiter was not woken"
        elif result == "ConnectionError":
            pass  # allowed through a restart: raised within the bound, never hung
        else:
            assert result in (True, False) and owned, "wait() returned without the lock"


# --- belief keeps time (docs/safety.rst, "Belief keeps time") ------------------------------------

class RivalHolding:
    """A rival of a holder, in a thread of its own (a thread-owned lock's rival must not be the
    holder's thread): ``wait()`` until it holds the lock, then ``done()`` releases it there."""

    def __init__(self, kind: str, name: str, client: Any, timeout: float) -> None:
        self.lock = rival(kind, name, client)
        self.held = threading.Event()
        self._done = threading.Event()
        self.timeout = timeout
        self.worker = start(self._run, name="rival")

    def _run(self) -> bool:
        got = bool(self.lock.acquire(timeout=self.timeout))
        if got:
            self.held.set()
            self._done.wait(60)
            self.lock.release()
        return got

    def wait(self) -> bool:
        return self.held.wait(self.timeout + SLACK)

    def done(self) -> None:
        self._done.set()
        self.worker.finish(60)
        assert self.worker.error is None, repr(self.worker.error)


@pytest.mark.real_redis
@pytest.mark.parametrize("kind", EXCLUSIVE)
def test_belief_ends_at_a_fixed_leases_deadline(client: Any, kind: str) -> None:
    """A hold with a fixed lease and no watchdog: past its local deadline ``owned()``,
    ``token`` and ``valid_for()`` say "not held" with no round trip, ``on_lost`` fires, another
    client takes the lock, and the late ``release()`` raises LockLostError. (Before, ``owned()``
    stayed True with no end.)"""
    name = f"belief-fixed-{kind}"
    lease = 1.0
    lock = make(kind, name, client, lease=lease)
    lost: List[float] = []
    lock.on_lost(lambda _lock: lost.append(time.monotonic()))
    before = time.monotonic()
    assert lock.acquire(timeout=10)
    after = time.monotonic()
    valid = lock.valid_for() if kind != "DistCondition" else lease
    owned = lock.owned() and lock.token is not None
    if time.monotonic() < before + lease:
        # the acquire's send came after ``before``: its belief lasts at least until
        # ``before + lease`` (a loaded machine can stall this thread for longer: then
        # there is nothing to check here)
        assert valid > 0.0 and owned
    assert valid <= lease
    # the local deadline is the send time plus the lease: between these two
    assert faults.wait_until(lambda: time.monotonic() >= after + lease, 10)
    assert not lock.owned() and lock.token is None
    if kind != "DistCondition":
        assert lock.valid_for() == 0.0
    assert faults.wait_until(lambda: bool(lost), 10.0), "on_lost never fired"
    assert lost[0] >= before + lease  # never before the deadline
    other = RivalHolding(kind, name, client, 10.0)
    try:
        assert other.wait(), "the rival never got the lock"
        with pytest.raises(LockLostError):
            lock.release()
        assert len(lost) == 1, "on_lost ran twice"
    finally:
        other.done()


@pytest.mark.real_redis
def test_belief_ends_at_a_semaphore_permits_deadline(client: Any) -> None:
    """A semaphore permit has no ``owned()``: its ``valid_for()`` and ``on_lost`` keep the
    same rule."""
    sem = distlock.DistSemaphore("belief-sem", 1, client=client, lease=0.5)
    lost: List[float] = []
    sem.on_lost(lambda _sem: lost.append(time.monotonic()))
    assert sem.valid_for() == 0.0
    before = time.monotonic()
    assert sem.acquire(timeout=10)
    after = time.monotonic()
    valid = sem.valid_for()
    assert valid <= 0.5
    if time.monotonic() < before + 0.5:  # not stalled past the lease (see above)
        assert valid > 0.0
    assert faults.wait_until(lambda: time.monotonic() >= after + 0.5, 10)
    assert sem.valid_for() == 0.0
    assert faults.wait_until(lambda: bool(lost), 10.0), "on_lost never fired"
    with pytest.raises(LockLostError):
        sem.release()


@pytest.mark.real_redis
@pytest.mark.parametrize("kind", ["DistLock", "DistRLock", "DistReadWriteLock.write",
                                  "DistReadWriteLock.read"])
def test_belief_ends_before_a_rival_holds_in_a_blackhole(client: Any, proxy: FaultProxy, kind: str) -> None:
    """The holder's link goes silent and stays open (a proxy that forwards nothing: not a closed
    port). Its renewals cannot get through; by the time a rival gets the lock from the server,
    the holder no longer believes it holds it, and ``on_lost`` has fired or fires at once.
    (Before, the holder believed it for about one renewer timeout plus a retry past its lease.)"""
    distlock.configure(**FAST)
    name = f"belief-blackhole-{kind}"
    through = proxy.client()  # redis-py's defaults: no timeout of its own on the user's side
    try:
        lock = make(kind, name, through)
        assert start(lambda: lock.acquire(blocking=False)).finish(10).result is True
        lost: List[float] = []
        lock.on_lost(lambda _lock: lost.append(time.monotonic()))
        proxy.blackhole()
        other = RivalHolding(kind, name, client, FAST["lease"] + 10.0)
        try:
            assert other.wait(), "the rival never got the lock"
            assert not lock.owned(), "two holders believe they hold the lock"
            assert lock.token is None and lock.valid_for() == 0.0
            assert faults.wait_until(lambda: bool(lost), SLACK), "on_lost did not fire"
        finally:
            other.done()
    finally:
        proxy.heal()
        through.close()


@pytest.mark.real_redis
def test_belief_keeps_time_while_a_clean_up_hangs(client: Any, proxy: FaultProxy) -> None:
    """A client that cannot share a session (one connection, no socket timeout) loses its
    network while a clean-up round trip of its session is in flight. The deadline-keeping
    thread does no I/O, so ``on_lost`` fires and ``owned()`` turns False by the time another
    client holds the lock; and the clean-up itself gives up within the library's I/O bound.
    (Before, the watchdog thread sat in that read for ever: no renewal, no ``on_lost``.)"""
    from distlock._redis.clients import DEFAULT_IO_TIMEOUT

    distlock.configure(**FAST)
    name = "belief-chore"
    lonely = proxy.client(single_connection_client=True, socket_timeout=None,
                          socket_connect_timeout=None, retry=Retry(NoBackoff(), 0))
    try:
        lock = distlock.DistLock(name, client=lonely)
        assert start(lambda: lock.acquire(blocking=False)).finish(10).result is True
        lost: List[float] = []
        lock.on_lost(lambda _lock: lost.append(time.monotonic()))
        session = session_for(lonely)
        done: List[Any] = []

        def chore() -> None:
            try:
                session.read("PING")
            except redis.RedisError as exc:
                done.append(exc)

        proxy.blackhole()
        cut = time.monotonic()
        session.defer(chore)
        other = distlock.DistLock(name, client=client)
        assert other.acquire(timeout=FAST["lease"] + 10.0)
        try:
            assert not lock.owned(), "two holders believe they hold the lock"
            assert faults.wait_until(lambda: bool(lost), SLACK), "on_lost did not fire"
        finally:
            other.release()
        assert faults.wait_until(lambda: bool(done), DEFAULT_IO_TIMEOUT + SLACK), "the clean-up hung"
        assert isinstance(done[0], redis.TimeoutError), repr(done[0])
        assert done and time.monotonic() - cut <= DEFAULT_IO_TIMEOUT + 2 * SLACK
    finally:
        proxy.heal()
        lonely.close()


@pytest.mark.real_redis
@pytest.mark.parametrize("kind", ["DistLock", "DistRLock"])
def test_a_restart_suspends_belief_before_the_next_renewal(backend: Any, client: Any, kind: str) -> None:
    """A restart without persistence empties the server: the holder's session sees its
    connection closed and stops believing at once, long before its next renewal (10 s
    away here) would have found the hold gone; the renewal it starts then reports it lost."""
    distlock.configure(lease=30.0, renew_interval=10.0)
    name = f"belief-restart-{kind}"
    lock = make(kind, name, client)
    lost: List[float] = []
    lock.on_lost(lambda _lock: lost.append(time.monotonic()))
    assert lock.acquire(timeout=10)
    assert faults.wait_until(lambda: session_for(client).executor.renewal_reset() is False, 5)
    time.sleep(0.3)  # the watchdog's own connection is open (it opens with the first hold)
    faults.restart_server(backend)
    restarted = time.monotonic()
    assert faults.wait_until(lambda: not lock.owned(), 5.0), "it still believes after the restart"
    assert time.monotonic() - restarted < 10.0 - SLACK  # well before the next renewal
    assert faults.wait_until(lambda: bool(lost), 10.0), "the confirming renewal did not report it lost"
    other = RivalHolding(kind, name, client, 10.0)
    try:
        assert other.wait(), "the rival never got the lock"
    finally:
        other.done()
    with pytest.raises(LockLostError):
        lock.release()


def _watchdog_connection_idle(session: Any) -> None:
    """Wait until the session's watchdog has its own connection open and idle (it opens with
    the first hold, off the caller's path)."""
    assert faults.wait_until(lambda: bool(session.executor.renewal_sockets()), 10.0), \
        "the watchdog's own connection never opened"
    # The thread's wait from before the test patched TICK ends within the old TICK: after
    # that it is in the long one. (If it is not yet, on a loaded machine, it may see the
    # restart first: the test still passes, it just proves less.)
    time.sleep(0.3)


@pytest.mark.real_redis
@pytest.mark.parametrize("kind", ["DistLock", "DistRLock"])
def test_a_restart_ends_belief_at_the_first_check_after_it(
        backend: Any, client: Any, kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The old server is dead and reaped before the new one can grant anything, and its FIN
    reached the holder's kernel with its death: the first belief check after that says "not
    held", whatever the watchdog thread is doing. Here that thread is kept from looking (no
    wait on the socket, a TICK of a minute), so that only the check can see it; before the
    check looked for itself, the holder believed until the thread's next look (up to 0.1 s),
    and the nemesis counted two believers after a restart."""
    distlock.configure(lease=30.0, renew_interval=10.0)
    lock = make(kind, f"belief-check-restart-{kind}", client)
    assert lock.acquire(timeout=10)
    session = session_for(client)
    monkeypatch.setattr(watchdog_module, "TICK", 60.0)
    monkeypatch.setattr(session.watchdog, "_watched", lambda: [])
    _watchdog_connection_idle(session)
    assert lock.owned()
    faults.restart_server(backend)
    assert not lock.owned() and lock.token is None and lock.valid_for() == 0.0
    (hold,) = list(session.watchdog.holds.values())
    assert 0.0 < hold.unbelieved_at <= time.monotonic()
    with pytest.raises(LockLostError):
        lock.release()


@pytest.mark.real_redis
def test_the_watchdog_thread_sees_a_restart_when_the_kernel_does(
        backend: Any, client: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The watchdog thread waits on its idle connection's socket, not only on a timer: with its
    periodic look a minute away and no renewal due for 10 s, it still suspends the hold after a
    restart, nobody having asked (``hold.suspended`` is read directly: ``owned()`` would look
    by itself)."""
    distlock.configure(lease=30.0, renew_interval=10.0)
    lock = distlock.DistLock("belief-thread-restart", client=client)
    assert lock.acquire(timeout=10)
    session = session_for(client)
    monkeypatch.setattr(watchdog_module, "TICK", 60.0)
    _watchdog_connection_idle(session)
    (hold,) = list(session.watchdog.holds.values())
    faults.restart_server(backend)
    assert faults.wait_until(lambda: hold.suspended or hold.lost, 5.0), \
        "the watchdog thread did not wake on the closed connection"
    assert not lock.owned()
    with pytest.raises(LockLostError):
        lock.release()


@contextlib.contextmanager
def _watchdog_kept_from_connecting(session: Any) -> Iterator[None]:
    """Hold the session's renewals worker until the block ends: the watchdog's own connection,
    which opens there after the first hold, opens only then."""
    gate = threading.Event()
    session.watchdog.renewals.submit(lambda: gate.wait(30))
    try:
        yield
    finally:
        gate.set()


@pytest.mark.real_redis
@pytest.mark.parametrize("how", ["restarted", "down"])
@pytest.mark.parametrize("kind", ["DistLock", "DistRLock"])
def test_a_hold_granted_before_the_watchdog_connected_stops_being_believed_at_a_restart(
        backend: Any, client: Any, kind: str, how: str) -> None:
    """A FIN on the watchdog's own connection ends belief when the server restarts, but a hold
    granted before that connection opened has no witness: the server may restart, empty,
    between the grant and the connection, which then opens to the new server (or to none) and
    sees no FIN. The nemesis found a Sentinel holder believing on there while the new master
    granted the name to another process. Belief must end long before the next renewal (10 s)
    or the lease (30 s)."""
    distlock.configure(lease=30.0, renew_interval=10.0)
    lock = make(kind, f"unwitnessed-{kind}-{how}", client)
    session = session_for(client)
    with _watchdog_kept_from_connecting(session):
        assert lock.acquire(timeout=10)
        (hold,) = list(session.watchdog.holds.values())
        assert lock.owned()
        if how == "restarted":
            faults.restart_server(backend)
        else:
            backend.server.kill()
    try:
        assert faults.wait_until(lambda: not lock.owned(), 5.0), \
            "a hold nothing witnessed was believed on after its server restarted"
        if how == "down":
            assert hold.suspended and not hold.lost  # refused: suspended, not yet known gone
        else:
            assert hold.lost  # read back on the new server: gone
    finally:
        if how == "down":
            backend.server.start()
    with pytest.raises(LockLostError):
        lock.release()


@pytest.mark.real_redis
def test_a_reset_link_suspends_belief_until_a_renewal_confirms_it(
        client: Any, proxy: FaultProxy, caplog: pytest.LogCaptureFixture) -> None:
    """Every connection of the holder's session is reset while the server keeps the hold:
    belief is suspended, then the renewal that follows confirms the hold, and it is believed
    again, with the same token, never reported lost."""
    distlock.configure(lease=30.0, renew_interval=10.0)
    through = proxy.client()
    try:
        lock = distlock.DistLock("belief-reset", client=through)
        lost: List[float] = []
        lock.on_lost(lambda _lock: lost.append(time.monotonic()))
        assert start(lambda: lock.acquire(blocking=False)).finish(10).result is True
        token = lock.token
        time.sleep(0.3)  # the watchdog's own connection is open (it opens with the first hold)
        with caplog.at_level("INFO", logger="distlock"):
            assert proxy.reset() > 0
            assert faults.wait_until(
                lambda: any("not believed until a renewal confirms" in r.getMessage()
                            for r in caplog.records), 5.0), "the reset did not suspend belief"
        assert faults.wait_until(lock.owned, 5.0), "the renewal did not confirm the hold"
        assert lock.token == token and not lost
        lock.release()
    finally:
        through.close()
