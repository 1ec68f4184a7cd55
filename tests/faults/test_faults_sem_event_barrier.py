"""Fault tolerance of the sync primitives (issue 7): DistSemaphore, DistBoundedSemaphore,
DistEvent and DistBarrier, through the scenarios of tests/faults/test_faults.py that apply to them.

tests/faults/test_faults.py runs every scenario over ``faults.PRIMITIVES``, the exclusive lock-like
primitives. The ones here are not lock-like, so each scenario is taken where it applies:

- Semaphores: permits with leases, renewed by the session watchdog, but no fencing token and
  no owner check (any thread anywhere may release, see ``DistSemaphore``). So the parts that
  need a token do not apply: the fenced resource of scenarios 2 and 9, "tokens after a restart
  are above every token before it" of 3. Instead they check the count: a lost permit comes
  back once, and a late release does not raise the count. Scenario 5 (a lost grant reply)
  and 8 (pool exhausted) are the session's code, shared with the locks; 10 (pre-fork) is
  ``test_semaphore.test_fork_child_owns_nothing`` and the fork tests of
  tests/primitives/test_sem_event_barrier_edges.py, which also holds the out-of-memory cases of DistEvent and
  DistBarrier and a barrier whose state was lost (restart, a party stopped past its lease).
- DistEvent holds nothing but a waiter's short-lived entry: only "never hangs" (3, 4, 5) and
  "set() still wakes" apply.
- DistBarrier: a waiting party holds a lease. Its pub/sub wake-ups (4) and a party that dies
  while every party has a timeout (1) apply; its lease-runs-out-without-timeout case is
  ``test_barrier.test_sigkilled_party_breaks_the_barrier``.

Bounds are as in tests/faults/test_faults.py: one-sided ("not before the lease", "within a generous
bound"), every loop bounded, every thread and process joined or killed.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
import time
from typing import Any, Callable, Dict, Iterator, List, Optional

import _sem_event_barrier_workers
import faults
import pytest
import redis
from _support import renewals_seen, sem_permits
from faults import SEMAPHORES, FaultProxy, Holder
from test_faults import FAST, SLACK, B, bounded_client, numsub, pubsub_clients, start

import distlock
from distlock import LockLostError
from distlock._core.keys import BarrierKeys, EventKeys, SemKeys
from distlock._session.session import reset_sessions, session_for
from distlock.testing.server import RedisServer

SPAWN = multiprocessing.get_context("spawn")

needs_sync = pytest.mark.skipif(not SEMAPHORES or not hasattr(distlock, "DistBarrier"),
                                reason="the sync primitives are not in this tree yet")
pytestmark = needs_sync


# --- fixtures and helpers ------------------------------------------------------------------

@pytest.fixture
def proxy(url: str) -> Iterator[FaultProxy]:
    port = int(url.rsplit(":", 1)[1].split("/")[0])
    with FaultProxy("127.0.0.1", port) as px:
        yield px


@pytest.fixture
def holders() -> Iterator[Callable[..., Holder]]:
    made: List[Holder] = []

    def start_holder(*args: Any, **kwargs: Any) -> Holder:
        holder = Holder(*args, **kwargs)
        made.append(holder)
        return holder

    try:
        yield start_holder
    finally:
        for holder in made:
            holder.cleanup()


@pytest.fixture
def spawned() -> Iterator[Callable[..., Any]]:
    """Start a worker of tests/support/_sem_event_barrier_workers.py in a spawned process;
    returns (process, pipe end). Every one is killed and reaped afterwards."""
    made: List[Any] = []

    def spawn(target: Callable[..., None], *args: Any) -> Any:
        parent, child = SPAWN.Pipe()
        proc = SPAWN.Process(target=target, args=(*args, child), daemon=True)
        proc.start()
        child.close()
        made.append((proc, parent))
        return proc, parent

    try:
        yield spawn
    finally:
        for proc, conn in made:
            conn.close()
            if proc.is_alive():
                proc.kill()
            proc.join(10.0)


def recv(conn: Any, timeout: float) -> Any:
    assert conn.poll(timeout), f"no message within {timeout} s"
    return conn.recv()


def sem(kind: str, name: str, client: Any, value: int = 1, lease: Optional[float] = None) -> Any:
    return getattr(distlock, kind)(name, value, client=client, lease=lease)


def sem_keys(name: str) -> SemKeys:
    return SemKeys.of(distlock.configure().prefix, name)


def permits(client: Any, name: str) -> List[Any]:
    """The permits recorded for semaphore ``name`` (expired ones included), counters left out."""
    return sem_permits(client, sem_keys(name).sem)


def permit_left_ms(client: Any, name: str) -> int:
    """The longest remaining lease of a live permit of ``name``; -1 when none is held."""
    seconds, micros = client.time()
    now_ms = seconds * 1000 + micros // 1000
    left = [int(deadline - now_ms) for _member, deadline in permits(client, name)
            if deadline > now_ms]
    return max(left, default=-1)


def keys_of(client: Any, name: str) -> List[bytes]:
    return sorted(client.scan_iter(match=f"distlock:{{{name}}}*"))


def at_rest(client: Any, name: str) -> bool:
    return keys_of(client, name) == []


def break_pubsub(how: str, client: Any, proxy: FaultProxy, channel: str) -> None:
    """Scenario 4's three faults: CLIENT KILL TYPE pubsub, an RST of the proxied pub/sub
    connection, or its traffic silently dropped. After the first two a new pub/sub connection
    is subscribed to ``channel`` again."""
    before = pubsub_clients(client)
    if how == "client-kill":
        assert faults.kill_pubsub(client) >= 1
    elif how == "proxy-reset":
        assert proxy.reset_pubsub() >= 1
    else:
        proxy.drop_pubsub(True)
        return
    assert faults.wait_until(
        lambda: bool(pubsub_clients(client) - before) and numsub(client, channel) >= 1, 10), \
        "the pub/sub connection was not re-established"


PUBSUB_FAULTS = ["client-kill", "proxy-reset", "proxy-drop"]


# --- semaphores: 1. holder killed with SIGKILL ----------------------------------------------

@pytest.mark.real_redis
@pytest.mark.parametrize("lease", [1.0, None], ids=["explicit-lease", "watchdog"])
@pytest.mark.parametrize("kind", SEMAPHORES)
def test_sem_1_sigkill_holder_gives_permit_back_after_lease_never_before(
        url: str, client: Any, holders: Any, kind: str, lease: Optional[float]) -> None:
    name = f"ss1-{kind}"
    holder = holders(url, kind, name, lease=lease, settings=FAST)
    assert holder.event("acquired")[4] is True
    if lease is None:  # the watchdog keeps the permit alive: its renewals reach the server
        renewals_seen(lambda: permit_left_ms(client, name), 2, what=f"{name}'s permit")
    holder.kill()

    probe = sem(kind, name, client)
    sent = time.monotonic()
    left = permit_left_ms(client, name)
    assert left > 0, "the permit vanished with its holder, before its lease ran out"
    assert probe.acquire(blocking=False) is False
    assert probe.acquire(timeout=left / 1000.0 + 15.0) is True
    got = time.monotonic()
    try:
        assert got >= sent + left / 1000.0 - 0.010, "a permit came back before its lease ran out"
        assert probe.acquire(blocking=False) is False, "the dead holder's permit came back twice"
    finally:
        probe.release()
    assert at_rest(client, name)


# --- semaphores: 2. holder stopped past its lease, then continued ---------------------------

@pytest.mark.real_redis
@pytest.mark.parametrize("lease", [1.0, None], ids=["explicit-lease", "watchdog"])
@pytest.mark.parametrize("kind", SEMAPHORES)
def test_sem_2_sigstop_past_lease_then_sigcont(
        url: str, client: Any, holders: Any, kind: str, lease: Optional[float]) -> None:
    """Another process takes the stopped holder's permit; the holder's on_lost fires (its
    watchdog finds out, or its release does); its late release raises LockLostError and gives
    nothing back: the count stays threading's (value 1: one permit, held by the taker)."""
    distlock.configure(**FAST)
    name = f"ss2-{kind}"
    holder = holders(url, kind, name, lease=lease, settings=FAST)
    assert holder.event("acquired")[4] is True

    holder.stop()
    mine = sem(kind, name, client)
    mine_lost: List[Any] = []
    mine.on_lost(mine_lost.append)
    assert mine.acquire(timeout=20), "nobody could take the stopped holder's permit"
    try:
        holder.cont()
        if lease is None:
            holder.event("on_lost", timeout=20)  # the watchdog found the permit gone
        holder.send("release")
        assert holder.event("release")[1] == "LockLostError"
        if lease is not None:
            holder.event("on_lost", timeout=5)  # found by the release
        # The late release raised no count: the one permit is still the taker's.
        assert sem(kind, name, client).acquire(blocking=False) is False
        assert len(permits(client, name)) == 1 and permit_left_ms(client, name) > 0
        holder.send("owned")
        assert holder.event("owned")[1] is False
    finally:
        mine.release()  # a bounded semaphore: not "released too many times"
    probe = sem(kind, name, client)
    assert probe.acquire(blocking=False) is True
    assert probe.acquire(blocking=False) is False, "the late release created a permit"
    probe.release()
    assert mine_lost == []
    assert at_rest(client, name)
    holder.send("exit")


