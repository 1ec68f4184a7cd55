"""Replica-acknowledged grants (``min_replicas``) and fencing tokens across a failover (issue 15).

Real servers: a master and two replicas (tests/support/_replication.py, the ``replication`` fixture),
and the session's Redis Cluster for the cluster cases. Timing is only ever bounded from above
with generous slack, and from below by what the code guarantees by construction (a hold is
never reported lost before its lease from the grant has run out).
"""

from __future__ import annotations

import asyncio
import pickle
import threading
import time
from typing import Any, Callable, Dict, Tuple

import pytest
import redis
import redis.asyncio as aredis

import distlock
import distlock.asyncio as adistlock
from distlock import LockLostError, NotEnoughReplicasError
from distlock._core.replicas import (
    DEFAULT_REPLICA_TIMEOUT,
    acks_for,
    batch_wait,
    check_min_replicas,
    check_replica_timeout,
    refuse_options,
    refuse_quorum,
    renewal_counts,
    short_of,
)
from distlock._core.settings import Settings

#: generous slack for anything bounded by a timeout on a loaded 2-core machine
SLACK = 5.0


# --- the primitives, and where each keeps a hold --------------------------------------------

def _rw(module: Any, side: str) -> Callable[..., Any]:
    def make(name: str, client: Any, **options: Any) -> Any:
        rw = module.DistReadWriteLock(name, client=client, **options)
        return rw.read_lock() if side == "read" else rw.write_lock()
    return make


def _makers(module: Any) -> Dict[str, Callable[..., Any]]:
    return {
        "lock": lambda name, client, **kw: module.DistLock(name, client=client, **kw),
        "rlock": lambda name, client, **kw: module.DistRLock(name, client=client, **kw),
        "read": _rw(module, "read"),
        "write": _rw(module, "write"),
        "semaphore": lambda name, client, **kw: module.DistSemaphore(name, 1, client=client, **kw),
        "bounded": lambda name, client, **kw: module.DistBoundedSemaphore(name, 1, client=client, **kw),
    }


SYNC = _makers(distlock)
ASYNC = _makers(adistlock)


def held_in_redis(client: redis.Redis, kind: str, name: str) -> bool:
    """Whether Redis has a hold of ``kind`` on ``name`` (a permit: a member with a deadline)."""
    base = f"distlock:{{{name}}}"
    if kind in ("lock", "rlock"):
        return bool(client.exists(base))
    if kind == "read":
        return bool(client.zcard(f"{base}:rw:r"))
    if kind == "write":
        return bool(client.exists(f"{base}:rw:w"))
    return bool(client.zrangebyscore(f"{base}:sem", 0, "+inf"))


def hold_key(kind: str, name: str) -> str:
    base = f"distlock:{{{name}}}"
    return {"read": f"{base}:rw:r", "write": f"{base}:rw:w", "semaphore": f"{base}:sem",
            "bounded": f"{base}:sem"}.get(kind, base)


def wait_calls(client: redis.Redis) -> int:
    stats = client.info("commandstats").get("cmdstat_wait")
    return int(stats["calls"]) if stats else 0


# --- the no-I/O logic (distlock/_replicas.py) -----------------------------------------------

def test_acks_resolve_against_the_defaults() -> None:
    defaults = Settings()
    assert defaults.min_replicas == 0 and defaults.replica_timeout == DEFAULT_REPLICA_TIMEOUT
    assert acks_for(None, None, defaults) is None  # k = 0: nothing is waited for
    assert acks_for(0, 2.0, Settings(min_replicas=3)) is None  # the object's own 0 wins
    assert acks_for(2, None, defaults) == (2, 500)
    assert acks_for(None, 0.25, Settings(min_replicas=1)) == (1, 250)
    assert acks_for(1, 0.0001, defaults) == (1, 1)  # never WAIT's 0, which waits for ever


def test_short_of_counts_what_answered() -> None:
    assert short_of((2, 100), 2) is None and short_of((2, 100), 3) is None
    assert short_of((2, 100), 1) == 1 and short_of((2, 100), 0) == 0
    assert short_of((1, 100), redis.ResponseError("ERR WAIT")) == 0  # an error counts as none


