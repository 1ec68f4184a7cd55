"""Fault tolerance of distlock.asyncio: tests/faults/test_faults.py's scenarios on the asyncio classes
(DistLock and DistRLock throughout; DistSemaphore and DistEvent where they apply, as in
tests/faults/test_faults_sem_event_barrier.py), with the same assertions and the same bounds.

The asyncio side of the test process runs in the ``aio`` fixture's loop (tests/support/_aio.py: one
loop in a thread), so the test thread can break things and look at Redis with the blocking
helpers of tests/support/faults.py while tasks wait. ``aio.call`` runs a call in the test thread's
own task of that loop (a task-owned DistRLock is taken and released there); ``ATask`` runs a
coroutine as a task of its own (another owner), bounded, with its timing. Holder processes
run tests/support/_aio_workers.py's ``async_holder``: an asyncio lock in a loop of its own.

Timing assertions are one-sided, as in tests/faults/test_faults.py: "not before the lease" and
"within a generous bound". Every task, process, proxy and client is ended by the test or its
fixtures (``aio``, ``children``, ``proxy``); keys go with the fixture's FLUSHDB.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import signal
import threading
import time
import uuid
from typing import Any, Callable, Dict, Iterator, List, Optional

import _aio_workers
import faults
import pytest
import redis
from _aio_workers import Mailbox, make_async
from _support import renewals_seen
from faults import FaultProxy, FencedResource
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import NoBackoff
from test_faults import (
    FAST,
    RETRIES,
    SLACK,
    SOCKET_TIMEOUT,
    TAKER,
    WATCHED,
    B,
    lease_left_ms,
    numsub,
    pubsub_clients,
)
from test_faults_sem_event_barrier import permit_left_ms

import distlock
import distlock.asyncio as aio_
from distlock import LockLostError
from distlock._core.keys import EventKeys
from distlock._redis.clients import DEFAULT_IO_TIMEOUT

pytestmark = pytest.mark.real_redis

KINDS = ["DistLock", "DistRLock"]
PUBSUB_FAULTS = ["client-kill", "proxy-reset", "proxy-drop"]


# --- fixtures and helpers ------------------------------------------------------------------

@pytest.fixture
def proxy(url: str) -> Iterator[FaultProxy]:
    port = int(url.rsplit(":", 1)[1].split("/")[0])
    with FaultProxy("127.0.0.1", port) as px:
        yield px


@pytest.fixture
def resource(tmp_path: Any) -> FencedResource:
    return FencedResource(str(tmp_path))


def _unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


class Hangs(AssertionError):
    """A task still ran long after its bound."""


class ATask:
    """``make()`` awaited in a task of its own in the runner's loop: its result or error, and
    when it started and ended (monotonic)."""

    def __init__(self, runner: Any, make: Callable[[], Any]) -> None:
        self.started_at = 0.0
        self.ended_at = 0.0
        self.result: Any = None
        self.error: Optional[BaseException] = None

        async def run() -> Any:
            self.started_at = time.monotonic()
            try:
                return await make()
            finally:
                self.ended_at = time.monotonic()

        self.future = asyncio.run_coroutine_threadsafe(run(), runner.loop)

    def finish(self, timeout: float) -> ATask:
        concurrent.futures.wait([self.future], timeout)
        if not self.future.done():
            self.future.cancel()
            raise Hangs(f"the task still runs after {timeout} s: it hangs")
        self.error = self.future.exception()
        if self.error is None:
            self.result = self.future.result()
        return self

    @property
    def elapsed(self) -> float:
        return self.ended_at - self.started_at


def bounded_async_client(runner: Any, port: int) -> Any:
    """tests/faults/test_faults.py's ``bounded_client``, asyncio: one command gives up after B s."""
    return runner.client(f"redis://127.0.0.1:{port}/0", socket_timeout=SOCKET_TIMEOUT,
                         socket_connect_timeout=SOCKET_TIMEOUT,
                         retry=AsyncRetry(NoBackoff(), RETRIES))


def waited_channels(client: Any, name: str) -> List[str]:
    """The pub/sub channels of ``name`` someone is subscribed to now (server side)."""
    return sorted(c.decode() for c in client.pubsub_channels(f"distlock:{{{name}}}*"))