# --- semaphores: 3. Redis restarted while permits are held and waiters wait -----------------

@pytest.mark.real_redis
@pytest.mark.parametrize("kind", SEMAPHORES)
def test_sem_3_redis_restart_while_held_and_waited(backend: Any, url: str, client: Any,
                                                   kind: str) -> None:
    distlock.configure(**FAST)
    timeout = 8.0
    names = [f"ss3-{kind}-watchdog", f"ss3-{kind}-lease"]
    held = [sem(kind, names[0], client), sem(kind, names[1], client, lease=30.0)]
    lost: Dict[int, float] = {}
    for i, s in enumerate(held):
        assert s.acquire(blocking=False)
        s.on_lost(lambda _s, i=i: lost.setdefault(i, time.monotonic()))

    def wait_for(name: str) -> str:
        s = sem(kind, name, client, lease=5.0)
        try:
            ok = s.acquire(timeout=timeout)
        except redis.exceptions.ConnectionError:
            return "ConnectionError"
        if ok:
            s.release()
        return str(ok)

    waiters = [start(lambda n=n: wait_for(n), f"waiter-{n}") for n in names for _ in range(2)]
    session = session_for(client)
    assert faults.wait_until(
        lambda: all(sem_keys(n).channel in session.subscribed_channels() for n in names), 10)
    assert faults.wait_until(lambda: all(client.zcard(sem_keys(n).queue) == 2 for n in names), 10)
    faults.restart_server(backend)
    for waiter in waiters:
        waiter.finish(timeout + 30.0)
        assert waiter.error is None, repr(waiter.error)
        assert waiter.result in ("True", "False", "ConnectionError")
        assert waiter.elapsed <= timeout + 15.0
    assert sum(w.result == "True" for w in waiters) >= len(names), [w.result for w in waiters]

    # The watchdog's holder learns it by itself, the explicit lease's at release().
    assert faults.wait_until(lambda: 0 in lost, 15), "the watchdog did not report the lost permit"
    for s in held:
        with pytest.raises(LockLostError):
            s.release()
    assert 1 in lost
    for name in names:  # the count is the value again, no more (the lost releases raised none)
        probe = sem(kind, name, client)
        assert probe.acquire(timeout=10)
        assert probe.acquire(blocking=False) is False
        probe.release()
        assert at_rest(client, name)