def test_one_wait_for_a_batch_of_renewals() -> None:
    assert batch_wait([None, None], 10.0) is None
    assert batch_wait([None, (1, 100), (2, 50)], 10.0) == (2, 100)
    # at most half the renew interval: the watchdog's connection times out after one
    assert batch_wait([(1, 9000)], 1.0) == (1, 500)
    assert renewal_counts(None, None) and renewal_counts(None, 0)  # k = 0: always counts
    assert renewal_counts((2, 100), 2) and not renewal_counts((2, 100), 1)


def test_checks_of_the_options() -> None:
    assert check_min_replicas(0) == 0 and check_min_replicas(2) == 2
    assert check_replica_timeout(1) == 1.0 and check_replica_timeout(0.05) == 0.05
    for bad, error in ((-1, ValueError), (True, TypeError), (1.0, TypeError), ("2", TypeError),
                       (None, TypeError), (10 ** 6, ValueError)):
        with pytest.raises(error, match="min_replicas"):
            check_min_replicas(bad)
    for bad, error in (("1", TypeError), (False, TypeError), (0, ValueError), (-0.5, ValueError),
                       (float("nan"), ValueError), (float("inf"), ValueError), (10 ** 30, ValueError)):
        with pytest.raises(error, match="replica_timeout"):
            check_replica_timeout(bad)
    with pytest.raises(TypeError, match="takes no min_replicas"):
        refuse_options("DistEvent", 0, None)
    refuse_options("DistEvent", None, None)
    with pytest.raises(TypeError, match="Redlock"):
        refuse_quorum(True, 1)
    refuse_quorum(True, 0)


def test_the_error_pickles_with_its_counts() -> None:
    exc = NotEnoughReplicasError("'x': 1 of 2 replicas acknowledged the grant",
                                 acknowledged=1, required=2)
    back = pickle.loads(pickle.dumps(exc))
    assert type(back) is NotEnoughReplicasError and isinstance(back, distlock.DistLockError)
    assert (back.acknowledged, back.required, str(back)) == (1, 2, str(exc))
    assert "acknowledged=1" in repr(back) and "required=2" in repr(back)
    assert adistlock.NotEnoughReplicasError is NotEnoughReplicasError


# --- bad input ----------------------------------------------------------------------------------

BAD_OPTIONS = [
    ({"min_replicas": -1}, ValueError, "min_replicas must be >= 0"),
    ({"min_replicas": True}, TypeError, "min_replicas must be an int, not bool"),
    ({"min_replicas": 1.0}, TypeError, "min_replicas must be an int, not float"),
    ({"min_replicas": "1"}, TypeError, "min_replicas must be an int, not str"),
    ({"replica_timeout": "1"}, TypeError, "replica_timeout must be a number of seconds, not str"),
    ({"replica_timeout": 0}, ValueError, "replica_timeout must be a positive number"),
    ({"replica_timeout": -1.0}, ValueError, "replica_timeout must be a positive number"),
    ({"replica_timeout": float("nan")}, ValueError, "replica_timeout must not be NaN"),
]


@pytest.mark.parametrize("kind", sorted(SYNC))
@pytest.mark.parametrize("shell", ["sync", "asyncio"])
@pytest.mark.parametrize("options,error,message", BAD_OPTIONS)
def test_bad_options_raise_the_right_error(kind: str, shell: str, options: Dict[str, Any],
                                           error: type, message: str) -> None:
    makers = SYNC if shell == "sync" else ASYNC
    with pytest.raises(error) as info:
        makers[kind]("bad", None, **options)
    assert str(info.value).startswith(message), str(info.value)
    assert not str(info.value).endswith(".")


@pytest.mark.parametrize("options,error,message", BAD_OPTIONS)
def test_configure_checks_the_defaults_and_changes_nothing(options: Dict[str, Any], error: type,
                                                           message: str) -> None:
    before = distlock.configure()
    try:
        with pytest.raises(error, match=message.split(",")[0]):
            distlock.configure(**options)
        assert distlock.configure() == before
        assert distlock.configure(min_replicas=2, replica_timeout=0.2).min_replicas == 2
    finally:
        from distlock._core.settings import reset_settings
        reset_settings()


