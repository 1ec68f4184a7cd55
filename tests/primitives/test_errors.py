"""LockNotOwnedError and LockLostError carry the primitive's name and the hold's token, and
survive a pickle round trip (multiprocessing sends exceptions between processes)."""

from __future__ import annotations

import pickle
import threading
from typing import Any, Callable, Tuple

import pytest
from _procs import SPAWN

from distlock import DistLock, DistReadWriteLock, DistRLock, DistSemaphore, LockLostError, LockNotOwnedError

KINDS = ["DistLock", "DistRLock", "read", "write"]


def make(kind: str, name: str, client: Any) -> Tuple[Any, str]:
    """A lock of ``kind`` and the key its hold lives in."""
    if kind == "DistLock":
        return DistLock(name, client=client), f"distlock:{{{name}}}"
    if kind == "DistRLock":
        return DistRLock(name, client=client), f"distlock:{{{name}}}"
    rw = DistReadWriteLock(name, client=client)
    if kind == "read":
        return rw.read_lock(), f"distlock:{{{name}}}:rw:r"
    return rw.write_lock(), f"distlock:{{{name}}}:rw:w"


def caught(fn: Callable[[], Any]) -> BaseException:
    try:
        fn()
    except BaseException as exc:  # noqa: BLE001
        return exc
    raise AssertionError("nothing was raised")


def same_after_pickle(exc: LockNotOwnedError) -> None:
    back = pickle.loads(pickle.dumps(exc))
    assert type(back) is type(exc)
    assert str(back) == str(exc)
    assert (back.name, back.token) == (exc.name, exc.token)
    assert isinstance(back, RuntimeError)


@pytest.mark.parametrize("kind", KINDS)
def test_unowned_release_names_the_lock(client: Any, kind: str) -> None:
    lock, _key = make(kind, f"err-unowned-{kind}", client)
    exc = caught(lock.release)
    assert type(exc) is LockNotOwnedError
    assert exc.name == f"err-unowned-{kind}"
    assert exc.token is None
    same_after_pickle(exc)


@pytest.mark.parametrize("kind", KINDS)
def test_lost_lease_carries_name_and_token(client: Any, kind: str) -> None:
    lock, key = make(kind, f"err-lost-{kind}", client)
    assert lock.acquire(blocking=False)
    token = lock.token
    assert isinstance(token, int)
    client.delete(key)  # the hold is gone from Redis (expired, force-released, restarted)
    exc = caught(lock.release)
    assert type(exc) is LockLostError
    assert (exc.name, exc.token) == (f"err-lost-{kind}", token)
    same_after_pickle(exc)


def test_lost_reentry_carries_the_token(client: Any) -> None:
    lock = DistRLock("err-reenter", client=client)
    lock.acquire()
    token = lock.token
    client.delete("distlock:{err-reenter}")
    exc = caught(lock.acquire)
    assert type(exc) is LockLostError and (exc.name, exc.token) == ("err-reenter", token)
    with pytest.raises(LockLostError):
        lock.release()


def test_semaphore_lost_permit_names_it(client: Any) -> None:
    sem = DistSemaphore("err-sem", 1, client=client, lease=60)
    assert sem.acquire(blocking=False)
    key = "distlock:{err-sem}:sem"
    (permit,) = [owner for (k, owner) in sem._session().holds if k == key]
    assert client.zrem(key, permit) == 1  # its lease ran out, say
    exc = caught(sem.release)
    assert type(exc) is LockLostError
    assert (exc.name, exc.token) == ("err-sem", None)
    same_after_pickle(exc)


def test_constructed_by_hand_and_repr() -> None:
    exc = LockLostError("lease on 'x' was lost before release", name="x", token=7)
    assert str(exc) == "lease on 'x' was lost before release"
    assert "name='x'" in repr(exc) and "token=7" in repr(exc)
    plain = LockNotOwnedError("cannot release un-acquired lock")
    assert plain.name is None and plain.token is None
    same_after_pickle(exc)
    same_after_pickle(plain)


def _raise_lost(conn: Any) -> None:
    conn.send(LockLostError("lease on 'far' was lost before release", name="far", token=42))
    conn.close()


def test_crosses_a_process_boundary(children: Any) -> None:
    """What multiprocessing does with an exception: pickled in the child, rebuilt here."""
    parent, child = SPAWN.Pipe()
    proc = SPAWN.Process(target=_raise_lost, args=(child,), daemon=True)
    proc.start()
    child.close()
    assert parent.poll(60)
    exc = parent.recv()
    proc.join(30)
    assert type(exc) is LockLostError
    assert (exc.name, exc.token) == ("far", 42)


def test_threading_condition_over_a_lost_rlock(client: Any) -> None:
    """The error reaches code written for threading as the RuntimeError it expects."""
    lock = DistRLock("err-cond-rlock", client=client)
    cond = threading.Condition(lock)
    with pytest.raises(RuntimeError):
        cond.notify()


#: Pickles made by distlock before the layered layout (the exceptions then lived in
#: ``distlock._errors``): protocol 2, made with that version's own classes.
_OLD_PICKLES = {
    "LockLostError": b"\x80\x02cdistlock._errors\n_rebuild\nq\x00(cdistlock._errors\nLockLostError\n"
                     b"q\x01X\x0e\x00\x00\x00lost orders:42q\x02X\t\x00\x00\x00orders:42"
                     b"q\x03K\x07tq\x04Rq\x05.",
    "NotEnoughReplicasError": b"\x80\x02cdistlock._errors\n_rebuild_replicas\nq\x00(cdistlock._errors\n"
                              b"NotEnoughReplicasError\nq\x01X\x05\x00\x00\x00shortq\x02K\x00K\x01tq\x03Rq\x04.",
    "QuorumError": b"\x80\x02cdistlock._errors\n_rebuild_quorum\nq\x00(cdistlock._errors\nQuorumError\nq\x01"
                   b"X\x01\x00\x00\x00qq\x02K\x01K\x02tq\x03Rq\x04.",
}


def test_pickles_made_before_the_layout_still_load() -> None:
    import distlock

    lost = pickle.loads(_OLD_PICKLES["LockLostError"])
    assert type(lost) is distlock.LockLostError
    assert (str(lost), lost.name, lost.token) == ("lost orders:42", "orders:42", 7)
    short = pickle.loads(_OLD_PICKLES["NotEnoughReplicasError"])
    assert type(short) is distlock.NotEnoughReplicasError
    assert (short.acknowledged, short.required) == (0, 1)
    quorum = pickle.loads(_OLD_PICKLES["QuorumError"])
    assert type(quorum) is distlock.QuorumError
    assert (quorum.answered, quorum.required) == (1, 2)


def test_the_old_metrics_reset_still_works() -> None:
    import distlock
    import distlock._metrics

    assert distlock._metrics.reset is distlock.reset_metrics
    distlock._metrics.reset()
    assert distlock.metrics()["series"] == []
