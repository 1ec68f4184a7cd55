"""A name is one lock (docs/guides/kinds.rst): a kind whose meaning cannot be shared with the
kind a name is in use as is refused with WrongKindError, naming both, and nothing is written.

Every ordered pair of kinds that may not share a name, the refused call made in both shells, on
a single server and on the cluster. The name is put in use by the blocking shell (another
process, as far as the refused call can tell); the refused call is each kind's first state
change: an acquire, ``set()``, a barrier's ``wait()``.
"""

from __future__ import annotations

import pickle
import uuid
from typing import Any, Callable, Dict, List, Optional, Tuple

import pytest
from _aio import run_in_loop

import distlock
import distlock.asyncio as aio
from distlock import WrongKindError

pytestmark = pytest.mark.real_redis

#: kind -> its family's letter (as the scripts name them): L lock, W read/write lock, S
#: semaphore, E event, B barrier. Two kinds of different families may share a name only when
#: both are locks (L and W: docs/guides/kinds.rst).
FAMILY = {"DistLock": "L", "DistRLock": "L", "DistCondition": "L", "DistWriteLock": "W",
          "DistReadLock": "W", "DistSemaphore": "S", "DistBoundedSemaphore": "S",
          "DistEvent": "E", "DistBarrier": "B"}

#: what WrongKindError calls each family
SHOWN = {"L": "DistLock (or DistRLock, DistCondition)", "W": "DistReadWriteLock",
         "S": "DistSemaphore", "E": "DistEvent", "B": "DistBarrier"}


def _take(kind: str, name: str, client: Any) -> Callable[[], None]:
    """Put ``name`` in use as ``kind`` (held, or state at rest); return what ends that."""
    if kind in ("DistLock", "DistRLock", "DistCondition"):
        lock = getattr(distlock, kind)(name, client=client)
        assert lock.acquire(blocking=False)
        return lock.release  # type: ignore[no-any-return]
    if kind in ("DistWriteLock", "DistReadLock"):
        rw = distlock.DistReadWriteLock(name, client=client)
        side = rw.write_lock() if kind == "DistWriteLock" else rw.read_lock()
        assert side.acquire(blocking=False)
        return side.release  # type: ignore[no-any-return]
    if kind in ("DistSemaphore", "DistBoundedSemaphore"):
        sem = getattr(distlock, kind)(name, 2, client=client)
        assert sem.acquire(blocking=False)
        return sem.release  # type: ignore[no-any-return]
    if kind == "DistEvent":
        event = distlock.DistEvent(name, client=client)
        event.set()  # an event's state at rest
        return event.clear  # type: ignore[no-any-return]
    barrier = distlock.DistBarrier(name, 2, client=client)
    barrier.abort()  # a broken barrier's state at rest
    return barrier.reset  # type: ignore[no-any-return]


def _try(kind: str, name: str, client: Any) -> Any:
    """``kind``'s first state change on ``name``, in the blocking shell."""
    if kind in ("DistLock", "DistRLock", "DistCondition"):
        return getattr(distlock, kind)(name, client=client).acquire(blocking=False)
    if kind in ("DistWriteLock", "DistReadLock"):
        rw = distlock.DistReadWriteLock(name, client=client)
        side = rw.write_lock() if kind == "DistWriteLock" else rw.read_lock()
        return side.acquire(blocking=False)
    if kind in ("DistSemaphore", "DistBoundedSemaphore"):
        return getattr(distlock, kind)(name, 2, client=client).acquire(blocking=False)
    if kind == "DistEvent":
        return distlock.DistEvent(name, client=client).set()
    return distlock.DistBarrier(name, 2, client=client).wait(timeout=5)


async def _atry(kind: str, name: str, aclient: Any) -> Any:
    """``kind``'s first state change on ``name``, in the asyncio shell."""
    if kind in ("DistLock", "DistRLock", "DistCondition"):
        return await getattr(aio, kind)(name, client=aclient).acquire(blocking=False)
    if kind in ("DistWriteLock", "DistReadLock"):
        rw = aio.DistReadWriteLock(name, client=aclient)
        side = rw.write_lock() if kind == "DistWriteLock" else rw.read_lock()
        return await side.acquire(blocking=False)
    if kind in ("DistSemaphore", "DistBoundedSemaphore"):
        return await getattr(aio, kind)(name, 2, client=aclient).acquire(blocking=False)
    if kind == "DistEvent":
        return await aio.DistEvent(name, client=aclient).set()
    return await aio.DistBarrier(name, 2, client=aclient).wait(timeout=5)