def _others(module: Any) -> Dict[str, Callable[..., Any]]:
    return {
        "DistEvent": lambda **kw: module.DistEvent("bad", **kw),
        "DistCondition": lambda **kw: module.DistCondition("bad", **kw),
        "DistBarrier": lambda **kw: module.DistBarrier("bad", 2, **kw),
    }


@pytest.mark.parametrize("shell", ["sync", "asyncio"])
@pytest.mark.parametrize("kind", ["DistEvent", "DistCondition", "DistBarrier"])
@pytest.mark.parametrize("options", [{"min_replicas": 1}, {"min_replicas": 0},
                                     {"replica_timeout": 0.5}])
def test_event_condition_barrier_refuse_the_options(shell: str, kind: str,
                                                     options: Dict[str, Any]) -> None:
    """They grant nothing a replica could acknowledge: a TypeError that says so."""
    make = _others(distlock if shell == "sync" else adistlock)[kind]
    with pytest.raises(TypeError) as info:
        make(**options)
    name = next(iter(options))
    assert str(info.value).startswith(f"{kind}() takes no {name}: only locks and semaphores")


@pytest.mark.parametrize("cls", [distlock.DistLock, distlock.DistRLock])
def test_a_redlock_list_with_min_replicas_is_refused(cls: type) -> None:
    """Independent masters have no replicas to wait for: TypeError, whatever else the list
    would be (the Redlock constructors accept lists; this check comes first)."""
    masters = [redis.Redis(port=1), redis.Redis(port=2), redis.Redis(port=3)]
    with pytest.raises(TypeError, match="min_replicas does not apply to a Redlock quorum"):
        cls("quorum", client=masters, min_replicas=1)


@pytest.mark.parametrize("cls", [adistlock.DistLock, adistlock.DistRLock])
def test_an_asyncio_redlock_list_with_min_replicas_is_refused(cls: type) -> None:
    """The asyncio shell's locks check it too, before the list's own checks."""
    masters = [aredis.Redis(port=1), aredis.Redis(port=2), aredis.Redis(port=3)]
    with pytest.raises(TypeError, match="min_replicas does not apply to a Redlock quorum"):
        cls("quorum", client=masters, min_replicas=1)


@pytest.mark.parametrize("cls", [distlock.DistLock, distlock.DistRLock,
                                 adistlock.DistLock, adistlock.DistRLock])
def test_a_configured_min_replicas_does_not_reach_a_redlock_lock(cls: type) -> None:
    """``configure(min_replicas=k)`` is a default for the locks it can apply to: a Redlock
    lock asks no master for a WAIT (its quorum is its answer to a master's loss), while a
    lock on one server does. The asyncio shell's locks too, though their blocking constructor
    never sees the client."""
    made = aredis.Redis if cls.__module__.startswith("distlock.asyncio") else redis.Redis
    masters = [made(port=1), made(port=2), made(port=3)]
    distlock.configure(min_replicas=2)
    try:
        assert cls("quorum", client=masters)._acks() is None
        assert cls("single", client=made(port=1))._acks() == (2, 500)
    finally:
        from distlock._core.settings import reset_settings
        reset_settings()


# --- grants ----------------------------------------------------------------------------------

@pytest.mark.real_redis
@pytest.mark.parametrize("k", [1, 2])
@pytest.mark.parametrize("kind", sorted(SYNC))
def test_an_acknowledged_grant_is_on_the_replicas(replication: Any, kind: str, k: int) -> None:
    master = replication.client(0)
    replicas = [replication.client(i) for i in (1, 2)]
    try:
        prim = SYNC[kind]("acked", master, min_replicas=k)
        assert prim.acquire() is True
        # k replicas acknowledged the grant before acquire returned: they have the hold
        assert sum(held_in_redis(r, kind, "acked") for r in replicas) >= k
        prim.release()
    finally:
        for conn in (master, *replicas):
            conn.close()


