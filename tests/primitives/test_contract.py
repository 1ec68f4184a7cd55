"""A contract suite keyed by lock type, in the style of CPython's ``Lib/test/lock_tests.py``.

Each contract class names the lock types it holds (``locktypes``); ``pytest_generate_tests``
runs every test of the class once per type. The same tests run against ``threading.Lock`` and
``threading.RLock`` themselves, which proves the suite, and against ``DistLock`` and
``DistRLock``. Wherever the contract is "as threading does" (argument checks, error wording,
return values), a test runs the same call on a real ``threading`` twin and compares.

Timing is asserted only as generous lower bounds (a timed wait did wait) and loose upper bounds
(20 s); every thread a test starts is joined with a bound.
"""

from __future__ import annotations

import contextlib
import functools
import math
import threading
import time
import uuid
import weakref
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

import pytest
import redis
from _aio import SyncView
from _support import (
    ON_REDLOCK,
    THREADING_RLOCK,
    base_type,
    client_for,
    distlock_keys,
    outcome,
    rlock_depth,
    url_for,
)

import distlock.asyncio as aio
from distlock import DistLock, DistRLock, LockLostError, LockNotOwnedError

#: The loosest upper bound on anything that should be quick: only a hang fails it.
BOUND = 20.0

#: the suffix of a fair lock's type id (``DistLock+fair``)
FAIR = "+fair"


# --- lock types -----------------------------------------------------------------------------

@dataclass
class LockType:
    """One lock type of the suite: how to make a lock, and its ``threading`` twin."""

    id: str
    twin: Callable[[], Any]
    reentrant: bool
    dist: bool
    make: Callable[[], Any]
    #: another object of the same lock (the lock itself for threading types)
    same: Callable[[Any], Any]
    client: Any = None

    def __call__(self) -> Any:
        return self.make()


def _unique(prefix: str) -> str:
    return f"contract:{prefix}:{uuid.uuid4().hex[:12]}"


def _locktype(type_id: str, request: pytest.FixtureRequest) -> LockType:
    if type_id == "threading.Lock":
        return LockType(type_id, threading.Lock, False, False, threading.Lock, lambda lock: lock)
    if type_id == "threading.RLock":
        return LockType(type_id, threading.RLock, True, False, threading.RLock, lambda lock: lock)
    if type_id.startswith("aio."):
        return _aio_locktype(type_id, request)
    client = client_for(type_id, request)
    fair = FAIR in type_id  # ``DistLock+fair``: the same contract, fair=True
    cls = {"DistLock": DistLock, "DistRLock": DistRLock}[base_type(type_id).replace(FAIR, "")]
    return LockType(
        type_id,
        threading.Lock if cls is DistLock else threading.RLock,
        cls is DistRLock,
        True,
        lambda: cls(_unique(type_id), client=client, fair=fair),
        lambda lock: cls(lock.name, client=client, fair=fair),
        client,
    )


def _aio_locktype(type_id: str, request: pytest.FixtureRequest) -> LockType:
    """``distlock.asyncio``'s lock, seen through a blocking view (tests/support/_aio.py): each test
    thread is one task, so the contract holds as it does for threads wherever asyncio's
    semantics agree with threading's."""
    runner = request.getfixturevalue("aio")
    aclient: Any
    if type_id.endswith(ON_REDLOCK):  # a list of asyncio clients, one per master
        aclient = [runner.client(u) for u in request.getfixturevalue("redlock").urls]
    else:
        aclient = runner.client(url_for(type_id, request))
    fair = FAIR in type_id
    cls = {"aio.DistLock": aio.DistLock,
           "aio.DistRLock": aio.DistRLock}[base_type(type_id).replace(FAIR, "")]
    return LockType(
        type_id,
        threading.Lock if cls is aio.DistLock else threading.RLock,
        cls is aio.DistRLock,
        True,
        lambda: SyncView(cls(_unique(type_id), client=aclient, fair=fair), runner),
        lambda lock: SyncView(cls(lock.name, client=aclient, fair=fair), runner),
        client_for(type_id, request),  # to look at the keys
    )


def _no_threading_condition(locktype: LockType) -> None:
    if locktype.id.startswith("aio."):
        pytest.skip("threading.Condition needs a blocking lock; asyncio's is "
                    "distlock.asyncio.DistCondition (tests/aio/test_aio_primitives.py)")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "type_id" in metafunc.fixturenames and metafunc.cls is not None:
        metafunc.parametrize("type_id", metafunc.cls.locktypes)


# --- helpers --------------------------------------------------------------------------------