# --- semaphores: 4. the pub/sub connection is killed while waiters wait ---------------------

@pytest.mark.real_redis
@pytest.mark.parametrize("how", PUBSUB_FAULTS)
@pytest.mark.parametrize("kind", SEMAPHORES[:1])  # a bounded semaphore waits the same way
def test_sem_4_pubsub_connection_killed_while_waiting(client: Any, proxy: FaultProxy, kind: str,
                                                      how: str) -> None:
    distlock.configure(wait_cap=0.5)
    name = f"ss4-{kind}"
    user = client if how == "client-kill" else proxy.client()
    holder = sem(kind, name, client, value=2)
    assert holder.acquire(blocking=False) and holder.acquire(blocking=False)
    got: List[bool] = []

    def wait() -> bool:
        s = sem(kind, name, user, value=2)
        ok = bool(s.acquire(timeout=30))
        if ok:
            got.append(ok)
            s.release()
        return ok

    waiters = [start(wait, f"waiter-{i}") for i in range(3)]
    session = session_for(user)
    keys = sem_keys(name)
    try:
        assert faults.wait_until(lambda: keys.channel in session.subscribed_channels(), 10)
        assert faults.wait_until(lambda: client.zcard(keys.queue) == 3, 10)
        break_pubsub(how, client, proxy, keys.channel)
    finally:
        holder.release(2)
    released = time.monotonic()
    for waiter in waiters:
        waiter.finish(40)
        assert waiter.error is None, repr(waiter.error)
        assert waiter.result is True
        # The bound: each waiter looks at least every wait_cap * queue_cap_factor = 5 s.
        assert waiter.ended_at - released < 20.0
    assert len(got) == 3
    assert faults.wait_until(lambda: at_rest(client, name), 10)