def at_rest(client: Any, name: str) -> List[bytes]:
    return sorted(client.scan_iter(match=f"distlock:{{{name}}}*"))


def lease_left(client: Any, kind: str, name: str) -> int:
    """The longest remaining lease of a hold of ``name`` (-1 when nothing holds it)."""
    if kind == "DistSemaphore":
        return permit_left_ms(client, name)
    return lease_left_ms(client, name)


def _lost_recorder(runner: Any, into: List[Any]) -> Callable[[Any], None]:
    """An ``on_lost`` callback that records when it ran and whether in the runner's loop."""
    def lost(subject: Any) -> None:
        into.append((time.monotonic(), asyncio.get_running_loop() is runner.loop, subject))
    return lost


# --- 1. holder process killed with SIGKILL ----------------------------------------------------

@pytest.mark.cluster_too
@pytest.mark.parametrize("lease", [1.0, None], ids=["explicit-lease", "watchdog"])
@pytest.mark.parametrize("kind", [*KINDS, "DistSemaphore"])
def test_1_sigkilled_async_holder_frees_after_lease_never_before(
        url: str, client: Any, aio: Any, children: Any, kind: str, lease: Optional[float]) -> None:
    """A process holds through an asyncio lock (short lease, or the watchdog with a short
    one) and is killed: an asyncio waiter gets the lock when the lease runs out, not before,
    and within a bound; its token is above the dead holder's."""
    name = _unique(f"as1-{kind}")
    # the probe's client is warmed up on another name first, before the holder's lease starts
    # (a cluster client finds its slots on its first call), so that its first try on ``name``
    # is one round trip
    aclient = aio.client(url)
    probe, warm = make_async(kind, name, aclient), make_async(kind, f"{name}-warm", aclient)

    async def warm_up() -> None:
        assert await warm.acquire(blocking=False)
        await warm.release()

    aio.call(warm_up)
    holder = Mailbox(children.start(_aio_workers.async_holder, url, kind, name, lease,
                                    FAST if lease is not None else WATCHED))
    _, first, acquired_at, pid, ok = holder.take("acquired", 60)
    assert ok is True
    if lease is None:  # the watchdog keeps the hold alive: its renewals reach the server
        renewals_seen(lambda: lease_left(client, kind, name), 2, what=f"{name} (its watchdog's)")
    killed = time.monotonic()
    os.kill(pid, signal.SIGKILL)
    children.procs[-1].join(10)

    sent = time.monotonic()
    left = lease_left(client, kind, name)
    # The hold outlives its holder until its lease runs out: it must still be there, unless a
    # loaded machine took that long to look (time.monotonic() is one clock for the host).
    ran_out = acquired_at + lease if lease is not None else killed + WATCHED["lease"]
    assert left > 0 or sent >= ran_out - 0.010, \
        "the hold vanished with its holder, before its lease ran out"

    async def take() -> Any:
        tried = time.monotonic()
        refused = await probe.acquire(blocking=False)
        if refused:  # only where the lease had run out by then (a loaded machine): see below
            await probe.release()
        ok = await probe.acquire(timeout=left / 1000.0 + 15.0)
        got, token = time.monotonic(), probe.token
        again = await probe.acquire(blocking=False) if kind == "DistSemaphore" else None
        if ok:
            await probe.release()
        return refused, tried, ok, got, token, again

    refused, tried, ok, got, token, again = aio.call(take)
    # A try sent after the lease ran out may take the lock (a loaded machine can take that
    # long to reach it); one sent before must not.
    assert refused is False or tried >= sent + left / 1000.0 - 0.010, \
        "a try took the lock before the killed holder's lease ran out"
    assert ok is True
    assert got >= sent + left / 1000.0 - 0.010, "acquired before the killed holder's lease ran out"
    assert got - sent <= left / 1000.0 + 15.0
    if kind == "DistSemaphore":
        assert again is False, "the dead holder's permit came back twice"
    else:
        assert token > first
    assert faults.wait_until(lambda: lease_left(client, kind, name) < 0, 10)


# --- 2. holder process stopped past its lease, then continued --------------------------------

