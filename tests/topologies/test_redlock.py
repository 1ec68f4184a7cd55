"""Redlock on five real masters (distlock/testing/redlock.py): DistLock and DistRLock with
``client=[c1, ..., c5]``, through kills, empty restarts and stopped (SIGSTOP) masters.

Timing is asserted only as lower bounds (a wait did wait, a restarted master did sit out) and
loose upper bounds (``BOUND``); everything else is asserted on state: the keys on each master,
the validity the executor computed, the tokens it kept per master.
"""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any, List

import _workers
import pytest
from _procs import SPAWN
from _support import settle

import distlock
from distlock import DistLock, DistRLock, LockLostError, QuorumError
from distlock._core.quorum import drift
from distlock.testing.redlock import LEASE, RENEW

pytestmark = pytest.mark.real_redis

#: The loosest upper bound on anything that should be quick: only a hang fails it.
BOUND = 20.0


def _name(prefix: str) -> str:
    return f"redlock:{prefix}:{uuid.uuid4().hex[:10]}"


def _key(lock: Any) -> str:
    return f"distlock:{{{lock.name}}}"


def _part(lock: Any) -> Any:
    """What the executor keeps of ``lock``'s hold: each master's token, the validity."""
    session = lock._session()
    hold = lock._current(session)
    assert hold is not None
    return session.executor.parts[(hold.key, hold.owner)]


def _holders(redlock: Any, lock: Any) -> List[int]:
    """The masters (alive) on which ``lock``'s key exists."""
    return [i for i in range(len(redlock.servers))
            if i not in redlock.killed and redlock.admin(i).exists(_key(lock))]


# --- the grant --------------------------------------------------------------------------------

@pytest.mark.parametrize("cls", [DistLock, DistRLock])
def test_grant_on_every_master_token_is_the_largest(redlock: Any, redlock_clients: list, cls: Any) -> None:
    lock = cls(_name("grant"), client=redlock_clients)
    assert lock.acquire(timeout=BOUND) is True
    tokens = [int(redlock.admin(i).hget(_key(lock), ":t")) for i in range(5)]
    assert lock.token == max(tokens)
    assert sorted(_part(lock).tokens.values()) == sorted(tokens)
    assert _holders(redlock, lock) == [0, 1, 2, 3, 4]
    assert lock.locked() is True
    lock.release()
    assert _holders(redlock, lock) == []
    assert lock.locked() is False


def test_rlock_reenters_and_releases_on_every_master(redlock: Any, redlock_clients: list) -> None:
    lock = DistRLock(_name("reenter"), client=redlock_clients)
    with lock:
        with lock:
            counts = {redlock.admin(i).hget(_key(lock), k) for i in range(5)
                      for k in redlock.admin(i).hkeys(_key(lock)) if not k.startswith(b":")}
            assert counts == {b"2"}
            assert lock._recursion_count() == 2
        assert _holders(redlock, lock) == [0, 1, 2, 3, 4]
    assert _holders(redlock, lock) == []


def test_second_client_is_refused_then_waits_for_release(redlock: Any, redlock_clients: list) -> None:
    name = _name("contend")
    a = DistLock(name, client=redlock_clients)
    b = DistLock(name, client=redlock.clients())
    assert a.acquire(timeout=BOUND)
    assert b.acquire(blocking=False) is False
    assert _holders(redlock, b) == [0, 1, 2, 3, 4]  # the refused try left nothing of its own
    started = time.monotonic()
    assert b.acquire(timeout=0.3) is False
    assert time.monotonic() - started >= 0.25
    threading.Timer(0.2, a.release).start()
    assert b.acquire(timeout=BOUND) is True
    b.release()


def test_watchdog_keeps_the_hold_past_its_lease(redlock: Any, redlock_clients: list) -> None:
    lock = DistLock(_name("watchdog"), client=redlock_clients)
    lost: List[Any] = []
    lock.on_lost(lost.append)
    assert lock.acquire(timeout=BOUND)
    time.sleep(LEASE * 2)
    assert lock.owned() and not lost
    assert _holders(redlock, lock) == [0, 1, 2, 3, 4]
    lock.release()


# --- exclusion across processes -----------------------------------------------------------------

@pytest.mark.parametrize("kind,reenter", [("DistLock", False), ("DistRLock", True)])
def test_no_lost_update_across_processes(redlock: Any, kind: str, reenter: bool) -> None:
    """4 processes x 100 GET/SET increments under the Redlock lock: the total is exact."""
    name = _name("counter")
    settings = {"lease": LEASE, "renew_interval": RENEW}
    with SPAWN.Pool(4) as pool:
        done = pool.starmap(_workers.count_under_lock,
                            [(redlock.urls, kind, name, "counter", 100, reenter, settings)] * 4)
    assert sum(done) == 400
    assert int(redlock.admin(0).get("counter")) == 400
    assert all(not redlock.admin(i).exists(f"distlock:{{{name}}}") for i in range(5))