# --- semaphores: 6. SCRIPT FLUSH in the middle of a run -------------------------------------

@pytest.mark.parametrize("kind", SEMAPHORES)
def test_sem_6_script_flush_mid_run(client: Any, kind: str) -> None:
    distlock.configure(**FAST)
    name = f"ss6-{kind}"
    kept = sem(kind, f"{name}-kept", client)
    assert kept.acquire(blocking=False)
    lost: List[Any] = []
    kept.on_lost(lost.append)
    counter = f"ss6-counter-{kind}"
    stop = threading.Event()

    def flusher() -> int:
        n = 0
        while not stop.is_set() and n < 400:
            client.script_flush()
            n += 1
            time.sleep(0.01)
        return n

    def work() -> int:
        s = sem(kind, name, client)  # value 1: the read-modify-write below is exclusive
        for _ in range(30):
            assert s.acquire(timeout=20)
            try:
                client.set(counter, int(client.get(counter) or 0) + 1)
            finally:
                s.release()
        return 30

    flush = start(flusher, "flusher")
    workers = [start(work, f"worker-{i}") for i in range(3)]
    try:
        for worker in workers:
            worker.finish(120)
            assert worker.error is None, repr(worker.error)
        time.sleep(FAST["lease"] * 1.5)  # renewals across flushes
    finally:
        stop.set()
        flush.finish(30)
    assert flush.result > 10
    assert int(client.get(counter)) == 90
    assert not lost and permit_left_ms(client, f"{name}-kept") > 0, \
        "a renewal failed for good after SCRIPT FLUSH"
    kept.release()
    client.delete(counter)
    assert at_rest(client, name) and at_rest(client, f"{name}-kept")


# --- semaphores: 7. maxmemory reached under noeviction --------------------------------------