def in_thread(fn: Callable[[], Any], bound: float = BOUND) -> Any:
    """Run ``fn`` in a fresh thread, wait for it (at most ``bound`` s), return or raise its result."""
    box: Dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - handed back to the test
            box["error"] = exc

    thread = threading.Thread(target=run, name="contract-helper", daemon=True)
    thread.start()
    thread.join(bound)
    assert not thread.is_alive(), f"helper thread still running after {bound} s"
    if "error" in box:
        raise box["error"]
    return box.get("value")


@contextlib.contextmanager
def held_by_another_thread(lock: Any) -> Iterator[None]:
    """Hold ``lock`` from a second thread for the duration of the block."""
    taken, done = threading.Event(), threading.Event()
    box: Dict[str, Any] = {}

    def hold() -> None:
        try:
            box["acquired"] = lock.acquire(timeout=BOUND)
            taken.set()
            done.wait(BOUND)
            if box["acquired"]:
                lock.release()
        except BaseException as exc:  # noqa: BLE001
            box["error"] = exc
            taken.set()

    thread = threading.Thread(target=hold, name="contract-holder", daemon=True)
    thread.start()
    try:
        assert taken.wait(BOUND), "the holder thread did not take the lock"
        assert box.get("acquired") is True, box
        yield
    finally:
        done.set()
        thread.join(BOUND)
    assert not thread.is_alive()
    if "error" in box:
        raise box["error"]


def depth(lock: Any) -> int:
    """``lock._recursion_count()``: the calling thread's depth. A DistRLock (or its asyncio view)
    is asked directly, always; threading's own RLock through ``rlock_depth``, which reads what
    this interpreter's RLock offers (before 3.12 it may have no ``_recursion_count``)."""
    if type(lock) is THREADING_RLOCK:
        return rlock_depth(lock)
    return int(lock._recursion_count())


def is_locked(lock: Any) -> bool:
    """Whether anyone holds ``lock``, asked from another thread with a non-blocking acquire
    (threading.RLock has no ``locked()`` before Python 3.14)."""
    def probe() -> bool:
        if lock.acquire(False):
            lock.release()
            return False
        return True
    return bool(in_thread(probe))


# --- the contracts --------------------------------------------------------------------------

