"""Every primitive on a real Redis Cluster (3 masters, 3 replicas: distlock/testing/cluster.py).

What a cluster adds to one server, each shown on the real thing: routing by slot, sharded
pub/sub per node, renewals grouped per node, MOVED and ASK followed, a held lock's slot moved
by a resharding (with its keys, and without them), a master killed under a hold, the asyncio
shell, and exclusion across processes.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import threading
import time
import types
import uuid
from typing import Any, Callable, Dict, List, Tuple

import pytest
import redis
import redis.asyncio as aredis
from _support import subscribers
from redis.crc import key_slot

import distlock
import distlock.asyncio as aio
from distlock import (
    DistBarrier,
    DistBoundedSemaphore,
    DistCondition,
    DistEvent,
    DistLock,
    DistReadWriteLock,
    DistRLock,
    DistSemaphore,
)
from distlock._redis.aport_cluster import ShardedPubSub
from distlock._redis.executor_cluster import ClusterExecutor
from distlock._redis.pubsub_cluster import ClusterDispatcher
from distlock._session.session import all_sessions

pytestmark = pytest.mark.real_redis

BOUND = 20.0


def _name(prefix: str) -> str:
    return f"cl:{prefix}:{uuid.uuid4().hex[:10]}"


def _lock_key(name: str) -> str:
    return f"distlock:{{{name}}}"


def _session_of(client: Any) -> Any:
    for session in all_sessions():
        if isinstance(session.executor, ClusterExecutor) and session.serves(client):
            return session
    raise AssertionError("no cluster session")


def _held(client: Any, prefix: str, lease: float, renew_interval: float,
          **lock_kwargs: Any) -> Tuple[Any, str, List[float]]:
    """With ``configure(lease, renew_interval)``: a DistLock of a fresh name (made with
    ``lock_kwargs``), held through ``client``; its lock key; and the times (monotonic) its
    ``on_lost`` callbacks ran."""
    distlock.configure(lease=lease, renew_interval=renew_interval)
    name = _name(prefix)
    lock = DistLock(name, client=client, **lock_kwargs)
    lost_at: List[float] = []
    lock.on_lost(lambda _: lost_at.append(time.monotonic()))
    deadline = time.monotonic() + BOUND
    while True:
        try:
            assert lock.acquire()
            break
        except distlock.NotEnoughReplicasError:
            # min_replicas: a replica that a previous test's failover restarted may still be
            # catching up (its ROLE says connected before its first ACK); the grant was given
            # back, so a try later is a fresh one
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
    return lock, _lock_key(name), lost_at


def _until(check: Callable[[], Any], bound: float) -> bool:
    deadline = time.monotonic() + bound
    while not check() and time.monotonic() < deadline:
        time.sleep(0.02)
    return bool(check())


def _session_of_new(client: Any, primitive: Any) -> Any:
    """The session of ``client``, made if needed (a query makes it)."""
    primitive.locked()
    return _session_of(client)


def _names_on(cluster: Any, count: int) -> List[str]:
    """``count`` names whose slots are on ``count`` different masters (count <= 3)."""
    found: Dict[Any, str] = {}
    for i in range(1000):
        name = f"cl:spread:{uuid.uuid4().hex[:8]}:{i}"
        found.setdefault(cluster.master_of_key(_lock_key(name)), name)
        if len(found) >= count:
            break
    return list(found.values())[:count]


# --- every primitive -----------------------------------------------------------------------

def test_the_client_gets_the_cluster_executor_and_dispatcher(cluster_client: Any) -> None:
    lock = DistLock(_name("route"), client=cluster_client)
    with lock:
        session = _session_of(cluster_client)
        assert isinstance(session.executor, ClusterExecutor)
        assert isinstance(session.dispatcher, ClusterDispatcher)
        assert session.executor.sharded  # Redis 7.0+ and Valkey: SPUBLISH


def test_redis_pys_failing_error_path_reads_as_the_connection_error_it_hid() -> None:
    """redis-py 8.1 fails while it records the metric of a connection error that carries no
    connection (``AttributeError: 'NoneType' object has no attribute 'host'``), hiding that
    error: the probe reads it as the connection error it was. Any other AttributeError is
    distlock's own bug and is raised."""
    from distlock._redis.executor_cluster import _has_sharded_pubsub

    class Failing:
        def __init__(self, cause: Any) -> None:
            self.cause = cause

        def get_default_node(self) -> None:
            return None

        def execute_command(self, *args: Any, **kwargs: Any) -> Any:
            try:
                raise self.cause
            except Exception as exc:
                exc.connection = None  # type: ignore[attr-defined]
                return exc.connection.host  # what redis-py's _record_error_metric reads

    assert _has_sharded_pubsub(Failing(redis.ConnectionError("refused"))) is True
    with pytest.raises(AttributeError):
        _has_sharded_pubsub(Failing(KeyError("not a connection error")))
    # and a read (GET, PTTL, ...) raises the connection error itself
    reader = types.SimpleNamespace(client=Failing(redis.ConnectionError("refused")))
    with pytest.raises(redis.ConnectionError):
        ClusterExecutor.read(reader, "GET", "k")  # type: ignore[arg-type]
    reader = types.SimpleNamespace(client=Failing(KeyError("not a connection error")))
    with pytest.raises(AttributeError):
        ClusterExecutor.read(reader, "GET", "k")  # type: ignore[arg-type]