@pytest.mark.real_redis
@pytest.mark.parametrize("kind", sorted(SYNC))
def test_too_few_replicas_raise_and_leave_no_hold(replication: Any, kind: str) -> None:
    master = replication.client(0)
    try:
        replication.stop(2)  # SIGSTOP: it no longer acknowledges, the master still counts it
        prim = SYNC[kind]("short", master, min_replicas=2, replica_timeout=0.3)
        started = time.monotonic()
        with pytest.raises(NotEnoughReplicasError) as info:
            prim.acquire()
        elapsed = time.monotonic() - started
        assert (info.value.acknowledged, info.value.required) == (1, 2)
        assert "1 of 2 replicas" in str(info.value)
        assert elapsed < 0.3 + SLACK  # the timeout plus a round trip, generously
        assert not held_in_redis(master, kind, "short")  # given back
        assert not (prim.owned() if hasattr(prim, "owned") else False)
        # nothing is left behind: another caller gets it at once
        other = SYNC[kind]("short", replication.client(0))
        assert other.acquire(blocking=False) is True
        other.release()
    finally:
        master.close()


@pytest.mark.real_redis
def test_a_connection_lost_during_wait_raises_and_gives_the_grant_back(replication: Any) -> None:
    """The grant ran but its connection died while WAIT blocked (docs/design.rst, principle 13:
    the reply is lost, the script is not sent again): acquire raises the connection error,
    never False, and the grant is given back after reading that it is there."""
    master = replication.client(0)
    try:
        replication.stop(2)  # WAIT 2 now blocks for its whole timeout
        caught: list = []

        def acquire() -> None:
            lock = distlock.DistLock("cut", client=replication.client(0), min_replicas=2,
                                     replica_timeout=30)
            try:
                caught.append(lock.acquire())
            except BaseException as exc:  # noqa: BLE001 - the test looks at it
                caught.append(exc)

        thread = threading.Thread(target=acquire)
        thread.start()
        deadline = time.monotonic() + 20
        waiting = []
        while not waiting and time.monotonic() < deadline:
            waiting = [c for c in master.client_list() if c.get("cmd") == "wait"]
            time.sleep(0.01)
        assert waiting and master.exists("distlock:{cut}")  # granted, WAIT blocking
        master.client_kill_filter(_id=waiting[0]["id"])
        thread.join(timeout=30)
        assert not thread.is_alive()
        assert len(caught) == 1 and isinstance(caught[0], redis.ConnectionError), caught
        assert not master.exists("distlock:{cut}")  # given back
    finally:
        master.close()


@pytest.mark.real_redis
def test_a_re_entry_sends_no_wait(replication: Any) -> None:
    """A re-entry creates no grant: nothing for replicas to acknowledge, no WAIT sent."""
    master = replication.client(0)
    try:
        lock = distlock.DistRLock("again", client=master, min_replicas=2)
        assert lock.acquire()
        before = wait_calls(master)
        replication.stop(2)
        assert lock.acquire()  # would raise if it waited for both replicas
        assert wait_calls(master) == before
        lock.release()
        lock.release()  # releases are sent as they are, never waited for
        assert wait_calls(master) == before
    finally:
        master.close()


@pytest.mark.real_redis
def test_a_waiter_granted_after_waiting_raises_too(replication: Any) -> None:
    master = replication.client(0)
    try:
        holder = distlock.DistLock("queue", client=master)
        assert holder.acquire()
        caught: list = []

        def wait() -> None:
            waiter = distlock.DistLock("queue", client=replication.client(0), min_replicas=2,
                                       replica_timeout=0.2)
            try:
                waiter.acquire(timeout=60)
            except BaseException as exc:  # noqa: BLE001 - the test looks at it
                caught.append(exc)
            else:
                caught.append(None)

        thread = threading.Thread(target=wait)
        thread.start()
        deadline = time.monotonic() + 20
        while not master.exists("distlock:{queue}:q") and time.monotonic() < deadline:
            time.sleep(0.01)  # until the waiter is registered
        replication.stop(2)
        holder.release()
        thread.join(timeout=60)
        assert not thread.is_alive()
        assert len(caught) == 1 and isinstance(caught[0], NotEnoughReplicasError), caught
        assert (caught[0].acknowledged, caught[0].required) == (1, 2)
        assert not master.exists("distlock:{queue}")
    finally:
        master.close()