@pytest.mark.real_redis
@pytest.mark.parametrize("kind", SEMAPHORES)
def test_sem_7_out_of_memory_release_and_renew_still_work(client: Any, kind: str) -> None:
    distlock.configure(**FAST)
    watched_name, leased_name, single_name = f"ss7-{kind}-w", f"ss7-{kind}-l", f"ss7-{kind}-s"
    with RedisServer(extra_args=["--maxmemory-policy", "noeviction"]) as server:
        full = redis.Redis.from_url(server.url)
        stranger_client = redis.Redis.from_url(server.url)
        try:
            watched = sem(kind, watched_name, full, value=3)
            leased = sem(kind, leased_name, full, lease=30.0)
            assert watched.acquire(blocking=False) and watched.acquire(blocking=False)
            assert leased.acquire(blocking=False)
            # taken at rest (a +inf permit, see _sem.lua): another process' tries and its
            # release on the holder's behalf must work out of memory too
            single = sem(kind, single_name, full, value=1)
            assert single.acquire(blocking=False)
            stranger = sem(kind, single_name, stranger_client, value=1)
            lost: List[Any] = []
            watched.on_lost(lost.append)
            single.on_lost(lost.append)
            used = int(full.info("memory")["used_memory"])
            full.config_set("maxmemory", used + 256 * 1024)
            with pytest.raises(redis.exceptions.OutOfMemoryError):
                for i in range(10_000):
                    full.set(f"filler:{i}", "x" * 1024)
            # Far over the limit, not a few bytes from it (a freed buffer could bring it back).
            full.config_set("maxmemory", 1)
            time.sleep(FAST["lease"] * 1.5)  # renewals out of memory
            full.script_flush()  # and the NOSCRIPT path out of memory
            time.sleep(FAST["lease"])
            assert not lost, "renewal failed out of memory"
            assert len(permits(full, watched_name)) == 2 and permit_left_ms(full, watched_name) > 0
            with pytest.raises(redis.exceptions.OutOfMemoryError):  # a new semaphore needs memory
                sem(kind, f"ss7-{kind}-new", full).acquire(blocking=False)
            assert stranger.acquire(blocking=False) is False  # a refused try
            assert stranger.acquire(timeout=0.3) is False  # a waiter's looks
            stranger.release()  # hands the holder's permit over
            assert permits(full, single_name) == []
            time.sleep(FAST["lease"])  # the holder's watchdog finds it handed: forgotten, no loss
            holds = single._session().holds
            assert not [h for (key, _), h in holds.items() if key == single._keys.sem]
            assert not lost
            watched.release()  # one of two
            assert len(permits(full, watched_name)) == 1
            watched.release()
            leased.release()
            assert at_rest(full, watched_name) and at_rest(full, leased_name)
            assert at_rest(full, single_name)
        finally:
            reset_sessions()
            full.close()
            stranger_client.close()


# --- semaphores: 9. mutual exclusion with value 1 --------------------------------------------

@pytest.mark.real_redis
@pytest.mark.slow
@pytest.mark.parametrize("kind", SEMAPHORES)
def test_sem_9_value_1_mutual_exclusion_across_processes(url: str, client: Any, tmp_path: Any,
                                                         kind: str) -> None:
    """4 processes x 40 short holds of a semaphore of value 1 (watchdog, short lease): no two
    holds overlap on the system-wide monotonic clock, and every release went through."""
    processes, holds = 4, 40
    name = f"ss9-{kind}"
    procs = faults.start_checkers(url, kind, name, processes, holds, None, FAST, None,
                                  str(tmp_path), give_up_after=120.0)
    try:
        for proc in procs:
            proc.join(timeout=150)
        assert all(proc.exitcode == 0 for proc in procs), [p.exitcode for p in procs]
    finally:
        for proc in procs:
            if proc.is_alive():
                proc.kill()
                proc.join(timeout=10)
    intervals = faults.read_intervals(str(tmp_path), processes)
    assert len(intervals) == processes * holds
    assert all(iv[3] == "ok" for iv in intervals)
    assert faults.overlaps(intervals) == []
    assert at_rest(client, name)


# --- DistEvent: restart, pub/sub killed, blackhole ------------------------------------------

def _event_wait(client: Any, name: str, timeout: float) -> Callable[[], Any]:
    def wait() -> Any:
        try:
            return distlock.DistEvent(name, client=client).wait(timeout)
        except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError):
            return "ConnectionError"
    return wait