@pytest.mark.parametrize("cls", [DistLock, DistRLock])
def test_a_lock_excludes_and_wakes_a_waiter_on_the_cluster(cluster_client: Any, cls: Any) -> None:
    name = _name("lock")
    holder = cls(name, client=cluster_client)
    other_client = redis.RedisCluster(host=cluster_client.get_default_node().host,
                                      port=cluster_client.get_default_node().port)
    try:
        waiter = cls(name, client=other_client)
        assert holder.acquire()
        assert not waiter.acquire(timeout=0.2)
        got: List[float] = []

        def wait() -> None:
            if waiter.acquire(timeout=BOUND):
                got.append(time.monotonic())
                waiter.release()

        thread = threading.Thread(target=wait)
        thread.start()
        time.sleep(0.3)
        released = time.monotonic()
        holder.release()
        thread.join(BOUND)
        assert got, "the waiter never got the lock"
        # woken by the hint, not by its polling bound (a loose bound: only a hang fails it)
        assert got[0] - released < 5.0
    finally:
        other_client.close()
    assert not cluster_client.exists(_lock_key(name))


def test_every_primitive_works_on_the_cluster(cluster_client: Any) -> None:
    c = cluster_client
    sem = DistSemaphore(_name("sem"), 2, client=c)
    with sem:
        assert sem.acquire(timeout=1)
        assert not sem.acquire(timeout=0.1)
        sem.release()
    bsem = DistBoundedSemaphore(_name("bsem"), 1, client=c)
    with bsem:
        pass
    with pytest.raises(ValueError):
        bsem.release()
    event = DistEvent(_name("ev"), client=c)
    assert not event.wait(0.05)
    threading.Timer(0.2, event.set).start()
    assert event.wait(BOUND)
    event.clear()
    rw = DistReadWriteLock(_name("rw"), client=c)
    with rw.read_lock():
        with DistReadWriteLock(rw.name, client=c).read_lock():
            pass
    with rw.write_lock():
        pass
    cond = DistCondition(_name("cond"), client=c)
    box: List[bool] = []

    def waiter() -> None:
        with cond:
            box.append(cond.wait(BOUND))

    thread = threading.Thread(target=waiter)
    thread.start()
    deadline = time.monotonic() + BOUND
    while not box and time.monotonic() < deadline:  # until the waiter was there to be notified
        with cond:
            cond.notify()
        time.sleep(0.05)
    thread.join(BOUND)
    assert box == [True]
    barrier = DistBarrier(_name("bar"), 3, client=c)
    results: List[int] = []
    threads = [threading.Thread(target=lambda: results.append(barrier.wait(BOUND))) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(BOUND)
    assert sorted(results) == [0, 1, 2]


# --- pub/sub per node, renewals per node ----------------------------------------------------

def test_waiters_on_three_masters_use_one_pubsub_connection_per_node(
        cluster: Any, cluster_client: Any) -> None:
    names = _names_on(cluster, 3)
    assert len(names) == 3, "could not find names on three masters"
    holders = [DistLock(n, client=cluster_client) for n in names]
    # only this client's connections are counted (by name): a pub/sub connection of an
    # earlier test that was still closing was counted once, on a loaded machine
    tag = "pubsub-per-node"
    other = cluster.client(client_name=tag)
    try:
        for h in holders:
            assert h.acquire()
        assert DistLock(names[0], client=other).locked()  # the other client's session is made
        results: List[bool] = []
        threads = []
        for n in names:
            for _ in range(2):  # two waiters per node: still one connection per node
                w = DistLock(n, client=other)
                t = threading.Thread(
                    target=lambda w=w: results.append(w.acquire(timeout=BOUND) and (w.release() or True)))
                t.start()
                threads.append(t)
        session = _session_of(other)
        deadline = time.monotonic() + BOUND
        while len(session.dispatcher.subscribed()) < 3 and time.monotonic() < deadline:
            time.sleep(0.02)
        boards = session.dispatcher.boards()
        assert len(boards) == 3 and sum(1 for b in boards.values() if b.running) == 3
        for node_addr in cluster.masters():
            conn = redis.Redis(host=node_addr[0], port=node_addr[1])
            try:
                pubsubs = [c for c in conn.client_list() if c.get("name") == tag and (
                    "P" in c.get("flags", "") or int(c.get("ssub", 0) or 0) > 0)]
            finally:
                conn.close()
            assert len(pubsubs) == 1, (node_addr, pubsubs)
        for h in holders:
            h.release()
        for t in threads:
            t.join(BOUND)
        assert results == [True] * 6
    finally:
        other.close()


def test_the_watchdog_renews_holds_on_three_masters_in_three_pipelines(
        cluster: Any, cluster_client: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    distlock.configure(lease=2.0, renew_interval=0.5)
    locks = [DistLock(_name(f"wd{i}"), client=cluster_client) for i in range(60)]
    for lock in locks:
        assert lock.acquire()
    try:
        session = _session_of(cluster_client)
        sent: List[int] = []
        real = redis.client.Pipeline.execute

        me = threading.current_thread()

        def counted(self: Any, raise_on_error: bool = True) -> Any:
            if threading.current_thread() is me:  # this round, not the watchdog thread's own
                sent.append(len(self.command_stack))
            return real(self, raise_on_error)

        assert session.watchdog.renew_all() is None  # a first round loads the renewal script
        monkeypatch.setattr(redis.client.Pipeline, "execute", counted)
        assert session.watchdog.renew_all() is None
        masters = {cluster.master_of_key(_lock_key(lock.name)) for lock in locks}
        assert len(sent) == len(masters) == 3
        assert sum(sent) == 60
        monkeypatch.undo()
        time.sleep(2.5)  # longer than the lease: only the renewals keep them
        assert all(cluster_client.exists(_lock_key(lock.name)) for lock in locks)
    finally:
        for lock in locks:
            lock.release()


# --- redirections ---------------------------------------------------------------------------

class _Migration:
    """A slot caught in the middle of a migration: IMPORTING on the target, MIGRATING on the
    source, every key moved; ``finish`` gives the slot to the target, as redis-cli does."""

    def __init__(self, cluster: Any, key: str) -> None:
        self.cluster = cluster
        self.slot = cluster.keyslot(key)
        self.source = cluster.master_of_key(key)
        self.target = next(m for m in cluster.masters() if m != self.source)
        src, dst = cluster.node_client(self.source), cluster.node_client(self.target)
        self.target_id = cluster.node_id(self.target)
        dst.execute_command("CLUSTER", "SETSLOT", self.slot, "IMPORTING", cluster.node_id(self.source))
        src.execute_command("CLUSTER", "SETSLOT", self.slot, "MIGRATING", self.target_id)
        keys = src.execute_command("CLUSTER", "GETKEYSINSLOT", self.slot, 1000)
        if keys:
            src.execute_command("MIGRATE", self.target[0], self.target[1], "", 0, 5000, "KEYS", *keys)

    def finish(self) -> None:
        order = [self.target, self.source] + [m for m in self.cluster.masters()
                                              if m not in (self.source, self.target)]
        for master in order:
            self.cluster.node_client(master).execute_command("CLUSTER", "SETSLOT", self.slot, "NODE",
                                                             self.target_id)


def test_a_script_follows_ask_to_the_importing_node(cluster: Any, cluster_client: Any) -> None:
    """A one-key script whose key has been migrated: the source answers ASK, and the script
    goes with ASKING to the importing node, where it runs."""
    name = _name("ask")
    lock = DistLock(name, client=cluster_client)
    queue = lock._keys.queue
    cluster_client.zadd(queue, {"chan-a": 1, "chan-b": 2})
    migration = _Migration(cluster, queue)
    try:
        with pytest.raises(redis.exceptions.AskError):
            cluster.node_client(migration.source).exists(queue)  # gone: the source says ASK
        executor = _session_of_new(cluster_client, lock).executor
        assert executor.run("lock_unwait", (queue,), ("chan-a",)) == 1
        pipe = cluster.node_client(migration.target).pipeline(transaction=False)
        pipe.execute_command("ASKING")  # for the next command only
        pipe.zrange(queue, 0, -1)
        assert pipe.execute()[1] == [b"chan-b"]  # it ran there, once
    finally:
        migration.finish()
    cluster.wait_agreement()


def test_a_release_waits_out_a_migration_and_runs_on_the_new_owner(
        cluster: Any, cluster_client: Any) -> None:
    """A script with several keys meets TRYAGAIN on the importing node while the slot is
    being migrated (some of its keys do not exist): it pauses and tries again, and once the
    migration finishes, follows MOVED to the new owner. The release is not lost, nor sent
    twice."""
    name = _name("tryagain")
    lock = DistLock(name, client=cluster_client)
    assert lock.acquire()
    key = _lock_key(name)
    migration = _Migration(cluster, key)
    timer = threading.Timer(0.15, migration.finish)
    timer.start()
    try:
        lock.release()  # ASK, TRYAGAIN... then MOVED once the slot is the target's
        assert not lock.owned()
    finally:
        timer.join(BOUND)
    cluster.wait_agreement()
    assert cluster.master_of_key(key) == migration.target
    assert not cluster_client.exists(key)


def test_a_held_lock_survives_a_resharding_of_its_slot(cluster: Any, healthy_cluster: Any) -> None:
    """``redis-cli``-style resharding migrates the keys: the holder keeps its hold (its
    renewals follow MOVED); a waiter that waited through it is woken by the old owner's
    ``sunsubscribe``, subscribes again on the new owner, and gets the lock once it is
    released, never before."""
    client = cluster.client()
    other = cluster.client()
    try:
        lock, key, lost = _held(client, "reshard", 2.0, 0.4)
        source = cluster.master_of_key(key)
        target = next(m for m in cluster.masters() if m != source)
        waiter = DistLock(lock.name, client=other)
        session = _session_of_new(other, waiter)
        got: List[float] = []
        thread = threading.Thread(
            target=lambda: waiter.acquire(timeout=BOUND) and got.append(time.monotonic()))
        thread.start()
        assert _until(session.dispatcher.subscribed, BOUND)
        channel = session.dispatcher.subscribed()[0]
        assert subscribers(cluster.node_client(source), channel, sharded=True) == 1
        cluster.reshard_slot(client.keyslot(key), target)
        assert cluster.master_of_key(key) == target
        # the waiter moved: subscribed on the new owner, no longer on the old one
        assert _until(lambda: subscribers(cluster.node_client(target), channel, sharded=True) == 1, BOUND)
        assert subscribers(cluster.node_client(source), channel, sharded=True) == 0
        time.sleep(2.5)  # more than a lease: kept only by renewals on the new owner
        assert not lost and lock.owned() and not got  # no two holders
        released = time.monotonic()
        lock.release()
        thread.join(BOUND)
        assert got and got[0] - released < 5.0  # woken on the new owner, not only by its bound
        waiter.release()
    finally:
        client.close()
        other.close()


def test_a_bare_setslot_drops_the_hold_and_the_holder_is_told(cluster: Any, healthy_cluster: Any) -> None:
    """CLUSTER SETSLOT ... NODE without migrating the keys leaves them behind, unreachable:
    the hold is gone, the next renewal finds so, and ``on_lost`` fires within one lease."""
    client = cluster.client()
    try:
        lock, key, lost_at = _held(client, "bare", 2.0, 0.4)
        source = cluster.master_of_key(key)
        target = next(m for m in cluster.masters() if m != source)
        cluster.setslot_bare(client.keyslot(key), target)
        assert _until(lambda: lost_at, 2.0 + 1.0), "on_lost did not fire within one lease"
        other = DistLock(lock.name, client=client)
        assert other.acquire(timeout=BOUND)  # the slot's new owner has no such hold
        other.release()
        with pytest.raises(distlock.LockLostError):
            lock.release()
    finally:
        client.close()


def _try(lock: Any, timeout: float) -> bool:
    """One bounded acquire during a failover: an error (no master for the slot yet) counts as
    not acquired; it must come back within its bound and six seconds. What this catches is an
    acquire that hangs on a dead node (the clients here have no socket timeout); the slack is
    for a loaded machine: CI, running three suites at once, saw overruns of 1.2 s and 3.3 s."""
    started = time.monotonic()
    try:
        got = bool(lock.acquire(timeout=timeout))
    except (redis.ConnectionError, redis.ResponseError, redis.TimeoutError,
            redis.exceptions.RedisClusterException):
        got = False
    assert time.monotonic() - started < timeout + 6.0, "an acquire waited past its bound"
    return got


def test_a_failover_under_a_hold_it_survives_keeps_it(cluster: Any, healthy_cluster: Any) -> None:
    """SIGKILL the master that owns a held lock's slot, after its replica acknowledged the
    grant, with a lease longer than the failover: the hold survives (the renewals follow the
    slot to the promoted replica), no acquirer gets it meanwhile, nor waits past its bound,
    and the lock works as before afterwards."""
    client, other, third = cluster.client(), cluster.client(), cluster.client()
    try:
        lock, key, lost_at = _held(client, "failover-kept", 10.0, 0.5)
        name = lock.name
        master = cluster.master_of_key(key)
        assert cluster.node_client(master).execute_command("WAIT", 1, 2000) == 1
        # a waiter that waits through the failover, in another "process"
        waiter = DistLock(name, client=third)
        outcome: List[Any] = []

        def wait() -> None:
            started = time.monotonic()
            try:
                outcome.append(waiter.acquire(timeout=12.0))
            except (redis.RedisError, redis.exceptions.RedisClusterException) as exc:
                outcome.append(exc)  # the slot had no master when it tried: an error, at once
            outcome.append(time.monotonic() - started)

        thread = threading.Thread(target=wait)
        thread.start()
        time.sleep(0.3)
        cluster.kill(master)
        rival = DistLock(name, client=other)
        deadline = time.monotonic() + 8.0  # the failover, then some renewals on the new master
        while time.monotonic() < deadline:
            assert not _try(rival, 0.5), "a second holder during the failover"
        assert cluster.wait_failover(master, 30.0) != master
        assert not lost_at and lock.owned()
        assert client.exists(key)
        assert not _try(rival, 0.3)
        assert not outcome or outcome[0] is not True, "a second holder: the waiter"
        lock.release()
        thread.join(BOUND)
        assert outcome and outcome[1] < 12.0 + 1.0, "the waiter waited past its bound"
        if outcome[0] is True:  # it waited through the failover, on the new owner
            waiter.release()
        assert rival.acquire(timeout=BOUND)
        rival.release()
    finally:
        client.close()
        other.close()
        third.close()


def test_belief_ends_by_the_time_a_rival_holds_after_a_failover(cluster: Any, healthy_cluster: Any) -> None:
    """A regression: with a 3 s lease renewed every 1 s, SIGKILL the slot's master. In two runs
    of three the rival got the lock from the promoted replica right as the lease ran out, while
    the old holder's ``owned()`` was still True and its ``on_lost`` had not fired (its deadline
    had passed; a failed renewal round was still in flight). Now belief ends at the holder's own
    deadline, whatever its renewals are doing (docs/safety.rst, "Belief keeps time"). Either
    the hold survives the failover (a renewal reached the promoted replica in time: the holder
    keeps it, the rival never gets it) or the rival gets it; never both believe.

    With ``min_replicas=1``: without it, a grant or renewal the master acknowledged but had not
    yet streamed to its replica is not on the promoted one, which then grants the lock before
    the holder's deadline (the asynchronous-replication window docs/safety.rst describes, seen
    once in CI). With it, only what the replica acknowledged extends the holder's deadline, so
    the promoted replica's copy of the key lives at least as long as the holder's belief."""
    client, other = cluster.client(), cluster.client()
    try:
        # replica_timeout 2 s: a replica's acknowledgement takes longer than the default
        # 0.5 s on a loaded machine (CI runs several suites at once)
        lock, key, lost_at = _held(client, "failover-belief", 3.0, 1.0, min_replicas=1,
                                   replica_timeout=2.0)
        master = cluster.master_of_key(key)
        cluster.kill(master)
        rival = DistLock(lock.name, client=other)
        got = False
        deadline = time.monotonic() + 12.0  # the failover, then well past a lease
        while not got and time.monotonic() < deadline:
            got = _try(rival, 0.5)
            assert not (got and lock.owned()), "two holders believe they hold the lock"
        if got:
            assert lock.token is None and lock.valid_for() == 0.0
            assert _until(lambda: lost_at, 3.0), "on_lost did not fire"
            rival.release()
            with pytest.raises(distlock.LockLostError):
                lock.release()
        else:  # it survived the failover: renewals reached the promoted replica in time
            assert lock.owned() and not lost_at
            lock.release()
    finally:
        client.close()
        other.close()


def test_a_failover_longer_than_the_lease_reports_the_hold_lost_in_time(
        cluster: Any, healthy_cluster: Any) -> None:
    """The same with a lease shorter than any failover here (about 1.4 to 2.7 s): the renewals
    cannot reach the slot in time, so the hold is reported lost (``on_lost``) within its lease
    (plus a renewal retry and slack for a slow machine), by the time a rival gets the lock from
    the promoted replica; the old holder's release raises LockLostError."""
    client, other = cluster.client(), cluster.client()
    try:
        lock, key, lost_at = _held(client, "failover-lost", 1.0, 0.2)
        name = lock.name
        master = cluster.master_of_key(key)
        killed = time.monotonic()
        cluster.kill(master)
        rival = DistLock(name, client=other)
        got_at = None
        deadline = time.monotonic() + 30.0
        while got_at is None and time.monotonic() < deadline:
            if _try(rival, 0.5):
                got_at = time.monotonic()
        assert got_at is not None, "the lock never worked again after the failover"
        assert lost_at, "on_lost never fired"
        assert lost_at[0] - killed < 1.0 + 2.0
        assert lost_at[0] <= got_at + 1.0  # the old holder was told by the time the rival had it
        with pytest.raises(distlock.LockLostError):
            lock.release()
        rival.release()
    finally:
        client.close()
        other.close()


# --- across processes -----------------------------------------------------------------------

def _count_in_child(url: str, name: str, rounds: int, out: Any) -> None:
    client = redis.RedisCluster.from_url(url.replace("redis+cluster://", "redis://"))
    lock = DistLock(name, client=client)
    overlaps = 0
    for _ in range(rounds):
        with lock:
            value = int(client.get(f"{{{name}}}:counter") or 0)
            if client.incr(f"{{{name}}}:inside") != 1:
                overlaps += 1
            client.set(f"{{{name}}}:counter", value + 1)
            client.decr(f"{{{name}}}:inside")
    out.put(overlaps)
    client.close()


def test_exclusion_across_processes_on_the_cluster(cluster: Any, cluster_client: Any) -> None:
    name = _name("procs")
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_count_in_child, args=(cluster.url, name, 40, out)) for _ in range(3)]
    for p in procs:
        p.start()
    try:
        overlaps = [out.get(timeout=120) for _ in procs]
    finally:
        for p in procs:
            p.join(30)
            if p.is_alive():
                p.kill()
    assert overlaps == [0, 0, 0]
    assert int(cluster_client.get(f"{{{name}}}:counter")) == 120