@pytest.mark.cluster_too
@pytest.mark.parametrize("lease", [1.0, None], ids=["explicit-lease", "watchdog"])
@pytest.mark.parametrize("kind", KINDS)
def test_2_sigstopped_async_holder_past_lease_then_sigcont(
        url: str, client: Any, aio: Any, children: Any, resource: FencedResource, kind: str,
        lease: Optional[float]) -> None:
    """The stopped holder's lock goes to an asyncio waiter; once continued, the holder's
    ``on_lost`` runs in its own loop (found by its watchdog, or by its release), its release
    raises LockLostError, its stale write is refused, and the new hold is untouched."""
    # The holder runs on FAST; the taker's lease is longer, so that a loaded machine's late
    # renewal cannot end its belief while the checks below run (they read that belief).
    distlock.configure(**TAKER)
    name = _unique(f"as2-{kind}")
    holder = Mailbox(children.start(_aio_workers.async_holder, url, kind, name, lease, FAST))
    _, old, _at, pid, ok = holder.take("acquired", 60)
    assert ok is True
    holder.send(("write", resource, old))
    assert holder.take("write")[1] is True

    mine = make_async(kind, name, aio.client(url))
    mine_lost: List[Any] = []
    mine.on_lost(mine_lost.append)
    os.kill(pid, signal.SIGSTOP)
    try:
        async def take_over() -> Any:
            ok = await mine.acquire(timeout=20)
            return ok, mine.token  # read as the acquire returns: a loaded machine may take
            # longer than the short lease before a second call reaches the loop

        ok, new = aio.call(take_over)
        assert ok is True, "nobody could take over from the stopped holder"
        assert new > old
        assert resource.write(new, "taker")
    finally:
        os.kill(pid, signal.SIGCONT)
    try:
        if lease is None:  # the watchdog found the hold someone else's
            _, _when, in_loop, in_thread, handed = holder.take("on_lost", 20)
            assert (in_loop, in_thread, handed) == (True, True, True), "on_lost ran outside its loop"
        holder.send(("write", resource, old))
        assert holder.take("write")[1] is False, "the fenced resource took a stale write"
        holder.send(("release",))
        assert holder.take("release")[1] == "LockLostError"
        if lease is not None:  # found by release() itself
            _, _when, in_loop, in_thread, handed = holder.take("on_lost", 10)
            assert (in_loop, in_thread, handed) == (True, True, True), "on_lost ran outside its loop"
        assert not holder.has("on_lost", 0.3), "on_lost ran twice"
        holder.send(("owned",))
        assert holder.take("owned")[1:] == (False, None)
        assert aio.call(mine.owned) is True and aio.call(lambda: mine.token) == new, \
            "the late release touched the new hold"
        assert lease_left_ms(client, name) > 0
    finally:
        aio.call(lambda: mine.release())
    holder.send(("exit",))
    assert mine_lost == []
    log = resource.log()
    accepted = [w.token for w in log if w.accepted]
    assert accepted == sorted(accepted) and old in accepted and new in accepted
    assert [w.token for w in log if not w.accepted] == [old]