class BaseLockContract:
    """What every lock type does: Lock and RLock, threading and distributed."""

    __test__ = False
    locktypes: Tuple[str, ...] = ()

    @pytest.fixture
    def locktype(self, type_id: str, request: pytest.FixtureRequest) -> LockType:
        return _locktype(type_id, request)

    def test_constructor_and_repr(self, locktype: LockType) -> None:
        lock = locktype()
        assert repr(lock).startswith("<unlocked ")
        assert type(getattr(lock, "prim", lock)).__name__ in repr(lock)

    def test_repr_locked(self, locktype: LockType) -> None:
        lock = locktype()
        lock.acquire()
        try:
            assert repr(lock).startswith("<locked ")
            assert type(getattr(lock, "prim", lock)).__name__ in repr(lock)
        finally:
            lock.release()
        assert repr(lock).startswith("<unlocked ")

    def test_acquire_release_return_values(self, locktype: LockType) -> None:
        calls: List[Callable[[Any], Any]] = [
            lambda lock: lock.acquire(),
            lambda lock: lock.acquire(True),
            lambda lock: lock.acquire(False),
            lambda lock: lock.acquire(blocking=False),
            lambda lock: lock.acquire(True, -1),
            lambda lock: lock.acquire(timeout=0),
            lambda lock: lock.acquire(timeout=1.5),
            lambda lock: lock.acquire(timeout=True),
            lambda lock: lock.acquire(timeout=-0.0),
            lambda lock: lock.acquire(False, -1),
            lambda lock: lock.acquire(timeout=threading.TIMEOUT_MAX),
        ]
        lock, twin = locktype(), locktype.twin()
        for call in calls:
            expected = call(twin)
            got = call(lock)
            assert got is expected is True
            assert lock.release() is twin.release() is None
        assert not is_locked(lock)

    def test_acquire_nonblocking_contended(self, locktype: LockType) -> None:
        lock = locktype()
        with held_by_another_thread(lock):
            started = time.monotonic()
            assert lock.acquire(False) is False
            assert lock.acquire(blocking=False) is False
            assert lock.acquire(timeout=0) is False
            assert time.monotonic() - started < BOUND
        assert lock.acquire(False) is True
        lock.release()

    @pytest.mark.parametrize("timeout", [0.3, 0.5])
    def test_acquire_timeout_contended(self, locktype: LockType, timeout: float) -> None:
        lock = locktype()
        with held_by_another_thread(lock):
            started = time.monotonic()
            assert lock.acquire(timeout=timeout) is False
            elapsed = time.monotonic() - started
        assert timeout * 0.9 <= elapsed <= BOUND

    def test_state_after_timeout(self, locktype: LockType) -> None:
        lock = locktype()
        with held_by_another_thread(lock):
            assert lock.acquire(timeout=0.05) is False
        assert not is_locked(lock)
        assert lock.acquire(blocking=False) is True
        lock.release()

    # Every call ``threading`` rejects, with its own exception and wording; those named in
    # BLOCKING_BY_TRUTH only on some versions.
    BAD_ARGS: List[Tuple[str, Tuple[Any, ...], Dict[str, Any]]] = [
        ("timeout-with-nonblocking", (False, 1), {}),
        ("timeout-with-nonblocking-kw", (), {"blocking": False, "timeout": 0.5}),
        ("timeout-zero-with-nonblocking", (False, 0), {}),
        ("negative", (), {"timeout": -2}),
        ("negative-small", (), {"timeout": -0.5}),
        ("negative-inf", (), {"timeout": -math.inf}),
        ("nan", (), {"timeout": math.nan}),
        ("above-max", (), {"timeout": threading.TIMEOUT_MAX + 1}),
        ("far-above-max", (), {"timeout": 1e100}),
        ("inf", (), {"timeout": math.inf}),
        ("timeout-str", (), {"timeout": "1"}),
        ("timeout-none", (), {"timeout": None}),
        ("timeout-complex", (), {"timeout": 1j}),
        ("timeout-list", (), {"timeout": [1]}),
        ("blocking-str", ("x",), {}),
        ("blocking-none", (), {"blocking": None}),
        ("blocking-float", (2.5,), {}),
    ]

    #: a ``blocking`` that is neither a bool nor an int: TypeError before Python 3.12, which
    #: takes it by its truth value (3.9 to 3.11 refuse it, 3.12 and 3.13 take it)
    BLOCKING_BY_TRUTH = ("blocking-str", "blocking-none", "blocking-float")

    @pytest.mark.parametrize("case,args,kwargs", BAD_ARGS, ids=[name for name, _, _ in BAD_ARGS])
    def test_argument_checks_match_threading(self, locktype: LockType, case: str,
                                             args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> None:
        twin = locktype.twin()
        expected = outcome(lambda: twin.acquire(*args, **kwargs))
        if expected[0] == "ok":  # this interpreter's threading takes the call: so must we
            twin.release()
            assert case in self.BLOCKING_BY_TRUTH, \
                f"threading accepted {args} {kwargs}: the case list is wrong"
        lock = locktype()
        assert outcome(lambda: lock.acquire(*args, **kwargs)) == expected
        if expected[0] == "ok":
            assert is_locked(lock)  # taken, as threading took its own
            lock.release()
        assert not is_locked(lock)  # a rejected call takes nothing

    def test_argument_check_categories(self, locktype: LockType) -> None:
        lock = locktype()
        with pytest.raises(ValueError):
            lock.acquire(False, 1)
        with pytest.raises(ValueError):
            lock.acquire(timeout=-5)
        with pytest.raises(ValueError):
            lock.acquire(timeout=math.nan)
        with pytest.raises(OverflowError):
            lock.acquire(timeout=threading.TIMEOUT_MAX * 2)
        with pytest.raises(TypeError):
            lock.acquire(timeout="1")

    def test_release_unheld(self, locktype: LockType) -> None:
        twin = locktype.twin()
        with pytest.raises(RuntimeError) as expected:
            twin.release()
        lock = locktype()
        with pytest.raises(RuntimeError) as got:
            lock.release()
        assert str(got.value) == str(expected.value)
        wording = "cannot release un-acquired lock" if locktype.reentrant else "release unlocked lock"
        assert str(got.value) == wording

    def test_release_twice(self, locktype: LockType) -> None:
        lock = locktype()
        lock.acquire()
        lock.release()
        with pytest.raises(RuntimeError):
            lock.release()
        assert lock.acquire(False) is True
        lock.release()

    def test_with(self, locktype: LockType) -> None:
        lock, twin = locktype(), locktype.twin()
        with twin as expected:
            pass
        with lock as got:
            assert is_locked(lock)
        if locktype.id.startswith("aio."):
            expected = None  # asyncio.Lock's __aenter__ returns None
        assert got == expected
        assert not is_locked(lock)

        class Boom(Exception):
            pass

        with pytest.raises(Boom):
            with lock:
                raise Boom
        assert not is_locked(lock)

    def test_contended_acquire_waits_for_release(self, locktype: LockType) -> None:
        lock = locktype()
        n = 3
        started = threading.Barrier(n + 1, timeout=BOUND)
        finished: List[int] = []
        errors: List[BaseException] = []

        def worker(i: int) -> None:
            try:
                started.wait()
                assert lock.acquire(timeout=BOUND)
                finished.append(i)
                lock.release()
            except BaseException as exc:  # noqa: BLE001
                errors.append(exc)

        lock.acquire()
        threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(n)]
        try:
            for t in threads:
                t.start()
            started.wait()
            time.sleep(0.1)
            assert finished == []  # nobody got past a held lock
        finally:
            lock.release()
            for t in threads:
                t.join(BOUND)
        assert not any(t.is_alive() for t in threads)
        assert errors == []
        assert sorted(finished) == list(range(n))

    def test_mutual_exclusion_counter(self, locktype: LockType) -> None:
        lock = locktype()
        box = {"n": 0}
        per_thread, n_threads = 15, 3

        def worker() -> None:
            for _ in range(per_thread):
                with lock:
                    value = box["n"]
                    time.sleep(0)  # invite a switch between read and write
                    box["n"] = value + 1

        threads = [threading.Thread(target=worker, daemon=True) for _ in range(n_threads)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(BOUND * 3)
        assert not any(t.is_alive() for t in threads)
        assert box["n"] == per_thread * n_threads

    def test_weakref(self, locktype: LockType) -> None:
        lock = locktype()
        ref = weakref.ref(lock)
        assert ref() is lock

    def test_locked(self, locktype: LockType) -> None:
        lock = locktype()
        if not hasattr(lock, "locked"):
            # threading.RLock before Python 3.13 has no locked(); what it exposes is ownership
            assert lock._is_owned() is False
            with lock:
                assert lock._is_owned() is True
                assert in_thread(lock._is_owned) is False
            assert lock._is_owned() is False
            return
        assert lock.locked() is False
        lock.acquire()
        try:
            assert lock.locked() is True
            assert in_thread(lock.locked) is True  # held by anyone, seen from anywhere
        finally:
            lock.release()
        assert lock.locked() is False
        with held_by_another_thread(lock):
            assert lock.locked() is True
        assert lock.locked() is False

    def test_condition_wait_notify(self, locktype: LockType) -> None:
        _no_threading_condition(locktype)
        lock = locktype()
        cond = threading.Condition(lock)
        waiting = threading.Event()
        box: Dict[str, Any] = {}

        def waiter() -> None:
            try:
                with cond:
                    waiting.set()  # still holding: the notifier can enter only once we wait
                    box["woken"] = cond.wait(BOUND)
                    box["owned_after"] = cond._is_owned()
            except BaseException as exc:  # noqa: BLE001
                box["error"] = exc
                waiting.set()

        thread = threading.Thread(target=waiter, name="contract-waiter", daemon=True)
        thread.start()
        try:
            assert waiting.wait(BOUND)
            with cond:
                cond.notify()
        finally:
            thread.join(BOUND)
        assert not thread.is_alive()
        assert "error" not in box, box
        assert box == {"woken": True, "owned_after": True}
        assert not is_locked(lock)

    def test_condition_wait_timeout(self, locktype: LockType) -> None:
        _no_threading_condition(locktype)
        lock = locktype()
        cond = threading.Condition(lock)
        with cond:
            started = time.monotonic()
            assert cond.wait(0.3) is False
            assert 0.25 <= time.monotonic() - started <= BOUND
            assert cond._is_owned()
        assert not is_locked(lock)

    def test_condition_requires_lock(self, locktype: LockType) -> None:
        _no_threading_condition(locktype)
        cond = threading.Condition(locktype())
        with pytest.raises(RuntimeError):
            cond.notify()
        with pytest.raises(RuntimeError):
            cond.wait(0.01)


class LockContract(BaseLockContract):
    """``threading.Lock`` semantics: not reentrant, released by any thread."""

    __test__ = True
    locktypes = ("threading.Lock", "DistLock", "aio.DistLock", "DistLock@cluster", "aio.DistLock@cluster",
                 "DistLock@sentinel", "aio.DistLock@sentinel", "DistLock@redlock", "aio.DistLock@redlock",
                 "DistLock+fair", "aio.DistLock+fair", "DistLock+fair@sentinel")

    def test_second_acquire_from_same_thread_blocks(self, locktype: LockType) -> None:
        lock = locktype()
        lock.acquire()
        try:
            assert lock.acquire(False) is False
            started = time.monotonic()
            assert lock.acquire(timeout=0.2) is False
            assert time.monotonic() - started >= 0.15
        finally:
            lock.release()
        assert not is_locked(lock)

    def test_release_from_another_thread(self, locktype: LockType) -> None:
        lock = locktype()
        lock.acquire()
        assert in_thread(lock.release) is None
        assert not is_locked(lock)
        assert lock.acquire(False) is True
        lock.release()

    def test_blocked_acquire_returns_when_other_thread_releases(self, locktype: LockType) -> None:
        lock = locktype()
        lock.acquire()
        releaser = threading.Timer(0.2, lock.release)
        releaser.start()
        try:
            assert lock.acquire(timeout=BOUND) is True  # the same thread, woken by the release
        finally:
            releaser.join(BOUND)
        lock.release()
        assert not is_locked(lock)

    def test_no_reentrancy_protocol(self, locktype: LockType) -> None:
        lock = locktype()
        twin = locktype.twin()
        for attr in ("_release_save", "_acquire_restore", "_is_owned"):
            assert hasattr(lock, attr) == hasattr(twin, attr)


class RLockContract(BaseLockContract):
    """``threading.RLock`` semantics: reentrant, owned by one thread."""

    __test__ = True
    locktypes = ("threading.RLock", "DistRLock", "aio.DistRLock", "DistRLock@cluster",
                 "aio.DistRLock@cluster", "DistRLock@sentinel", "aio.DistRLock@sentinel", "DistRLock@redlock",
                 "aio.DistRLock@redlock", "DistRLock+fair", "aio.DistRLock+fair", "DistRLock+fair@cluster")

    def test_reentrancy(self, locktype: LockType) -> None:
        lock = locktype()
        assert lock.acquire() is True
        assert lock.acquire(False) is True
        assert lock.acquire(timeout=0.1) is True
        assert depth(lock) == 3
        lock.release()
        lock.release()
        assert depth(lock) == 1
        assert is_locked(lock)
        lock.release()
        assert depth(lock) == 0
        assert not is_locked(lock)
        with pytest.raises(RuntimeError, match="^cannot release un-acquired lock$"):
            lock.release()

    def test_is_owned(self, locktype: LockType) -> None:
        lock = locktype()
        assert lock._is_owned() is False
        lock.acquire()
        assert lock._is_owned() is True
        lock.acquire()
        assert in_thread(lock._is_owned) is False
        lock.release()
        assert lock._is_owned() is True
        lock.release()
        assert lock._is_owned() is False

    def test_recursion_count(self, locktype: LockType) -> None:
        lock = locktype()
        assert depth(lock) == 0
        for n in range(1, 4):
            lock.acquire()
            assert depth(lock) == n
        assert in_thread(lambda: depth(lock)) == 0
        for n in range(2, -1, -1):
            lock.release()
            assert depth(lock) == n

    def test_release_save_acquire_restore(self, locktype: LockType) -> None:
        _no_threading_condition(locktype)
        lock, twin = locktype(), locktype.twin()
        for lk in (twin, lock):
            lk.acquire()
            lk.acquire()
        twin_state = twin._release_save()
        state = lock._release_save()
        assert type(state) is type(twin_state)
        assert state[0] == twin_state[0] == 2
        assert lock._is_owned() is False
        assert depth(lock) == 0
        assert not is_locked(lock)  # another thread can take it now
        twin._acquire_restore(twin_state)
        lock._acquire_restore(state)
        assert lock._is_owned() is True
        assert depth(lock) == rlock_depth(twin) == 2
        for lk in (twin, lock):
            lk.release()
            lk.release()
        assert not is_locked(lock)

    def test_release_save_unacquired(self, locktype: LockType) -> None:
        _no_threading_condition(locktype)
        twin = locktype.twin()
        with pytest.raises(RuntimeError) as expected:
            twin._release_save()
        lock = locktype()
        with pytest.raises(RuntimeError) as got:
            lock._release_save()
        assert str(got.value) == str(expected.value)
        lock.acquire()
        lock.release()
        with pytest.raises(RuntimeError):
            lock._release_save()

    def test_release_from_another_thread_raises(self, locktype: LockType) -> None:
        twin = locktype.twin()
        twin.acquire()
        with pytest.raises(RuntimeError) as expected:
            in_thread(twin.release)
        twin.release()
        lock = locktype()
        lock.acquire()
        try:
            with pytest.raises(RuntimeError) as got:
                in_thread(lock.release)
            assert str(got.value) == str(expected.value)
            assert depth(lock) == 1  # still ours
            assert is_locked(lock)
        finally:
            lock.release()
        assert not is_locked(lock)

    def test_condition_wait_restores_depth(self, locktype: LockType) -> None:
        _no_threading_condition(locktype)
        lock = locktype()
        cond = threading.Condition(lock)
        waiting = threading.Event()
        box: Dict[str, Any] = {}

        def waiter() -> None:
            try:
                with cond:
                    with cond:
                        waiting.set()
                        box["woken"] = cond.wait(BOUND)
                        box["depth"] = depth(lock)
            except BaseException as exc:  # noqa: BLE001
                box["error"] = exc
                waiting.set()

        thread = threading.Thread(target=waiter, name="contract-waiter", daemon=True)
        thread.start()
        try:
            assert waiting.wait(BOUND)
            with cond:  # only possible because wait() released both levels
                assert depth(lock) == 1
                cond.notify_all()
        finally:
            thread.join(BOUND)
        assert not thread.is_alive()
        assert box == {"woken": True, "depth": 2}
        assert not is_locked(lock)

    def test_condition_producer_consumer(self, locktype: LockType) -> None:
        _no_threading_condition(locktype)
        cond = threading.Condition(locktype())
        items: List[int] = []
        got: List[int] = []

        def consumer() -> None:
            for _ in range(3):
                with cond:
                    assert cond.wait_for(lambda: items, BOUND)
                    got.append(items.pop(0))

        thread = threading.Thread(target=consumer, name="contract-consumer", daemon=True)
        thread.start()
        try:
            for i in range(3):
                with cond:
                    items.append(i)
                    cond.notify()
        finally:
            thread.join(BOUND)
        assert not thread.is_alive()
        assert got == [0, 1, 2]


# --- what only the distributed locks have ----------------------------------------------------

class DistLockContract:
    """Extras of DistLock and DistRLock: tokens, ownership, leases, argument checks, keys."""

    __test__ = True
    locktypes = ("DistLock", "DistRLock", "aio.DistLock", "aio.DistRLock",
                 "DistLock@cluster", "DistRLock@cluster", "aio.DistLock@cluster", "aio.DistRLock@cluster",
                 "DistLock@sentinel", "DistRLock@sentinel", "aio.DistLock@sentinel", "aio.DistRLock@sentinel",
                 "DistLock+fair", "DistRLock+fair", "aio.DistLock+fair", "aio.DistRLock+fair")

    @pytest.fixture
    def locktype(self, type_id: str, request: pytest.FixtureRequest) -> LockType:
        return _locktype(type_id, request)

    @pytest.fixture
    def cls(self, type_id: str, request: pytest.FixtureRequest) -> Any:
        fair = FAIR in type_id
        base = base_type(type_id).replace(FAIR, "")
        if not type_id.startswith("aio."):
            plain = {"DistLock": DistLock, "DistRLock": DistRLock}[base]
            return functools.partial(plain, fair=True) if fair else plain
        runner = request.getfixturevalue("aio")
        aclient = runner.client(url_for(type_id, request))
        real = {"aio.DistLock": aio.DistLock, "aio.DistRLock": aio.DistRLock}[base]

        def make(name: Any, *args: Any, client: Any = None, **kwargs: Any) -> Any:
            # the tests pass the blocking client of the test server: use its asyncio twin
            if isinstance(client, (redis.Redis, redis.RedisCluster)):
                client = aclient
            if fair:
                kwargs.setdefault("fair", True)
            return SyncView(real(name, *args, client=client, **kwargs), runner)
        return make

    def test_token(self, locktype: LockType) -> None:
        lock = locktype()
        assert lock.token is None
        tokens = []
        for _ in range(3):
            lock.acquire()
            token = lock.token
            assert isinstance(token, int) and not isinstance(token, bool)
            tokens.append(token)
            lock.release()
            assert lock.token is None
        other = locktype.same(lock)
        other.acquire()
        tokens.append(other.token)
        other.release()
        assert tokens == sorted(set(tokens)), tokens  # strictly increasing across grants

    def test_token_of_other_owner_is_none(self, locktype: LockType) -> None:
        lock = locktype()
        with held_by_another_thread(locktype.same(lock)):
            assert lock.token is None
            assert lock.owned() is False

    def test_owned(self, locktype: LockType) -> None:
        lock = locktype()
        assert lock.owned() is False
        lock.acquire()
        try:
            assert lock.owned() is True
            # DistLock: the hold is the object's; DistRLock: the thread's.
            assert in_thread(lock.owned) is (not locktype.reentrant)
        finally:
            lock.release()
        assert lock.owned() is False

    def test_release_error_types(self, locktype: LockType) -> None:
        with pytest.raises(LockNotOwnedError):
            locktype().release()
        assert issubclass(LockNotOwnedError, RuntimeError)
        assert issubclass(LockLostError, LockNotOwnedError)

    def test_only_fence_key_after_release(self, locktype: LockType) -> None:
        lock = locktype()
        lock.acquire()
        if locktype.reentrant:
            lock.acquire()
            lock.release()
        lock.release()
        keys = distlock_keys(locktype.client)
        assert keys == [f"distlock:{{{lock.name}}}:fence"]

    def test_only_fence_key_after_timed_out_wait(self, locktype: LockType) -> None:
        lock = locktype()
        with held_by_another_thread(locktype.same(lock)):
            assert lock.acquire(timeout=0.1) is False
        keys = distlock_keys(locktype.client)
        assert keys == [f"distlock:{{{lock.name}}}:fence"]

    def test_repr_names_the_lock(self, locktype: LockType) -> None:
        lock = locktype()
        assert repr(lock.name) in repr(lock)
        assert repr(lock).startswith("<unlocked distlock.")

    def test_try_lock_free(self, locktype: LockType) -> None:
        lock = locktype()
        assert lock.try_lock() is True
        lock.release()
        assert lock.try_lock(timeout=0) is True
        lock.release()
        assert lock.try_lock(timeout=0.3) is True
        lock.release()
        assert lock.try_lock(timeout=None) is True
        lock.release()
        assert lock.try_lock(0.5, lease=5) is True
        lock.release()
        assert not lock.locked()

    def test_try_lock_contended(self, locktype: LockType) -> None:
        lock = locktype()
        with held_by_another_thread(locktype.same(lock)):
            started = time.monotonic()
            assert lock.try_lock(timeout=0) is False
            assert time.monotonic() - started < BOUND
            started = time.monotonic()
            assert lock.try_lock(timeout=0.3) is False
            assert 0.27 <= time.monotonic() - started <= BOUND
            assert lock.owned() is False
        assert lock.try_lock(timeout=0) is True
        lock.release()

    @pytest.mark.parametrize("kwargs,error", [
        ({"timeout": -1}, ValueError),
        ({"timeout": -0.5}, ValueError),
        ({"timeout": math.nan}, ValueError),
        ({"timeout": threading.TIMEOUT_MAX * 2}, OverflowError),
        ({"timeout": "1"}, TypeError),
        ({"timeout": True}, TypeError),
        ({"timeout": [0]}, TypeError),
        ({"lease": 0}, ValueError),
        ({"lease": -1}, ValueError),
        ({"lease": math.nan}, ValueError),
        ({"lease": math.inf}, ValueError),
        ({"lease": "1"}, TypeError),
        ({"lease": True}, TypeError),
    ])
    def test_try_lock_argument_checks(self, locktype: LockType, kwargs: Dict[str, Any],
                                      error: type) -> None:
        lock = locktype()
        with pytest.raises(error):
            lock.try_lock(**kwargs)
        assert lock.owned() is False
        assert not lock.locked()

    @pytest.mark.parametrize("lease,error", [
        (0, ValueError),
        (0.0, ValueError),
        (-1, ValueError),
        (-0.5, ValueError),
        (math.nan, ValueError),
        (math.inf, ValueError),
        (-math.inf, ValueError),
        ("1", TypeError),
        (True, TypeError),
        (b"1", TypeError),
    ])
    def test_lease_validation(self, cls: Any, client: Any, lease: Any, error: type) -> None:
        with pytest.raises(error):
            cls(_unique("lease"), client=client, lease=lease)

    def test_lease_accepts_numbers(self, cls: Any, client: Any) -> None:
        for lease in (None, 1, 0.5, 30.0):
            assert cls(_unique("lease"), client=client, lease=lease).name

    @pytest.mark.parametrize("name,error", [
        (1, TypeError),
        (None, TypeError),
        (b"orders", TypeError),
        (["orders"], TypeError),
        ("", ValueError),
    ])
    def test_name_validation(self, cls: Any, client: Any, name: Any, error: type) -> None:
        with pytest.raises(error):
            cls(name, client=client)

    @pytest.mark.parametrize("bad", [object(), 42, b"redis://127.0.0.1:1/0"])
    def test_client_validation(self, cls: Any, bad: Any) -> None:
        with pytest.raises(TypeError):
            cls(_unique("client"), client=bad)

    def test_constructor_is_keyword_only(self, cls: Any, client: Any) -> None:
        with pytest.raises(TypeError):
            cls(_unique("kw"), client, None)

    def test_explicit_lease_expires(self, locktype: LockType, cls: Any) -> None:
        client = locktype.client
        name = _unique("lease")
        # 2 s, not less: the token is read right after the grant, and a grant whose reply took
        # longer than a shorter lease (a Sentinel client near the end of a loaded CI run, an
        # asyncio lock on the cluster on 3.10 with six suites at once) is rightly no longer
        # believed by then (docs/safety.rst, "Belief keeps time")
        lock = cls(name, client=client, lease=2.0)
        lost: List[Any] = []
        lock.on_lost(lost.append)
        started = time.monotonic()
        assert lock.acquire() is True
        first_token = lock.token

        def take_over() -> Tuple[bool, float, Optional[int]]:
            other = cls(name, client=client)
            got = other.acquire(timeout=BOUND)
            at = time.monotonic() - started
            token = other.token
            if got:
                other.release()
            return got, at, token

        got, at, token = in_thread(take_over)
        assert got is True
        assert 1.9 <= at <= BOUND  # not before the lease ran out; well within the bound
        assert token is not None and first_token is not None and token > first_token
        with pytest.raises(LockLostError):
            lock.release()
        if locktype.id.startswith("aio."):  # on_lost runs in the lock's loop, soon after
            for _ in range(500):
                if lost:
                    break
                time.sleep(0.01)
        assert lost == [getattr(lock, "prim", lock)]
        assert lock.owned() is False
        assert lock.token is None
        assert lock.acquire(False) is True  # the object is usable again
        lock.release()

    def test_explicit_lease_release_after_takeover_leaves_new_hold(self, locktype: LockType,
                                                                   cls: Any) -> None:
        client = locktype.client
        name = _unique("lease")
        lock = cls(name, client=client, lease=0.5)
        lock.acquire()
        with held_by_another_thread(cls(name, client=client)):
            with pytest.raises(LockLostError):
                lock.release()
            assert lock.locked() is True  # the new holder still holds
        assert lock.locked() is False

    def test_on_lost_rejects_non_callable(self, locktype: LockType) -> None:
        with pytest.raises(TypeError):
            locktype().on_lost(42)


class DistRLockContract:
    """DistRLock: the owner is session + thread, shared by every object of the name."""

    __test__ = True

    @pytest.fixture
    def pair(self, client: Any) -> Tuple[DistRLock, DistRLock]:
        name = _unique("DistRLock")
        return DistRLock(name, client=client), DistRLock(name, client=client)

    def test_two_objects_one_owner(self, pair: Tuple[DistRLock, DistRLock]) -> None:
        a, b = pair
        assert a.acquire() is True
        assert b.acquire(False) is True  # re-entry through the other object, not contention
        assert a._recursion_count() == b._recursion_count() == 2
        assert a.token == b.token is not None
        assert a._is_owned() and b._is_owned()
        assert in_thread(lambda: b.acquire(False)) is False  # another thread is another owner
        b.release()
        assert a._recursion_count() == 1
        assert a.locked()
        a.acquire()
        a.release()
        b.release()
        assert a._recursion_count() == b._recursion_count() == 0
        assert not a.locked()
        with pytest.raises(RuntimeError):
            a.release()
        with pytest.raises(RuntimeError):
            b.release()

    def test_release_save_through_other_object(self, pair: Tuple[DistRLock, DistRLock]) -> None:
        a, b = pair
        a.acquire()
        b.acquire()
        state = b._release_save()
        assert state[0] == 2
        assert a._recursion_count() == 0 and not a.locked()
        a._acquire_restore(state)
        assert b._recursion_count() == 2
        a.release()
        b.release()
        assert not a.locked()

    def test_token_unchanged_on_reentry(self, pair: Tuple[DistRLock, DistRLock]) -> None:
        a, b = pair
        a.acquire()
        token = a.token
        a.acquire()
        b.acquire()
        assert a.token == b.token == token
        b.release()
        a.release()
        assert a.token == token
        a.release()
        assert a.token is None
        a.acquire()
        assert a.token is not None and token is not None and a.token > token
        a.release()

    def test_acquire_restore_is_a_new_grant(self, pair: Tuple[DistRLock, DistRLock]) -> None:
        a, _ = pair
        a.acquire()
        token = a.token
        state = a._release_save()
        assert a.token is None
        a._acquire_restore(state)
        assert a.token is not None and token is not None and a.token > token
        a.release()