# --- the asyncio shell ----------------------------------------------------------------------

def _run(coro_fn: Callable[[], Any]) -> Any:
    return asyncio.run(coro_fn())


@pytest.mark.parametrize("cls", [aio.DistLock, aio.DistRLock])
def test_asyncio_locks_on_the_cluster(cluster: Any, cluster_client: Any, cls: Any) -> None:
    async def main() -> None:
        client = cluster.aclient()
        try:
            name = _name("aio")
            a, b = cls(name, client=client), cls(name, client=client)
            counter = [0, 0]

            async def worker(lock: Any) -> None:
                for _ in range(20):
                    async with lock:
                        counter[1] += 1
                        assert counter[1] == 1
                        await asyncio.sleep(0)
                        counter[0] += 1
                        counter[1] -= 1

            await asyncio.wait_for(asyncio.gather(worker(a), worker(b) if cls is aio.DistLock
                                                  else worker(cls(name, client=client))), BOUND)
            assert counter == [40, 0]
            assert not await a.locked()
        finally:
            await client.aclose()
    _run(main)


def test_asyncio_primitives_on_the_cluster(cluster: Any, cluster_client: Any) -> None:
    async def main() -> None:
        client = cluster.aclient()
        try:
            event = aio.DistEvent(_name("aev"), client=client)
            waiter = asyncio.ensure_future(event.wait(BOUND))
            await asyncio.sleep(0.2)
            await event.set()
            assert await asyncio.wait_for(waiter, BOUND)
            sem = aio.DistSemaphore(_name("asem"), 1, client=client)
            async with sem:
                assert not await sem.acquire(timeout=0.1)
            barrier = aio.DistBarrier(_name("abar"), 2, client=client)
            assert sorted(await asyncio.gather(barrier.wait(), barrier.wait())) == [0, 1]
            cond = aio.DistCondition(_name("acond"), client=client)

            async def wait() -> bool:
                async with cond:
                    return bool(await cond.wait(BOUND))
            task = asyncio.ensure_future(wait())
            for _ in range(200):
                await asyncio.sleep(0.02)
                async with cond:
                    await cond.notify()
                if task.done():
                    break
            assert await asyncio.wait_for(task, BOUND)
            rw = aio.DistReadWriteLock(_name("arw"), client=client)
            async with rw.write_lock():
                pass
        finally:
            await client.aclose()
    _run(main)