# --- 3. Redis restarted without persistence ----------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("kind", KINDS)
def test_3_redis_restart_while_async_held_and_waited(backend: Any, url: str, client: Any, aio: Any,
                                                     kind: str) -> None:
    """Holds are reported lost (the watchdog's by itself, in the loop; the explicit lease's at
    release), waiting tasks return or raise ConnectionError within their bound, tokens after
    the restart are above every token before it, and the locks work again."""
    distlock.configure(**FAST)
    timeout = 10.0
    ac = aio.client(url)
    names = [_unique(f"as3-{kind}-watchdog"), _unique(f"as3-{kind}-lease")]
    held = [make_async(kind, names[0], ac), make_async(kind, names[1], ac, lease=30.0)]
    lost: Dict[int, Any] = {}
    before: List[int] = []

    async def take_all() -> None:
        for i, lock in enumerate(held):
            for _ in range(3):  # a few grants, so the fence counters have a history
                assert await lock.acquire(blocking=False)
                before.append(lock.token)
                await lock.release()
            assert await lock.acquire(blocking=False)
            before.append(lock.token)
            lock.on_lost(lambda _lock, i=i: lost.setdefault(
                i, (time.monotonic(), asyncio.get_running_loop() is aio.loop)))

    aio.call(take_all)
    after: List[int] = []

    async def wait_for(name: str) -> str:
        lock = make_async(kind, name, ac, lease=5.0)
        try:
            ok = await lock.acquire(timeout=timeout)
        except redis.exceptions.ConnectionError:
            return "ConnectionError"
        if ok:
            after.append(lock.token)
            await lock.release()
        return str(ok)

    waiters = [ATask(aio, lambda n=n: wait_for(n)) for n in names for _ in range(2)]
    assert faults.wait_until(lambda: all(waited_channels(client, n) for n in names), 10)
    assert faults.wait_until(lambda: all(client.zcard(f"distlock:{{{n}}}:q") >= 1 for n in names), 10)
    faults.restart_server(backend)
    for waiter in waiters:
        waiter.finish(timeout + 30.0)
        assert waiter.error is None, repr(waiter.error)
        assert waiter.result in ("True", "False", "ConnectionError")
        assert waiter.elapsed <= timeout + 15.0
    # tests/faults/test_faults.py also asserts here that most waiters take the freed locks; asyncio
    # waiters all raise ConnectionError instead (a stale connection, see the next test)

    assert faults.wait_until(lambda: 0 in lost, 15), "the watchdog did not report the lost lease"
    for lock in held:
        with pytest.raises(LockLostError):
            aio.call(lambda lock=lock: lock.release())
    assert faults.wait_until(lambda: 1 in lost, 5)  # on_lost runs in the loop, soon after
    assert all(in_loop for _when, in_loop in lost.values()), "on_lost ran outside the loop"
    for name in names:  # grants after the restart, by waiters or by a fresh lock
        lock = make_async(kind, name, ac)
        assert aio.call(lambda lock=lock: lock.acquire(timeout=10)) is True
        after.append(aio.call(lambda lock=lock: lock.token))
        aio.call(lambda lock=lock: lock.release())
    assert min(after) > max(before), (before, after)



@pytest.mark.parametrize("kind", KINDS)
def test_3_first_acquire_after_a_restart_succeeds_as_in_threads(backend: Any, url: str, client: Any,
                                                                aio: Any, kind: str) -> None:
    """A restart closes every connection. The blocking lock's next acquire takes a fresh one
    and succeeds (the control below); so must the asyncio lock's, whose waiters through a
    restart (scenario 3) otherwise all raise ConnectionError instead of taking the freed lock."""
    name = _unique(f"as3f-{kind}")
    sync_lock = distlock.DistLock(f"{name}-sync", client=client)
    lock = make_async(kind, name, aio.client(url))

    async def once() -> bool:
        ok = bool(await lock.acquire(timeout=5))
        if ok:
            await lock.release()
        return ok

    assert sync_lock.acquire(blocking=False)
    sync_lock.release()
    assert aio.call(once) is True  # its connection is open, idle
    faults.restart_server(backend)
    time.sleep(0.3)  # the loop sees the closed connection
    assert sync_lock.acquire(timeout=5) is True, "the control failed: the blocking lock too"
    sync_lock.release()
    assert aio.call(once) is True