# --- masters down -------------------------------------------------------------------------------

def test_two_masters_killed_still_works(redlock: Any, redlock_clients: list) -> None:
    redlock.kill(3)
    redlock.kill(4)
    name = _name("two-down")
    a = DistLock(name, client=redlock_clients)
    b = DistLock(name, client=redlock.clients())
    assert a.acquire(timeout=BOUND)
    assert _holders(redlock, a) == [0, 1, 2]
    # a master that could not be reached is left alone for a moment, not dialled on every try
    masters = a._session().executor.masters
    assert masters[3].down_until > time.monotonic() - 1.0 and masters[0].down_until == 0.0
    assert b.acquire(blocking=False) is False
    time.sleep(LEASE)  # renewals keep going on the three that answer
    assert a.owned()
    a.release()
    assert b.acquire(timeout=BOUND)
    b.release()


def test_three_masters_killed_acquire_raises_after_its_timeout(redlock: Any, redlock_clients: list) -> None:
    for i in (2, 3, 4):
        redlock.kill(i)
    lock = DistLock(_name("three-down"), client=redlock_clients)
    with pytest.raises(QuorumError) as info:
        lock.acquire(blocking=False)
    assert (info.value.answered, info.value.required) == (2, 3)
    started = time.monotonic()
    with pytest.raises(QuorumError):
        lock.acquire(timeout=1.0)
    waited = time.monotonic() - started
    assert 0.9 <= waited < 1.0 + BOUND  # it tried for its timeout, not longer
    # a wait without a timeout gives up too: after one lease
    started = time.monotonic()
    with pytest.raises(QuorumError):
        lock.acquire()
    assert LEASE - 0.1 <= time.monotonic() - started < LEASE + BOUND
    assert not lock.owned()
    assert _holders(redlock, lock) == []  # every try was undone where it granted
    # try_lock likewise: never False for a quorum that could not be reached
    with pytest.raises(QuorumError):
        lock.try_lock(0)


def test_a_master_killed_during_a_hold(redlock: Any, redlock_clients: list) -> None:
    lock = DistRLock(_name("kill-held"), client=redlock_clients)
    assert lock.acquire(timeout=BOUND)
    redlock.kill(0)
    redlock.kill(1)
    time.sleep(LEASE)  # renewals fail on two, succeed on three: the hold stays
    assert lock.owned()
    lock.release()  # three of five answer: enough
    assert _holders(redlock, lock) == []


def test_hold_reported_lost_when_too_few_masters_keep_it(redlock: Any, redlock_clients: list) -> None:
    lock = DistLock(_name("lost"), client=redlock_clients)
    lost = threading.Event()
    lock.on_lost(lambda _: lost.set())
    assert lock.acquire(timeout=BOUND)
    for i in (0, 1, 2):
        redlock.admin(i).delete(_key(lock))  # gone on three: never a quorum again
    assert lost.wait(BOUND)
    with pytest.raises(LockLostError):
        lock.release()


# --- a master that restarts empty -------------------------------------------------------------

def test_restart_empty_hold_keeps_its_quorum(redlock: Any, redlock_clients: list) -> None:
    name = _name("restart")
    a = DistLock(name, client=redlock_clients)
    lost: List[Any] = []
    a.on_lost(lost.append)
    assert a.acquire(timeout=BOUND)
    redlock.restart_empty(0)
    b = DistLock(name, client=redlock.clients())
    assert b.acquire(blocking=False) is False  # 1-4 still a's; 0 sits out (it is new)
    # a's watchdog finds the hold gone on 0 and keeps it on the four others
    assert settle(lambda: 0 not in _part(a).tokens, BOUND)
    assert sorted(_part(a).tokens) == [1, 2, 3, 4]
    assert a.owned() and not lost
    assert not redlock.admin(0).exists(_key(a))  # a renewal never recreates a missing key
    a.release()
    assert b.acquire(timeout=BOUND)
    assert {1, 2, 3, 4} <= set(_holders(redlock, b))
    b.release()