def test_an_asyncio_waiter_on_the_cluster_is_woken_by_the_sharded_hint(
        cluster: Any, cluster_client: Any) -> None:
    """The release's SPUBLISH wakes an asyncio waiter, through the port's SSUBSCRIBE (its own
    ``ShardedPubSub`` where redis-py's asyncio PubSub has none, as on Python 3.9). With
    ``wait_cap`` at 10 minutes, a waiter that missed the hint would sleep past the bound."""
    distlock.configure(wait_cap=600)
    name = _name("ahint")
    node = cluster.master_of_key(_lock_key(name))
    conn = cluster.node_client(node)
    holder = DistLock(name, client=cluster_client)
    assert holder.acquire()

    def waiting() -> bool:
        return bool(conn.execute_command("PUBSUB", "SHARDCHANNELS", f"distlock:{{{name}}}*"))

    async def main() -> None:
        client = cluster.aclient()
        try:
            lock = aio.DistLock(name, client=client)
            task = asyncio.ensure_future(lock.acquire())
            for _ in range(int(BOUND / 0.02)):  # until its SSUBSCRIBE is on the slot's master
                if waiting() or task.done():
                    break
                await asyncio.sleep(0.02)
            assert waiting() and not task.done()
            holder.release()
            assert await asyncio.wait_for(task, BOUND) is True
            await lock.release()
        finally:
            await client.aclose()
    try:
        _run(main)
    finally:
        if holder.owned():
            holder.release()
        conn.close()