@pytest.mark.real_redis
@pytest.mark.parametrize("kind", sorted(ASYNC))
def test_the_asyncio_shell_waits_for_replicas_too(replication: Any, kind: str) -> None:
    async def main() -> None:
        client = aredis.Redis(host="127.0.0.1", port=replication.port(0), socket_timeout=5)
        try:
            prim = ASYNC[kind]("aio", client, min_replicas=2, replica_timeout=0.3)
            assert await prim.acquire() is True
            await prim.release()
            replication.stop(2)
            started = time.monotonic()
            with pytest.raises(NotEnoughReplicasError) as info:
                await prim.acquire()
            assert time.monotonic() - started < 0.3 + SLACK
            assert (info.value.acknowledged, info.value.required) == (1, 2)
        finally:
            await client.aclose()

    asyncio.run(main())
    master = replication.client(0)
    try:
        assert not held_in_redis(master, kind, "aio")
    finally:
        master.close()


@pytest.mark.real_redis
def test_asyncio_waiter_and_renewals(replication: Any) -> None:
    """The asyncio shell: a task granted after waiting raises and leaves nothing; a hold whose
    renewals go unacknowledged is reported lost in its loop, not before its lease."""
    lease, interval = 2.0, 0.4
    distlock.configure(lease=lease, renew_interval=interval)

    async def main() -> float:
        client = aredis.Redis(host="127.0.0.1", port=replication.port(0), socket_timeout=5)
        try:
            holder = adistlock.DistLock("aq", client=client)
            assert await holder.acquire()
            waiter = adistlock.DistLock("aq", client=client, min_replicas=2, replica_timeout=0.2)
            task = asyncio.ensure_future(waiter.acquire(timeout=60))
            while not await client.exists("distlock:{aq}:q"):
                await asyncio.sleep(0.01)  # until the waiter is registered
            replication.stop(2)
            await holder.release()
            with pytest.raises(NotEnoughReplicasError):
                await task
            assert not await client.exists("distlock:{aq}")
            replication.resume(2)
            await asyncio.sleep(0.5)  # the replica catches up

            lost = asyncio.Event()
            kept = adistlock.DistLock("aren", client=client, min_replicas=2, replica_timeout=0.1)
            kept.on_lost(lambda _lock: lost.set())
            sent = time.monotonic()
            assert await kept.acquire()
            replication.stop(2)
            await asyncio.wait_for(lost.wait(), lease + interval + 2 + SLACK)
            fired = time.monotonic()
            assert fired >= sent + lease
            with pytest.raises(LockLostError):
                await kept.release()
            return fired - sent
        finally:
            await client.aclose()

    assert asyncio.run(main()) >= lease


# --- the cost of k = 0 -----------------------------------------------------------------------

@pytest.mark.real_redis
def test_k_zero_sends_no_wait(replication: Any) -> None:
    master = replication.client(0)
    try:
        before = wait_calls(master)
        for make in SYNC.values():
            prim = make("free", master)
            assert prim.acquire()
            prim.release()
            prim = make("free0", master, min_replicas=0)
            assert prim.acquire()
            prim.release()
        assert wait_calls(master) == before
        distlock.configure(min_replicas=1)  # the default applies to objects without their own
        lock = distlock.DistLock("free", client=master)
        assert lock.acquire()
        lock.release()
        assert wait_calls(master) == before + 1
    finally:
        master.close()


# --- renewals --------------------------------------------------------------------------------

@pytest.mark.real_redis
def test_an_unacknowledged_renewal_does_not_count(replication: Any) -> None:
    """After one replica stops, the renewals of a min_replicas=2 hold go through on the master
    but are not acknowledged: the hold keeps its last acknowledged deadline and is reported
    lost once that passes, never before its lease from the grant; a hold with k = 0 of the
    same process is unaffected."""
    lease, interval = 2.0, 0.4
    distlock.configure(lease=lease, renew_interval=interval)
    master = replication.client(0)
    try:
        lost_at: list = []
        lock = distlock.DistLock("renew", client=master, min_replicas=2, replica_timeout=0.1)
        lock.on_lost(lambda _lock: lost_at.append(time.monotonic()))
        plain = distlock.DistLock("renew-plain", client=master)
        sent = time.monotonic()
        assert lock.acquire()
        assert plain.acquire()
        replication.stop(2)
        deadline = time.monotonic() + lease + interval + 2 + SLACK
        while not lost_at and time.monotonic() < deadline:
            time.sleep(0.02)
        assert lost_at, "on_lost never fired"
        assert lost_at[0] >= sent + lease  # never before its lease from the grant
        with pytest.raises(LockLostError):
            lock.release()
        # it was given back on the master once reported lost
        end = time.monotonic() + SLACK
        while master.exists("distlock:{renew}") and time.monotonic() < end:
            time.sleep(0.02)
        assert not master.exists("distlock:{renew}")
        assert plain.owned()  # k = 0: renewed all along
        assert master.exists("distlock:{renew-plain}")
        plain.release()
    finally:
        master.close()