def _refused_pairs() -> List[Tuple[str, str]]:
    return [(held, tried) for held in FAMILY for tried in FAMILY
            if FAMILY[held] != FAMILY[tried] and {FAMILY[held], FAMILY[tried]} != {"L", "W"}]


def _state(client: Any, name: str) -> Dict[str, Optional[bytes]]:
    """Every key any kind keeps for ``name``, with its value (DUMP), and its TTL's presence."""
    tag = f"distlock:{{{name}}}"
    suffixes = ["", ":q", ":fd", ":fq", ":fe", ":fence", ":rw:w", ":rw:r", ":rw:q", ":sem",
                ":sem:q", ":sem:x", ":ev", ":ev:w", ":ev:t", ":bar", ":bar:w", ":bar:x"]
    return {tag + s: client.dump(tag + s) for s in suffixes}


def _check(exc: WrongKindError, name: str, held: str, tried: str) -> None:
    assert isinstance(exc, TypeError) and isinstance(exc, distlock.DistLockError)
    assert exc.name == name and exc.kind == SHOWN[FAMILY[held]] and exc.this == SHOWN[FAMILY[tried]]
    assert str(exc) == f"{name!r} is a {exc.kind} here; this is a {exc.this}"
    again = pickle.loads(pickle.dumps(exc))
    assert type(again) is WrongKindError and (again.name, again.kind, again.this) == \
        (exc.name, exc.kind, exc.this) and str(again) == str(exc)


@pytest.mark.cluster_too
@pytest.mark.parametrize("held,tried", _refused_pairs())
def test_a_name_in_use_as_another_kind_is_refused_and_nothing_is_written(
        client: Any, held: str, tried: str) -> None:
    # no renewal between the snapshots: a renewal rewrites the hold, which is not the refused
    # call's doing (a loaded machine took longer than the 10 s renew interval here)
    distlock.configure(lease=120.0, renew_interval=100.0)
    name = f"kind-{uuid.uuid4().hex[:8]}"
    end = _take(held, name, client)
    try:
        before = _state(client, name)
        with pytest.raises(WrongKindError) as info:
            _try(tried, name, client)
        _check(info.value, name, held, tried)
        assert _state(client, name) == before, "a refused call wrote something"
    finally:
        end()


@pytest.mark.cluster_too
@pytest.mark.parametrize("held,tried", _refused_pairs())
def test_an_async_call_on_a_name_of_another_kind_is_refused_and_nothing_is_written(
        client: Any, url: str, held: str, tried: str) -> None:
    # no renewal between the snapshots: a renewal rewrites the hold, which is not the refused
    # call's doing (a loaded machine took longer than the 10 s renew interval here)
    distlock.configure(lease=120.0, renew_interval=100.0)
    name = f"akind-{uuid.uuid4().hex[:8]}"
    end = _take(held, name, client)
    try:
        before = _state(client, name)

        async def body(aclient: Any) -> Any:
            with pytest.raises(WrongKindError) as info:
                await _atry(tried, name, aclient)
            return info.value

        _check(run_in_loop(url, body), name, held, tried)
        assert _state(client, name) == before, "a refused call wrote something"
    finally:
        end()


@pytest.mark.cluster_too
@pytest.mark.parametrize("kind", sorted(FAMILY))
def test_a_name_has_no_kind_once_nothing_holds_waits_or_keeps_state(client: Any, kind: str) -> None:
    """After the kind's hold ends (or its state at rest is cleared), every other kind may have
    the name: the fence counter that stays behind gives no kind."""
    name = f"kfree-{uuid.uuid4().hex[:8]}"
    _take(kind, name, client)()
    for other in sorted(FAMILY):
        if FAMILY[other] == FAMILY[kind]:
            continue
        _take(other, name, client)()