def test_restart_empty_of_an_exact_quorum_is_lost_and_never_overlaps(redlock: Any,
                                                                     redlock_clients: list) -> None:
    """A hold on exactly three masters; one restarts empty: the hold is reported lost, and no
    other client gets a quorum through the restarted master within one lease of its restart."""
    redlock.kill(3)
    redlock.kill(4)
    name = _name("overlap")
    a = DistLock(name, client=redlock_clients)
    lost = threading.Event()
    a.on_lost(lambda _: lost.set())
    assert a.acquire(timeout=BOUND)
    assert _holders(redlock, a) == [0, 1, 2]
    hold = a._current(a._session())
    restarted_at = time.monotonic()
    redlock.restart_empty(0)
    b = DistLock(name, client=redlock.clients())
    got_at = None
    deadline = time.monotonic() + BOUND
    while time.monotonic() < deadline:
        try:
            if b.acquire(blocking=False):
                got_at = time.monotonic()
                break
        except QuorumError as exc:
            assert exc.answered < 3  # 0 sits out, 3 and 4 are down
        time.sleep(0.05)
    assert got_at is not None
    assert got_at - restarted_at >= LEASE  # the restarted master sat out one lease
    assert hold.expires_at <= got_at  # a's validity had ended before b's grant: no overlap
    assert lost.wait(BOUND)  # and a was told
    with pytest.raises(LockLostError):
        a.release()
    b.release()


# --- slow masters and lost replies ------------------------------------------------------------

def _warm(lock_cls: Any, clients: list) -> None:
    """Open a connection to every master (a stopped one could not complete its handshake)."""
    warm = lock_cls(_name("warm"), client=clients)
    assert warm.acquire(timeout=BOUND)
    warm.release()


def test_validity_shrinks_with_a_slow_master(redlock: Any, redlock_clients: list) -> None:
    _warm(DistLock, redlock_clients)
    lock = DistLock(_name("slow"), client=redlock_clients, lease=LEASE)
    redlock.pause(2)
    timer = threading.Timer(0.4, redlock.resume, (2,))
    timer.start()
    started = time.monotonic()
    try:
        assert lock.acquire(timeout=BOUND)
        took = time.monotonic() - started
    finally:
        timer.join(BOUND)
    part = _part(lock)
    d = drift(LEASE, None)
    # the try waited for the slow master (every reply, one deadline), and its grant is worth
    # the lease less what the try took less the drift
    assert len(part.tokens) >= 4  # (the slow one too, unless a loaded machine woke it late)
    assert part.validity <= LEASE - 0.35 - d
    assert part.validity >= LEASE - took - d
    lock.release()


def test_a_lost_reply_is_undone_on_that_master(redlock: Any, redlock_clients: list) -> None:
    """A master stopped past the reply bound: the grant goes ahead on the four others; when the
    master wakes it runs the try, then the undo written behind it on the same connection."""
    _warm(DistLock, redlock_clients)
    lock = DistLock(_name("lost-reply"), client=redlock_clients)
    redlock.pause(0)
    try:
        assert lock.acquire(timeout=BOUND)
        # granted without master 0; a loaded machine may miss one more reply within the bound
        tokens = sorted(_part(lock).tokens)
        assert 0 not in tokens and len(tokens) >= 3, tokens
    finally:
        redlock.resume(0)
    # Redis runs the try it was sent (its fence counter appears), then the undo behind it;
    # Valkey drops what a connection closed meanwhile had sent. Either way: nothing left there.
    settle(lambda: redlock.admin(0).exists(_key(lock) + ":fence"), 2.0)
    assert settle(lambda: not redlock.admin(0).exists(_key(lock)), BOUND)
    assert lock.owned()
    lock.release()
    assert _holders(redlock, lock) == []


def test_a_failed_try_is_undone_everywhere_lost_replies_included(redlock: Any,
                                                                  redlock_clients: list) -> None:
    """Someone else holds a quorum (1-3); our try grants on 4, gets no reply from 0 (stopped):
    it fails, and is undone on 4 and on 0 once 0 runs it. The undo on 4 is sent before the
    try returns; on a loaded machine its reply may come later than REPLY_CAP, so the check
    waits for the hold to go, and reads from the server's count of expired keys that it was
    deleted (the undo), not left to its lease."""
    _warm(DistLock, redlock_clients)
    lock = DistLock(_name("undo"), client=redlock_clients, lease=LEASE)
    expired = int(redlock.admin(4).info("stats")["expired_keys"])
    for i in (1, 2, 3):
        redlock.admin(i).hset(_key(lock), mapping={"someone:else": 1, ":t": 7})
        redlock.admin(i).pexpire(_key(lock), 60_000)
    redlock.pause(0)
    try:
        assert lock.acquire(blocking=False) is False
        assert settle(lambda: not redlock.admin(4).exists(_key(lock)), BOUND)
        assert int(redlock.admin(4).info("stats")["expired_keys"]) == expired, "not undone"
    finally:
        redlock.resume(0)
    settle(lambda: redlock.admin(0).exists(_key(lock) + ":fence"), 2.0)  # as above
    assert settle(lambda: not redlock.admin(0).exists(_key(lock)), BOUND)
    assert _holders(redlock, lock) == [1, 2, 3]
    assert [redlock.admin(i).hget(_key(lock), "someone:else") for i in (1, 2, 3)] == [b"1"] * 3