@pytest.mark.real_redis
@pytest.mark.parametrize("fault", ["restart", *PUBSUB_FAULTS])
def test_event_waiters_survive_restart_and_pubsub_faults(backend: Any, client: Any,
                                                        proxy: FaultProxy, fault: str) -> None:
    """wait(timeout) never hangs: through a restart each waiter returns or raises
    ConnectionError within its bound; after a broken pub/sub connection set() still wakes
    every waiter (an event that stays set is never missed)."""
    distlock.configure(wait_cap=0.5)
    name = f"se-{fault}"
    timeout = 8.0 if fault == "restart" else 30.0
    user = client if fault in ("restart", "client-kill") else proxy.client()
    keys = EventKeys.of(distlock.configure().prefix, name)
    waiters = [start(_event_wait(user, name, timeout), f"event-waiter-{i}") for i in range(3)]
    session = session_for(user)
    assert faults.wait_until(lambda: keys.channel in session.subscribed_channels(), 10)
    assert faults.wait_until(lambda: client.zcard(keys.waiters) == 3, 10)
    if fault == "restart":
        faults.restart_server(backend)
    else:
        break_pubsub(fault, client, proxy, keys.channel)
    event = distlock.DistEvent(name, client=client)
    event.set()
    released = time.monotonic()
    for waiter in waiters:
        waiter.finish(timeout + 30.0)
        assert waiter.error is None, repr(waiter.error)
        assert waiter.elapsed <= timeout + 15.0
        if fault == "restart":
            assert waiter.result in (True, "ConnectionError"), waiter.result
        else:
            assert waiter.result is True, "set() did not wake a waiter"
            assert waiter.ended_at - released < 20.0
    event.clear()
    assert faults.wait_until(lambda: at_rest(client, name), 10)


@pytest.mark.real_redis
@pytest.mark.parametrize("when", ["before", "while-waiting"])
def test_event_wait_in_a_blackhole_returns_within_its_bound(client: Any, proxy: FaultProxy,
                                                            when: str) -> None:
    """wait(timeout=1) through a blackholed link returns False or raises within
    1 + 2 * B + slack (the margin of tests/faults/test_faults.py's scenario 5)."""
    distlock.configure(wait_cap=0.5)
    victim_client = bounded_client(proxy.port)
    try:
        event = distlock.DistEvent(f"se5-{when}", client=victim_client)
        assert start(lambda: event.wait(1)).finish(10).result is False  # all is well
        if when == "before":
            proxy.blackhole()
            worker = start(lambda: event.wait(1))
        else:
            worker = start(lambda: event.wait(1))
            time.sleep(0.3)
            proxy.blackhole()
        worker.finish(60)
        assert worker.elapsed <= 1.0 + 2 * B + SLACK, worker.elapsed
        if worker.error is not None:
            assert isinstance(worker.error, (redis.exceptions.ConnectionError,
                                             redis.exceptions.TimeoutError)), repr(worker.error)
        else:
            assert worker.result is False
    finally:
        proxy.heal()
        victim_client.close()


# --- DistBarrier: pub/sub killed while parties wait; a party killed with timeouts set --------