@pytest.mark.real_redis
def test_renewals_count_again_once_the_replica_is_back(replication: Any) -> None:
    """A replica that stops for less than the lease costs nothing: the next acknowledged
    renewal advances the deadline again."""
    lease, interval = 5.0, 0.3
    distlock.configure(lease=lease, renew_interval=interval)
    master = replication.client(0)
    try:
        lost: list = []
        lock = distlock.DistLock("blip", client=master, min_replicas=2, replica_timeout=0.1)
        lock.on_lost(lost.append)
        assert lock.acquire()
        replication.stop(2)
        time.sleep(interval * 3)  # a few renewals go unacknowledged
        replication.resume(2)
        time.sleep(lease + interval * 3)  # well past the deadline the stop would have left
        assert not lost and lock.owned()
        lock.release()
    finally:
        master.close()


# --- a cluster: WAIT goes to the slot's master --------------------------------------------

@pytest.mark.real_redis
def test_cluster_grants_wait_for_their_shard(cluster: Any, cluster_client: Any) -> None:
    key = "distlock:{crep}"
    lock = distlock.DistLock("crep", client=cluster_client, min_replicas=1)
    assert lock.acquire()
    replica = cluster.replicas_of(cluster.master_of_key(key))[0]
    with redis.Redis(host=replica[0], port=replica[1], single_connection_client=True) as conn:
        conn.execute_command("READONLY")
        assert conn.exists(key)  # acknowledged by that shard's replica before acquire returned
    lock.release()
    # each shard has one replica: two can never acknowledge
    with pytest.raises(NotEnoughReplicasError) as info:
        distlock.DistLock("crep", client=cluster_client, min_replicas=2, replica_timeout=0.1).acquire()
    assert (info.value.acknowledged, info.value.required) == (1, 2)
    assert not cluster_client.exists(key)

    async def main() -> Tuple[int, int]:
        client = cluster.aclient()
        try:
            alock = adistlock.DistLock("crep", client=client, min_replicas=1)
            assert await alock.acquire()
            await alock.release()
            with pytest.raises(NotEnoughReplicasError) as ainfo:
                await adistlock.DistLock("crep", client=client, min_replicas=2,
                                         replica_timeout=0.1).acquire()
            return ainfo.value.acknowledged, ainfo.value.required
        finally:
            await client.aclose()

    assert asyncio.run(main()) == (1, 2)
    assert not cluster_client.exists(key)


@pytest.mark.real_redis
def test_cluster_renewals_wait_on_each_shard(cluster: Any, cluster_client: Any) -> None:
    """The watchdog's batch ends each node's pipeline with a WAIT: holds with k = 1 on
    several shards stay held across many renewals (each acknowledged by its shard's replica)."""
    lease, interval = 3.0, 0.5
    distlock.configure(lease=lease, renew_interval=interval)
    names = [f"cren{i}" for i in range(6)]
    masters = {cluster.master_of_key(f"distlock:{{{n}}}") for n in names}
    assert len(masters) > 1  # the names spread over shards
    def waits(addr: Any) -> int:
        with cluster.node_client(addr) as conn:
            return wait_calls(conn)

    before = {m: waits(m) for m in masters}
    lost: list = []
    locks = [distlock.DistLock(n, client=cluster_client, min_replicas=1) for n in names]
    for lock in locks:
        lock.on_lost(lost.append)
        assert lock.acquire()
    time.sleep(lease + 4 * interval)  # past the grants' leases: only renewals kept them
    assert not lost and all(lock.owned() for lock in locks)
    for master in masters:  # every shard's master saw WAITs (grants and renewal rounds)
        assert waits(master) > before[master] + 1
    for lock in locks:
        lock.release()