def test_sharded_pubsub_subscribes_hears_resubscribes_and_unsubscribes(cluster: Any) -> None:
    """``ShardedPubSub``, the asyncio port's sharded pub/sub where redis-py's asyncio PubSub
    has none: SSUBSCRIBE confirmed, SPUBLISH heard, the channel subscribed again after its
    connection dropped, and forgotten after SUNSUBSCRIBE."""
    channel = f"distlock:{{{_name('shard')}}}:wake"
    host, port = cluster.master_of_key(channel)
    conn = cluster.node_client((host, port))

    async def next_message(pubsub: Any) -> Any:
        for _ in range(int(BOUND / 0.1)):
            message = await pubsub.get_message(timeout=0.1)
            if message is not None:
                return message
        raise AssertionError(f"no pub/sub message within {BOUND} s")

    async def main() -> None:
        client = aredis.Redis(host=host, port=port)
        pubsub = ShardedPubSub(client.connection_pool)
        try:
            await pubsub.ssubscribe(channel)
            message = await next_message(pubsub)
            assert (message["type"], message["channel"]) == ("ssubscribe", channel.encode())
            assert pubsub.subscribed and list(pubsub.shard_channels) == [channel.encode()]
            assert conn.execute_command("SPUBLISH", channel, "hint") == 1
            message = await next_message(pubsub)
            assert (message["type"], message["data"]) == ("smessage", b"hint")

            await pubsub.connection.disconnect()  # the next read reconnects and resubscribes
            message = await next_message(pubsub)
            assert (message["type"], message["channel"]) == ("ssubscribe", channel.encode())
            assert conn.execute_command("SPUBLISH", channel, "again") == 1
            assert (await next_message(pubsub))["data"] == b"again"

            await pubsub.sunsubscribe(channel)
            assert (await next_message(pubsub))["type"] == "sunsubscribe"
            assert not pubsub.subscribed and pubsub.shard_channels == {}
            assert conn.execute_command("PUBSUB", "SHARDNUMSUB", channel)[1] == 0
        finally:
            await pubsub.aclose()
            await client.aclose()
    try:
        _run(main)
    finally:
        conn.close()