@pytest.mark.parametrize("kind", KINDS)
def test_3_a_restart_ends_an_async_holds_belief_at_the_first_check(
        backend: Any, url: str, aio: Any, kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """test_faults' ``test_a_restart_ends_belief_at_the_first_check_after_it``, for a task: its
    hold lives in the blocking session of the same server, whose watchdog connection the
    check peeks at, so the first check after the restart says "not held" (the watchdog thread
    is kept from looking)."""
    from test_faults import _watchdog_connection_idle

    from distlock._session import watchdog as watchdog_module

    distlock.configure(lease=30.0, renew_interval=10.0)
    lock = make_async(kind, _unique(f"as3b-{kind}"), aio.client(url))
    assert aio.call(lambda: lock.acquire(timeout=10)) is True
    session = aio.call(lock._session)  # the asyncio port's, in its loop: the blocking one
    monkeypatch.setattr(watchdog_module, "TICK", 60.0)
    monkeypatch.setattr(session.watchdog, "_watched", lambda: [])
    _watchdog_connection_idle(session)
    assert aio.call(lock.owned) is True
    faults.restart_server(backend)
    assert aio.call(lambda: (lock.owned(), lock.token, lock.valid_for())) == (False, None, 0.0)
    with pytest.raises(LockLostError):
        aio.call(lock.release)


@pytest.mark.parametrize("kind", KINDS)
def test_3_an_async_hold_granted_before_the_watchdog_connected_stops_being_believed(
        backend: Any, url: str, aio: Any, kind: str) -> None:
    """test_faults' ``test_a_hold_granted_before_the_watchdog_connected_stops_being_believed_at_a_restart``,
    for a task (the nemesis's Sentinel restart phase found it in this shell): the server
    restarts, empty, before the blocking session's watchdog has a connection to witness the
    hold with; the connection, once open, reads back the hold sent before it began to open:
    gone."""
    from test_faults import _watchdog_kept_from_connecting

    distlock.configure(lease=30.0, renew_interval=10.0)
    lock = make_async(kind, _unique(f"as3c-{kind}"), aio.client(url))
    session = aio.call(lock._session)
    with _watchdog_kept_from_connecting(session):
        assert aio.call(lambda: lock.acquire(timeout=10)) is True
        assert aio.call(lock.owned) is True
        faults.restart_server(backend)
    assert faults.wait_until(lambda: aio.call(lock.owned) is False, 5.0), \
        "a hold nothing witnessed was believed on after its server restarted"
    with pytest.raises(LockLostError):
        aio.call(lock.release)


# --- 4. the pub/sub connection is killed while tasks wait -------------------------------------

@pytest.mark.parametrize("how", PUBSUB_FAULTS)
@pytest.mark.parametrize("kind", [*KINDS, "DistSemaphore"])
def test_4_pubsub_connection_killed_while_tasks_wait(url: str, client: Any, proxy: FaultProxy,
                                                     aio: Any, kind: str, how: str) -> None:
    """Three tasks wait; their loop's pub/sub connection is killed (CLIENT KILL), reset, or
    silently dropped; then the holder releases: every task still gets the lock, within the
    bound the polling gives (wait_cap * queue_cap_factor = 5 s, well under 20 s)."""
    distlock.configure(wait_cap=0.5)
    name = _unique(f"as4-{kind}")
    user = aio.client(url if how == "client-kill" else proxy.url)
    holder = make_async(kind, name, aio.client(url))
    assert aio.call(lambda: holder.acquire(blocking=False)) is True
    got: List[Any] = []

    async def wait() -> bool:
        lock = make_async(kind, name, user)
        ok = bool(await lock.acquire(timeout=30))
        if ok:
            got.append(lock.token)
            await lock.release()
        return ok

    waiters = [ATask(aio, wait) for _ in range(3)]
    try:
        assert faults.wait_until(lambda: bool(waited_channels(client, name)), 10)
        channel = waited_channels(client, name)[0]
        before = pubsub_clients(client)
        if how == "client-kill":
            assert faults.kill_pubsub(client) >= 1
        elif how == "proxy-reset":
            assert proxy.reset_pubsub() >= 1
        else:
            proxy.drop_pubsub(True)
        if how != "proxy-drop":
            # a new pub/sub connection of the loop is subscribed to the channel again
            assert faults.wait_until(
                lambda: bool(pubsub_clients(client) - before) and numsub(client, channel) >= 1,
                10), "the pub/sub connection was not re-established"
    finally:
        aio.call(lambda: holder.release())
    released = time.monotonic()
    for waiter in waiters:
        waiter.finish(40)
        assert waiter.error is None, repr(waiter.error)
        assert waiter.result is True
        assert waiter.ended_at - released < 20.0
    assert len(got) == 3
    if kind != "DistSemaphore":
        assert len(set(got)) == 3 and all(isinstance(t, int) for t in got)
    proxy.drop_pubsub(False)


# --- 5. the server stops answering during acquire(timeout=1) -------------------------------

@pytest.mark.parametrize("when", ["before", "while-waiting", "latency", "sigstop-server"])
@pytest.mark.parametrize("kind", KINDS)
def test_5_server_stops_answering_during_async_acquire(backend: Any, url: str, client: Any,
                                                       proxy: FaultProxy, aio: Any, kind: str,
                                                       when: str) -> None:
    """acquire(timeout=1) through a blackholed link, a slow one, or to a SIGSTOPped server
    returns False or raises a redis ConnectionError/TimeoutError within 1 + 2 * B + slack
    (tests/faults/test_faults.py's margin), leaving no hold; once the server answers again, the lock
    works again."""
    distlock.configure(wait_cap=0.5)
    name = _unique(f"as5-{kind}")
    other = distlock.DistLock(name, client=client)  # the same lock, held by the blocking shell
    assert other.acquire(blocking=False)
    port = backend.server.port if when == "sigstop-server" else proxy.port
    victim = make_async(kind, name, bounded_async_client(aio, port))

    async def attempt() -> Any:
        try:
            return "returned", await victim.acquire(timeout=1), victim.owned()
        except Exception as exc:  # noqa: BLE001 - inspected by the test
            return "raised", exc, victim.owned()

    server_pid = backend.server.proc.pid
    stopped = False
    try:
        assert ATask(aio, attempt).finish(10).result == ("returned", False, False)  # all is well
        if when == "before":
            proxy.blackhole()
            worker = ATask(aio, attempt)
        elif when == "while-waiting":
            worker = ATask(aio, attempt)
            time.sleep(0.3)
            proxy.blackhole()
        elif when == "latency":
            proxy.delay(SOCKET_TIMEOUT * 0.8 * 1000)  # each way: every reply comes too late
            worker = ATask(aio, attempt)
        else:
            os.kill(server_pid, signal.SIGSTOP)
            stopped = True
            worker = ATask(aio, attempt)
        worker.finish(60)
        assert worker.error is None, repr(worker.error)
        assert worker.elapsed <= 1.0 + 2 * B + SLACK, worker.elapsed
        how, value, owned = worker.result
        if how == "raised":
            assert isinstance(value, (redis.exceptions.ConnectionError,
                                      redis.exceptions.TimeoutError)), repr(value)
        else:
            assert value is False
        assert owned is False
    finally:
        if stopped:
            os.kill(server_pid, signal.SIGCONT)
        proxy.heal()
        proxy.delay(0)
        other.release()

    async def works_again() -> bool:
        ok = bool(await victim.acquire(timeout=5))
        if ok:
            await victim.release()
        return ok

    again = ATask(aio, works_again).finish(60)
    assert again.error is None and again.result is True, "the lock did not work again"
    fence = f"distlock:{{{name}}}:fence".encode()
    assert faults.wait_until(lambda: at_rest(client, name) == [fence], 10), at_rest(client, name)


@pytest.mark.parametrize("lease", [1.0, None], ids=["explicit-lease", "watchdog"])
@pytest.mark.parametrize("kind", KINDS)
def test_5_lost_grant_reply_does_not_outlive_its_lease(client: Any, proxy: FaultProxy, aio: Any,
                                                       kind: str, lease: Optional[float]) -> None:
    """The server grants, the reply is lost: the task gets an error (never True or False),
    and the orphan hold ends with its lease (nobody renews it)."""
    orphan_lease = 4.0  # longer than B, or the orphan would be gone before the error arrives
    distlock.configure(lease=orphan_lease, renew_interval=1.0)
    name = _unique(f"as5r-{kind}")
    victim = make_async(kind, name, bounded_async_client(aio, proxy.port),
                        lease=None if lease is None else orphan_lease)

    async def attempt() -> Any:
        try:
            return "returned", await victim.acquire(timeout=1), victim.owned()
        except Exception as exc:  # noqa: BLE001 - inspected by the test
            return "raised", exc, victim.owned()

    async def once() -> None:
        assert await victim.acquire(blocking=False)  # scripts loaded, connection up
        await victim.release()

    try:
        ATask(aio, once).finish(10)
        proxy.blackhole("replies")
        worker = ATask(aio, attempt).finish(60)
        assert worker.error is None, repr(worker.error)
        assert worker.elapsed <= 1.0 + 2 * B + SLACK
        how, value, owned = worker.result
        assert how == "raised" and isinstance(value, (redis.exceptions.ConnectionError,
                                                      redis.exceptions.TimeoutError)), repr(value)
        assert owned is False
        left = lease_left_ms(client, name)
        assert 0 < left <= orphan_lease * 1000, "the orphan grant has no lease, or a longer one"
        time.sleep(left / 1000.0 + 0.5)  # past its lease, with watchdog rounds in between
        assert lease_left_ms(client, name) < 0, "the orphan grant outlived its lease"
        probe = distlock.DistLock(name, client=client)
        assert probe.acquire(blocking=False)
        probe.release()
    finally:
        proxy.heal()



@pytest.mark.parametrize("kind", ["DistLock"])  # the bound is the port's, whatever the primitive
def test_5_client_without_socket_timeout_cannot_hang(client: Any, proxy: FaultProxy, aio: Any,
                                                     kind: str) -> None:
    """An asyncio client with socket_timeout=None would wait for ever on a blackholed server;
    as with the blocking classes (whose session talks through a twin bounded by
    DEFAULT_IO_TIMEOUT), acquire(timeout=1) must still return or raise within
    1 + 2 * DEFAULT_IO_TIMEOUT + slack."""
    name = _unique(f"as5n-{kind}")
    other = distlock.DistLock(name, client=client)
    assert other.acquire(blocking=False)
    unbounded = aio.client(proxy.url, socket_timeout=None, socket_connect_timeout=None,
                           retry=AsyncRetry(NoBackoff(), 0))
    victim = make_async(kind, name, unbounded)
    bound = 1.0 + 2 * DEFAULT_IO_TIMEOUT + SLACK
    try:
        assert ATask(aio, lambda: victim.acquire(blocking=False)).finish(10).result is False
        proxy.blackhole()
        worker = ATask(aio, lambda: victim.acquire(timeout=1))
        concurrent.futures.wait([worker.future], bound + 5.0)
        hung = not worker.future.done()
    finally:
        proxy.heal()  # resets the blackholed connections: a hung task ends now
        other.release()
    worker.finish(30)
    if hung:
        raise Hangs(f"acquire(timeout=1) still waited after {bound + 5.0} s")
    assert worker.elapsed <= bound, worker.elapsed
    assert isinstance(worker.error, (redis.exceptions.ConnectionError,
                                     redis.exceptions.TimeoutError)), repr(worker.error)


@pytest.mark.parametrize("kind", KINDS)
def test_5_watchdog_reports_a_lease_lost_in_a_blackhole(client: Any, proxy: FaultProxy, aio: Any,
                                                        kind: str) -> None:
    """The holder's link to Redis goes silent: the watchdog thread's renewals time out, and
    on_lost runs in the holder's loop about when the lease runs out."""
    distlock.configure(**FAST)
    name = _unique(f"as5w-{kind}")
    lock = make_async(kind, name, aio.client(proxy.url))  # this redis-py's default timeouts
    lost: List[Any] = []
    lock.on_lost(_lost_recorder(aio, lost))
    try:
        assert aio.call(lambda: lock.acquire(blocking=False)) is True
        time.sleep(FAST["lease"])  # renewals go through
        assert not lost
        proxy.blackhole()
        cut = time.monotonic()
        assert faults.wait_until(lambda: bool(lost), FAST["lease"] + 10.0), "lease lost in silence"
        when, in_loop, subject = lost[0]
        assert when - cut <= FAST["lease"] + 2 * FAST["renew_interval"] + SLACK
        assert in_loop is True and subject is lock
        assert faults.wait_until(lambda: lease_left_ms(client, name) < 0, 10)
        assert aio.call(lock.owned) is False
    finally:
        proxy.heal()


# --- 6. SCRIPT FLUSH in the middle of a run ---------------------------------------------------

@pytest.mark.cluster_too
@pytest.mark.parametrize("kind", KINDS)
def test_6_script_flush_mid_run(url: str, client: Any, aio: Any, kind: str) -> None:
    """Scripts flushed every 10 ms while three tasks take turns and a fourth hold is renewed:
    the asyncio port loads them again (NOSCRIPT), no update is lost, no renewal fails. The
    kept hold's lease is 3 s, renewed every 0.3 s: a renewal that comes late on a loaded
    machine (the tasks, the flushes and a cluster's script loads all share two cores) is not
    taken for one that failed; one that failed for good still loses it."""
    distlock.configure(**{**FAST, "lease": 3.0})
    name = _unique(f"as6-{kind}")
    ac = aio.client(url)
    kept = make_async(kind, f"{name}-kept", ac)
    assert aio.call(lambda: kept.acquire(blocking=False)) is True
    lost: List[Any] = []
    kept.on_lost(lost.append)
    counter = f"as6-counter-{kind}"
    stop = threading.Event()

    def flusher() -> int:
        n = 0
        while not stop.is_set() and n < 400:
            client.script_flush()
            n += 1
            time.sleep(0.01)
        return n

    async def work() -> int:
        lock = make_async(kind, name, ac)
        for _ in range(40):
            assert await lock.acquire(timeout=20)
            try:
                await ac.set(counter, int(await ac.get(counter) or 0) + 1)
            finally:
                await lock.release()
        return 40

    flushes: List[int] = []
    flush = threading.Thread(target=lambda: flushes.append(flusher()), name="flusher", daemon=True)
    flush.start()
    try:
        workers = [ATask(aio, work) for _ in range(3)]
        for worker in workers:
            worker.finish(120)
            assert worker.error is None, repr(worker.error)
        # renewals across flushes, seen on the server (not a sleep past the lease)
        renewals_seen(lambda: lease_left(client, kind, f"{name}-kept"), 2,
                      what=f"{name}-kept (its watchdog's)")
    finally:
        stop.set()
        flush.join(30)
    assert flushes and flushes[0] > 10
    assert int(client.get(counter)) == 120
    assert aio.call(kept.owned) and not lost, "a renewal failed for good after SCRIPT FLUSH"
    aio.call(lambda: kept.release())


# --- DistEvent: restart, pub/sub faults ----------------------------------------------------

@pytest.mark.parametrize("fault", ["restart", *PUBSUB_FAULTS])
def test_event_async_waiters_survive_restart_and_pubsub_faults(backend: Any, url: str, client: Any,
                                                               proxy: FaultProxy, aio: Any,
                                                               fault: str) -> None:
    """Waiting tasks never hang: through a restart each returns True or raises ConnectionError
    within its bound; after a broken pub/sub connection, set() still wakes every one."""
    distlock.configure(wait_cap=0.5)
    name = _unique(f"ase-{fault}")
    timeout = 8.0 if fault == "restart" else 30.0
    user = aio.client(url if fault in ("restart", "client-kill") else proxy.url)
    keys = EventKeys.of(distlock.configure().prefix, name)

    async def wait() -> Any:
        try:
            return await aio_.DistEvent(name, client=user).wait(timeout)
        except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError):
            return "ConnectionError"

    waiters = [ATask(aio, wait) for _ in range(3)]
    assert faults.wait_until(lambda: client.zcard(keys.waiters) == 3, 10)
    assert faults.wait_until(lambda: numsub(client, keys.channel) >= 1, 10)
    if fault == "restart":
        faults.restart_server(backend)
    else:
        before = pubsub_clients(client)
        if fault == "client-kill":
            assert faults.kill_pubsub(client) >= 1
        elif fault == "proxy-reset":
            assert proxy.reset_pubsub() >= 1
        else:
            proxy.drop_pubsub(True)
        if fault != "proxy-drop":
            assert faults.wait_until(
                lambda: bool(pubsub_clients(client) - before) and numsub(client, keys.channel) >= 1,
                10), "the pub/sub connection was not re-established"
    event = aio_.DistEvent(name, client=aio.client(url))
    aio.call(lambda: event.set())
    released = time.monotonic()
    for waiter in waiters:
        waiter.finish(timeout + 30.0)
        assert waiter.error is None, repr(waiter.error)
        assert waiter.elapsed <= timeout + 15.0
        if fault == "restart":
            assert waiter.result in (True, "ConnectionError"), waiter.result
        else:
            assert waiter.result is True, "set() did not wake a waiting task"
            assert waiter.ended_at - released < 20.0
    aio.call(lambda: event.clear())
    proxy.drop_pubsub(False)
    assert faults.wait_until(lambda: at_rest(client, name) == [], 10), at_rest(client, name)