@pytest.mark.cluster_too
def test_a_condition_waited_on_is_a_lock(client: Any) -> None:
    """A DistCondition's waiter holds no lock while it waits, but the name is a lock's: its
    wait would take the lock back, so another kind is refused meanwhile."""
    import threading

    name = f"kcond-{uuid.uuid4().hex[:8]}"
    cond = distlock.DistCondition(name, client=client)

    def wait() -> None:
        with cond:
            cond.wait(30)

    waiting = threading.Thread(target=wait, name="kind-cond-waiter", daemon=True)
    waiting.start()
    try:
        leases, lock = f"distlock:{{{name}}}:cond:l:{name}", f"distlock:{{{name}}}"
        for _ in range(1000):
            if client.exists(leases) and not client.exists(lock):  # waiting, the lock released
                break
            threading.Event().wait(0.01)
        with pytest.raises(WrongKindError):
            distlock.DistSemaphore(name, 1, client=client).acquire(blocking=False)
    finally:
        with cond:
            cond.notify_all()
        waiting.join(30)
    assert not waiting.is_alive()


def test_a_kind_waited_on_is_a_kind(client: Any) -> None:
    """A name is a kind while it is waited on, not only while held: an event's waiter."""
    import threading

    name = f"kwait-{uuid.uuid4().hex[:8]}"
    event = distlock.DistEvent(name, client=client)
    waiting = threading.Thread(target=event.wait, args=(30,), name="kind-event-waiter", daemon=True)
    waiting.start()
    try:
        for _ in range(500):
            if client.exists(f"distlock:{{{name}}}:ev:w"):
                break
            threading.Event().wait(0.01)
        with pytest.raises(WrongKindError):
            distlock.DistSemaphore(name, 1, client=client).acquire(blocking=False)
    finally:
        event.set()
        waiting.join(30)
        event.clear()
    assert not waiting.is_alive()


@pytest.mark.cluster_too
def test_a_release_beyond_lost_permits_is_refused_on_a_name_now_of_another_kind(
        client: Any) -> None:
    """A permit lost with the server's data, the name taken by a lock meanwhile: releasing the
    lost permit makes nothing and reports the loss, as before; a release beyond the permits
    held would make a semaphore on the lock's name, and is refused, writing nothing."""
    name = f"klost-{uuid.uuid4().hex[:8]}"
    sem = distlock.DistSemaphore(name, 1, client=client)
    assert sem.acquire(blocking=False)
    client.delete(f"distlock:{{{name}}}:sem")  # the permit is lost (the server lost it)
    lock = distlock.DistLock(name, client=client)
    assert lock.acquire(blocking=False)
    try:
        before = _state(client, name)
        with pytest.raises(distlock.LockLostError):
            sem.release()
        with pytest.raises(WrongKindError):
            sem.release()
        assert _state(client, name) == before
    finally:
        lock.release()
    assert not client.exists(f"distlock:{{{name}}}:sem")


def test_a_release_of_own_permits_that_would_make_a_semaphore_asks_for_the_kind_keys(
        client: Any) -> None:
    """``sem_release`` of the caller's own ids, sent without the other kinds' keys: when there
    is no semaphore and one id was handed (released on its owner's behalf, so releasing it
    again counts beyond the permits held), it answers REL_UNCHECKED and changes nothing; with
    the keys, on a name that is a lock's, it is refused."""
    from distlock._core.keys import SemKeys
    from distlock._core.replies import REL_UNCHECKED
    from distlock._session.session import session_for

    name = f"kask-{uuid.uuid4().hex[:8]}"
    keys = SemKeys.of("distlock:", name)
    session = session_for(client)
    client.zadd(keys.handed, {"me:1:1": 2 ** 50})
    lock = distlock.DistLock(name, client=client)
    assert lock.acquire(blocking=False)
    try:
        before = _state(client, name)
        assert session.run("sem_release", keys.release_own, (1, "0", 1, "me:1:1")) == REL_UNCHECKED
        with pytest.raises(Exception, match="DISTLOCK_WRONGKIND L S"):
            session.run("sem_release", keys.release, (1, "0", 1, "me:1:1"))
        assert _state(client, name) == before
    finally:
        lock.release()
        client.delete(keys.handed)