# --- fencing tokens across a failover ------------------------------------------------------

@pytest.mark.real_redis
@pytest.mark.parametrize("kind", ["lock", "write"])
def test_tokens_grow_across_a_failover_that_lost_grants(replication: Any, kind: str) -> None:
    """Grants whose counter update never reached the replica that is promoted: the new
    master's counter lags, and the token of its first grant is still greater than every
    earlier one (floored at the server's clock)."""
    name = "fence-fo"
    fence = f"distlock:{{{name}}}:fence"
    master = replication.client(0)
    try:
        first = SYNC[kind](name, master, lease=30)
        assert first.acquire()
        tokens = [first.token]
        first.release()
        master.set("probe", "1")
        assert master.execute_command("WAIT", 2, 5000) == 2  # the replicas have that counter
        replication.cut(1)  # from now on, nothing reaches replica 1
        for _ in range(5):
            prim = SYNC[kind](name, master, lease=30)
            assert prim.acquire()
            tokens.append(prim.token)
            prim.release()
        assert tokens == sorted(set(tokens))
        replication.kill(0)
    finally:
        master.close()
    replication.promote(1)
    promoted = replication.client(1)
    try:
        assert int(promoted.get(fence)) < max(tokens)  # the scenario: its counter lags
        after = SYNC[kind](name, promoted, lease=30)
        assert after.acquire()
        assert after.token > max(tokens)
        assert after.token < 2 ** 53
        after.release()
    finally:
        promoted.close()


# --- the double grant, both ways ------------------------------------------------------------

@pytest.mark.real_redis
def test_without_min_replicas_a_failover_can_grant_twice(replication: Any) -> None:
    """The window asynchronous replication leaves, made deterministic: both replicas are cut
    off, a k = 0 grant succeeds on the master alone, the master dies, a replica is promoted,
    and a second client takes the same lock there. The token still tells the two apart."""
    master = replication.client(0)
    try:
        replication.cut(1)
        replication.cut(2)
        first = distlock.DistLock("twice", client=master, lease=30)
        assert first.acquire()
        token = first.token
        replication.kill(0)
    finally:
        master.close()
    replication.promote(1)
    promoted = replication.client(1)
    try:
        second = distlock.DistLock("twice", client=promoted, lease=30)
        assert second.acquire(blocking=False)  # the double grant
        assert second.token > token  # the floored token: the resource can refuse the first
        second.release()
    finally:
        promoted.close()


@pytest.mark.real_redis
def test_with_min_replicas_all_the_grant_fails_instead(replication: Any) -> None:
    """The same with min_replicas equal to the number of replicas: the grant cannot be
    acknowledged, so it is given back and acquire raises; the promoted replica has nothing,
    and nobody believes they hold the lock."""
    master = replication.client(0)
    try:
        replication.cut(1)
        replication.cut(2)
        first = distlock.DistLock("twice", client=master, lease=30, min_replicas=2,
                                  replica_timeout=0.2)
        with pytest.raises(NotEnoughReplicasError) as info:
            first.acquire()
        assert (info.value.acknowledged, info.value.required) == (0, 2)
        assert not first.owned() and not master.exists("distlock:{twice}")
        replication.kill(0)
    finally:
        master.close()
    replication.promote(1)
    promoted = replication.client(1)
    try:
        second = distlock.DistLock("twice", client=promoted, lease=30)
        assert second.acquire(blocking=False)  # one holder only: the first never held it
        second.release()
    finally:
        promoted.close()


@pytest.mark.real_redis
def test_an_acknowledged_grant_survives_the_promotion(replication: Any) -> None:
    """min_replicas equal to the number of replicas, all there: the grant is on every
    replica, so whichever is promoted, the lock is still held there and nobody else gets it."""
    master = replication.client(0)
    try:
        first = distlock.DistLock("kept", client=master, lease=30, min_replicas=2)
        assert first.acquire()
        token = first.token
        replication.kill(0)
    finally:
        master.close()
    replication.promote(2)
    promoted = replication.client(2)
    try:
        rival = distlock.DistLock("kept", client=promoted, lease=30)
        assert rival.acquire(blocking=False) is False
        assert int(promoted.hget("distlock:{kept}", ":t")) == token
    finally:
        promoted.close()