def test_a_cluster_url_serves_both_shells(cluster: Any, cluster_client: Any) -> None:
    name = _name("url")
    with DistLock(name, client=cluster.url):
        assert cluster_client.exists(_lock_key(name))

    async def main() -> None:
        lock = aio.DistLock(name, client=cluster.url)
        async with lock:
            assert isinstance(lock._port().twin, redis.RedisCluster)
    _run(main)


def test_a_blocking_cluster_client_given_to_asyncio_names_the_right_class(cluster_client: Any) -> None:
    with pytest.raises(TypeError, match="distlock.DistLock"):
        aio.DistLock("x", client=cluster_client)
    aclient = aredis.RedisCluster(host="127.0.0.1", port=1)  # not connected: only its type matters
    with pytest.raises(TypeError, match="distlock.asyncio.DistLock"):
        DistLock("x", client=aclient)


def test_servers_without_sharded_pubsub_get_publish_and_subscribe(
        cluster: Any, cluster_client: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Before Redis 7.0 there is no SPUBLISH: the scripts announce with PUBLISH and the node
    dispatchers SUBSCRIBE (on the slot's master: a cluster forwards PUBLISH to every node)."""
    import distlock._redis.executor_cluster as executor_cluster
    monkeypatch.setattr(executor_cluster, "_has_sharded_pubsub", lambda client: False)
    client = cluster.client()
    try:
        name = _name("publish")
        holder, waiter = DistLock(name, client=cluster_client), DistLock(name, client=client)
        assert holder.acquire()
        session = _session_of_new(client, waiter)
        assert not session.executor.sharded
        assert "spublish" not in session.executor.scripts["lock_release"].script
        got: List[bool] = []
        thread = threading.Thread(target=lambda: got.append(waiter.acquire(timeout=BOUND)))
        thread.start()
        deadline = time.monotonic() + BOUND
        while time.monotonic() < deadline and not session.dispatcher.subscribed():
            time.sleep(0.02)
        channel = session.dispatcher.subscribed()[0]
        node = cluster.master_of_key(channel)
        assert cluster.node_client(node).pubsub_numsub(channel)[0][1] == 1  # SUBSCRIBE, not SSUBSCRIBE
        holder.release()
        thread.join(BOUND)
        assert got == [True]
        waiter.release()
    finally:
        client.close()


def _evalsha_calls(cluster: Any) -> int:
    total = 0
    for master in cluster.masters():
        stats = cluster.node_client(master).info("commandstats")
        total += int(stats.get("cmdstat_evalsha", {}).get("calls", 0))
    return total


def test_a_grant_whose_reply_was_lost_is_not_sent_again_and_is_undone(
        cluster: Any, cluster_client: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The connection breaks after the grant's EVALSHA went out: the script ran once on the
    master, is not sent again (redis-py's RedisCluster would re-send it), the caller gets the
    ConnectionError, and the hold it did not learn of is given back (docs/design.rst, principle 13)."""
    name = _name("lost-reply")
    lock = DistLock(name, client=cluster_client)
    with lock:  # the session, its connections and both scripts on the slot's master are made
        pass
    real = redis.connection.AbstractConnection.read_response
    cut = [True]

    def read_response(self: Any, *args: Any, **kwargs: Any) -> Any:
        reply = real(self, *args, **kwargs)
        if cut and threading.current_thread() is threading.main_thread():
            cut.clear()
            self.disconnect()
            raise redis.ConnectionError("the reply was lost on its way back")
        return reply

    before = _evalsha_calls(cluster)
    monkeypatch.setattr(redis.connection.AbstractConnection, "read_response", read_response)
    with pytest.raises(redis.ConnectionError):
        lock.acquire(blocking=False)
    monkeypatch.undo()
    assert not lock.owned()
    # the hold it did not learn of is given back (perhaps by the watchdog thread, soon after)
    assert _until(lambda: not cluster_client.exists(_lock_key(name)), BOUND)
    # the grant (1), then the undo's release (1): never the grant twice
    assert _evalsha_calls(cluster) - before == 2
    assert DistLock(name, client=cluster_client).acquire(blocking=False)


def _name_in_slot(slot: int, prefix: str) -> str:
    """A lock name whose key hashes to ``slot``."""
    for i in range(2_000_000):
        name = f"{prefix}:{i}"
        if key_slot(_lock_key(name).encode()) == slot:
            return name
    raise AssertionError(f"no name found for slot {slot}")


def test_redis_cli_reshard_under_a_held_lock_keeps_it_and_never_two_holders(
        cluster: Any, healthy_cluster: Any) -> None:
    """``redis-cli --cluster reshard`` moves the held lock's slot (the lowest slot of its
    master: the one redis-cli takes first) with its keys, while a rival keeps trying: the rival
    never gets it, the holder keeps its hold through more than a lease (``on_lost`` never
    fires), and the lock passes to the rival only after the release."""
    client, other = cluster.client(), cluster.client()
    try:
        distlock.configure(lease=2.0, renew_interval=0.4)
        source = cluster.masters()[0]
        first = min(lo for lo, _, master, _ in cluster.slots() if master == source)
        name = _name_in_slot(first, f"cl:cli-reshard:{uuid.uuid4().hex[:6]}")
        lock = DistLock(name, client=client)
        lost_at: List[float] = []
        lock.on_lost(lambda _: lost_at.append(time.monotonic()))
        assert lock.acquire()
        rival = DistLock(name, client=other)
        stop = threading.Event()
        rival_got: List[bool] = []

        def hammer() -> None:
            while not stop.is_set():
                try:
                    if rival.acquire(blocking=False):
                        rival_got.append(True)
                        rival.release()
                except redis.RedisError:
                    pass  # a redirection it could not follow in time: not a grant
                time.sleep(0.01)

        thread = threading.Thread(target=hammer)
        thread.start()
        try:
            target = next(m for m in cluster.masters() if m != source)
            cluster.reshard_with_cli(source, target, 1)
            assert cluster.master_of_key(_lock_key(name)) == target, "redis-cli moved another slot"
            time.sleep(2.5)  # more than a lease, renewed on the new owner only
        finally:
            stop.set()
            thread.join(BOUND)
        assert not rival_got, "two holders"
        assert not lost_at and lock.owned()
        lock.release()
        assert rival.acquire(timeout=BOUND)
        rival.release()
    finally:
        client.close()
        other.close()


def _behind_proxies(cluster: Any) -> Tuple[Dict[Tuple[str, int], Any], Callable[[Any], Any]]:
    """A FaultProxy per node, and the ``address_remap`` that sends a client through them."""
    from distlock.testing import FaultProxy

    proxies = {tuple(addr): FaultProxy(*addr) for addr in cluster.addrs}

    def remap(addr: Any) -> Any:
        proxy = proxies.get((addr[0], int(addr[1])))
        return addr if proxy is None else (proxy.host, proxy.port)
    return proxies, remap


@pytest.mark.parametrize("shell", ["threads", "asyncio"])
def test_a_moved_reply_is_followed_through_the_clients_address_remap(
        cluster: Any, healthy_cluster: Any, shell: str) -> None:
    """redis-py maps the addresses of CLUSTER SLOTS through ``address_remap`` (nodes behind NAT
    or port forwards; the nemesis' proxies) but not those of a MOVED reply. distlock follows a
    redirection itself, and maps it too: a release after the slot moved goes to the new owner
    through its proxy, never to its own address, which such a client may not reach. The new
    owner's proxy is closed here, so a release that goes through it fails, and one that went
    around it would succeed."""
    proxies, remap = _behind_proxies(cluster)
    first = next(iter(proxies.values()))
    name = f"remap-{shell}-{uuid.uuid4().hex[:6]}"
    key = f"distlock:{{{name}}}"
    cut = (redis.TimeoutError, redis.ConnectionError)
    try:
        source = cluster.master_of_key(key)
        target = next(m for m in cluster.masters() if m != source)
        if shell == "threads":
            client = redis.RedisCluster(host=first.host, port=first.port, address_remap=remap,
                                        socket_timeout=1.0)
            try:
                lock = DistLock(name, client=client, lease=10.0)
                assert lock.acquire(timeout=BOUND)
                cluster.reshard_slot(key_slot(key.encode()), target)
                proxies[target].close()  # refuses connections from now on
                with pytest.raises(cut):
                    lock.release()
            finally:
                client.close()
        else:
            async def run() -> None:
                client = aredis.RedisCluster(host=first.host, port=first.port,
                                             address_remap=remap, socket_timeout=1.0)
                try:
                    lock = aio.DistLock(name, client=client, lease=10.0)
                    assert await lock.acquire(timeout=BOUND)
                    # the blocking twin that keeps its holds maps the nodes the same way
                    twin = lock._session().executor.client
                    mapped = {(p.host, p.port) for p in proxies.values()}
                    assert {(n.host, n.port) for n in twin.get_nodes()} <= mapped
                    await asyncio.to_thread(cluster.reshard_slot, key_slot(key.encode()), target)
                    proxies[target].close()  # refuses connections from now on
                    with pytest.raises(cut):
                        await lock.release()
                finally:
                    await client.aclose()
            asyncio.run(run())
        assert cluster.master_of_key(key) == target
    finally:
        for proxy in proxies.values():
            proxy.close()