@pytest.mark.real_redis
@pytest.mark.parametrize("how", PUBSUB_FAULTS)
def test_barrier_pubsub_killed_while_parties_wait(client: Any, proxy: FaultProxy, how: str) -> None:
    """Two parties wait, their pub/sub connection breaks, the third arrives: the generation
    still completes (the trip's hint, or the next look), with indices 0, 1, 2. The record of
    the trip, which a party that missed the hint reads, goes when their leases run out."""
    distlock.configure(wait_cap=0.5, lease=2.0, renew_interval=0.5)
    name = f"sb4-{how}"
    user = client if how == "client-kill" else proxy.client()
    keys = BarrierKeys.of(distlock.configure().prefix, name)

    def party() -> int:
        return int(distlock.DistBarrier(name, 3, client=user).wait(timeout=30))

    waiting = [start(party, f"party-{i}") for i in range(2)]
    barrier = distlock.DistBarrier(name, 3, client=client)
    session = session_for(user)
    assert faults.wait_until(lambda: barrier.n_waiting == 2, 10)
    assert faults.wait_until(lambda: keys.channel in session.subscribed_channels(), 10)
    break_pubsub(how, client, proxy, keys.channel)
    last = barrier.wait(timeout=30)
    released = time.monotonic()
    for party_ in waiting:
        party_.finish(40)
        assert party_.error is None, repr(party_.error)
        assert party_.ended_at - released < 20.0
    assert sorted([last, *(p.result for p in waiting)]) == [0, 1, 2]
    assert barrier.broken is False
    assert faults.wait_until(lambda: at_rest(client, name), 10)


@pytest.mark.real_redis
def test_barrier_party_sigkilled_while_waiting_with_timeouts(client: Any, url: str,
                                                             spawned: Any) -> None:
    """Three of four parties wait, each with a timeout (30 s). One, in another process, is
    killed with SIGKILL: when its lease (1 s) runs out the barrier breaks, and the two others
    raise BrokenBarrierError long before their own timeout would have broken it."""
    distlock.configure(wait_cap=0.5)
    name = "sb1-timeouts"
    timeout = 30.0
    settings = {"lease": 1.0, "renew_interval": 0.25, "wait_cap": 0.5}
    proc, conn = spawned(_sem_event_barrier_workers.barrier_party, url, name, 4, 1, None, timeout, settings)
    kind, pid = recv(conn, 60)
    assert kind == "ready"
    barrier = distlock.DistBarrier(name, 4, client=client)
    conn.send("go")
    assert recv(conn, 30) == ("arriving",)
    assert faults.wait_until(lambda: barrier.n_waiting == 1, 10)

    def party() -> Any:
        try:
            return distlock.DistBarrier(name, 4, client=client).wait(timeout=timeout)
        except threading.BrokenBarrierError:
            return "broken"

    others = [start(party, f"party-{i}") for i in range(2)]  # the fourth party never comes
    assert faults.wait_until(lambda: barrier.n_waiting == 3, 10)
    time.sleep(1.5)  # longer than the victim's lease: its watchdog keeps it alive meanwhile
    assert barrier.broken is False
    os.kill(pid, signal.SIGKILL)
    proc.join(10.0)
    killed = time.monotonic()
    for other in others:
        other.finish(timeout + 30.0)
        assert other.error is None, repr(other.error)
        assert other.result == "broken"
        # Well before their own 30 s timeout: the dead party's lease broke it.
        assert other.ended_at - killed < 20.0
    assert barrier.broken is True
    barrier.reset()
    assert barrier.broken is False and barrier.n_waiting == 0
    # Only the record that the killed generation broke stays (for its keep time).
    assert keys_of(client, name) == [BarrierKeys.of(distlock.configure().prefix, name).broken.encode()]


@pytest.mark.real_redis
def test_event_restart_without_set_does_not_wake_waiters(backend: Any, client: Any) -> None:
    """A restart that lost the data is not a set(): the waiters go on waiting and time out
    (False), or raise ConnectionError; none returns True."""
    distlock.configure(wait_cap=0.5)
    name = "se-restart-unset"
    keys = EventKeys.of(distlock.configure().prefix, name)
    waiters = [start(_event_wait(client, name, 4.0), f"event-waiter-{i}") for i in range(2)]
    assert faults.wait_until(lambda: client.zcard(keys.waiters) == 2, 10)
    faults.restart_server(backend)
    for waiter in waiters:
        waiter.finish(40.0)
        assert waiter.error is None, repr(waiter.error)
        assert waiter.result in (False, "ConnectionError"), "a restart woke a waiter as a set() would"
    assert faults.wait_until(lambda: at_rest(client, name), 10)