# --- waiting ----------------------------------------------------------------------------------

def test_a_hint_from_any_master_wakes_the_waiter(redlock: Any, redlock_clients: list) -> None:
    redlock.kill(0)
    lock = DistLock(_name("hint"), client=redlock_clients)
    dispatcher = lock._session().dispatcher
    for i in (1, 2, 3, 4):
        channel, admin = f"hint-test-{i}", redlock.admin(i)
        fan = dispatcher.join(channel, BOUND)
        try:
            assert settle(lambda: admin.pubsub_numsub(channel)[0][1] == 1, BOUND)  # noqa: B023
            threading.Timer(0.1, admin.publish, (channel, "1")).start()
            assert dispatcher.sleep(fan, BOUND * 3, BOUND * 3) is True  # a hint, not the bound
        finally:
            dispatcher.leave(fan, False)


def test_waiter_registers_on_every_master_and_gets_the_lock(redlock: Any, redlock_clients: list) -> None:
    name = _name("wait")
    a = DistLock(name, client=redlock_clients)
    b = DistLock(name, client=redlock.clients())
    assert a.acquire(timeout=BOUND)
    got: List[Any] = []
    waiter = threading.Thread(target=lambda: got.append(b.acquire(timeout=BOUND)))
    waiter.start()
    try:
        queue = f"distlock:{{{name}}}:q"
        assert settle(lambda: all(redlock.admin(i).zcard(queue) == 1 for i in range(5)), BOUND)
        a.release()
    finally:
        waiter.join(BOUND)
    assert got == [True]
    b.release()


# --- configuration ----------------------------------------------------------------------------

def test_configured_drift_shortens_the_hold(redlock: Any, redlock_clients: list) -> None:
    distlock.configure(redlock_drift=0.5)
    lock = DistLock(_name("drift"), client=redlock_clients, lease=LEASE)
    started = time.monotonic()
    assert lock.acquire(timeout=BOUND)
    took = time.monotonic() - started
    hold = lock._current(lock._session())
    assert LEASE - 0.5 - took <= _part(lock).validity <= LEASE - 0.5
    assert hold.expires_at <= started + took + LEASE - 0.5
    lock.release()


# --- a name is one lock (docs/guides/kinds.rst) ---------------------------------------------------

def test_a_name_that_a_majority_of_masters_keeps_as_another_kind_is_refused(
        redlock: Any, redlock_clients: list) -> None:
    """Three of five masters have the name as a semaphore: a Redlock try is refused there, so
    it raises WrongKindError (not QuorumError, not False); the grants it had on the other two
    are undone. On a minority it is only a refusal among the votes: the grant goes ahead."""
    name = _name("kind")
    sems = [distlock.DistSemaphore(name, 1, client=redlock.admin(i)) for i in (0, 1, 2)]
    for sem in sems:
        assert sem.acquire(blocking=False)
    try:
        lock = DistLock(name, client=redlock_clients)
        with pytest.raises(distlock.WrongKindError) as info:
            lock.acquire(blocking=False)
        assert info.value.name == name and info.value.kind == "DistSemaphore"
        assert not lock.owned() and _holders(redlock, lock) == []
        sems.pop().release()  # two of five now
        assert lock.acquire(blocking=False)
        assert _holders(redlock, lock) == [2, 3, 4]
        lock.release()
    finally:
        for sem in sems:
            sem.release()


def test_a_minority_that_refuses_the_name_votes_no_and_does_not_count_as_down(
        redlock: Any, redlock_clients: list) -> None:
    """Two of five masters keep the name as a semaphore and two are down: the one that grants
    is short of a quorum, and the two refusals are answers (no), so the try is refused (False),
    not a QuorumError as if four masters were down."""
    name = _name("kind-minority")
    sems = [distlock.DistSemaphore(name, 1, client=redlock.admin(i)) for i in (0, 1)]
    for sem in sems:
        assert sem.acquire(blocking=False)
    redlock.kill(3)
    redlock.kill(4)
    try:
        lock = DistLock(name, client=redlock_clients)
        assert lock.acquire(blocking=False) is False
        assert not lock.owned() and _holders(redlock, lock) == []
    finally:
        for sem in sems:
            sem.release()
