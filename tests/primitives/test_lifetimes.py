"""Lifetimes (docs/design.rst, principle 11): nothing leaks, nothing dies silently.

- No exception of any kind stops the watchdog; a hold it could not renew is reported lost.
- Clients made per request leave no thread and no connection behind.
- The pub/sub dispatcher and the watchdog exit when idle and come back on demand, so a harness
  that counts threads, as CPython's own lock tests do, sees them end.
- At interpreter exit, holds still held are given back.
"""

from __future__ import annotations

import _thread
import subprocess
import sys
import textwrap
import threading
import time
import traceback
import unittest
from typing import Any, Callable, List

import pytest
import redis
from _support import collect_garbage, renewals_seen, settle, until

import distlock
from distlock import (
    DistBarrier,
    DistBoundedSemaphore,
    DistCondition,
    DistEvent,
    DistLock,
    DistRLock,
    DistSemaphore,
    LockLostError,
)

LOCK_TYPES = [DistLock, DistRLock]


def _helper_threads() -> List[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("distlock-") and t.is_alive()]


def _connections(admin: redis.Redis) -> int:
    """Connections the server has open, the admin's own included."""
    return len(admin.client_list())


# --- finding 1: a non-Redis exception in a renewal ---------------------------------------------

@pytest.mark.real_redis
@pytest.mark.parametrize("cls", LOCK_TYPES)
def test_watchdog_survives_a_non_redis_error_and_reports_the_loss(
        url: str, client: Any, cls: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """redis-py's cluster pipeline refuses EVALSHA with RedisClusterException, which is not a
    RedisError. Injected into every renewal, it must not stop the watchdog: once the lease has
    passed unrenewed, the hold is reported lost (on_lost runs, owned() turns False, release()
    raises LockLostError), and the same watchdog goes on renewing other holds afterwards."""
    distlock.configure(lease=1.0, renew_interval=0.2)
    lock = cls("wd-inject", client=client)
    lost = threading.Event()
    lock.on_lost(lambda _lock: lost.set())
    real_execute = redis.client.Pipeline.execute

    def refuse(self: Any, raise_on_error: bool = True) -> Any:
        raise redis.exceptions.RedisClusterException("EVALSHA is not supported in cluster pipelines")

    monkeypatch.setattr(redis.client.Pipeline, "execute", refuse)
    assert lock.acquire()
    assert lost.wait(20), "the lost lease was never reported"
    assert not lock.owned()
    assert lock.token is None
    with pytest.raises(LockLostError):
        lock.release()

    monkeypatch.setattr(redis.client.Pipeline, "execute", real_execute)
    distlock.configure(lease=3.0, renew_interval=0.2)  # a late renewal is not a missing one
    other = cls("wd-after", client=client)
    with other:
        renewals_seen(lambda: client.pttl("distlock:{wd-after}"), 3)
        assert other.owned()
        assert client.exists("distlock:{wd-after}")


@pytest.mark.real_redis
def test_watchdog_survives_an_error_in_one_renew_call(url: str, client: Any) -> None:
    """A primitive whose renewal raises while it is being queued (a bug, say) loses its own
    hold, reported; the session's other holds go on being renewed."""
    # renewals every 0.2 s of a 3 s lease: one may come 2.8 s late (a loaded machine) and the
    # good hold still lives
    distlock.configure(lease=3.0, renew_interval=0.2)
    good = DistRLock("wd-good", client=client)
    bad = DistRLock("wd-bad", client=client)
    lost: List[Any] = []
    bad.on_lost(lost.append)
    good.acquire()
    bad.acquire()
    hold = bad._session().holds[(bad._keys.lock, bad._owner_for(bad._session()))]

    def broken(pipe: Any, hold: Any, ms: int) -> None:
        raise ZeroDivisionError("a bug in one primitive's renewal")

    hold.renew = broken
    until(lambda: lost == [bad])
    renewals_seen(lambda: client.pttl("distlock:{wd-good}"), 3)  # after the bad one was lost
    assert good.owned() and client.exists("distlock:{wd-good}")
    good.release()
    with pytest.raises(LockLostError):
        bad.release()


# --- finding 2: a client per request -----------------------------------------------------------

@pytest.mark.real_redis
def test_per_request_clients_leave_no_thread_and_no_connection(url: str, client: Any) -> None:
    """1,000 requests, each with its own redis.Redis and its own lock (some contended, so that
    waiting starts the pub/sub side too): 10 s after the last one, no extra thread and no extra
    server connection is left."""
    before_threads = set(_helper_threads())
    before_conns = _connections(client)
    blocker = redis.Redis.from_url(url)
    held = DistLock("req:busy", client=blocker)
    held.acquire()
    for i in range(1000):
        per_request = redis.Redis.from_url(url)
        if i % 100 == 0:
            assert not DistLock("req:busy", client=per_request).acquire(timeout=0.05)
        lock = DistRLock(f"req:{i % 50}", client=per_request)
        with lock:
            assert lock.owned()
        del lock, per_request
    held.release()
    del held, blocker
    collect_garbage()

    def clean() -> bool:
        return set(_helper_threads()) <= before_threads and _connections(client) <= before_conns

    assert settle(clean, 10.0), (
        f"left behind: threads {set(_helper_threads()) - before_threads}, "
        f"connections {_connections(client)} (before: {before_conns})")


@pytest.mark.real_redis
def test_clients_of_one_server_share_one_session(url: str, client: Any) -> None:
    """Concurrent per-request clients of the same server and user share one session: one
    watchdog for all their holds, and a thread re-enters its DistRLock through any of them."""
    a, b = redis.Redis.from_url(url), redis.Redis.from_url(url)
    first, second = DistRLock("shared", client=a), DistRLock("shared", client=b)
    with first:
        assert second.acquire(blocking=False)  # the same thread, the same lock
        second.release()
        assert first._session() is second._session()
    other_db = redis.Redis.from_url(url.rsplit("/", 1)[0] + "/1")
    assert DistRLock("shared", client=other_db)._session() is not first._session()


# --- finding 4: helper threads exit when idle --------------------------------------------------

@pytest.mark.real_redis
def test_helper_threads_exit_when_idle_and_come_back(url: str, client: Any) -> None:
    """The dispatcher and the watchdog exit a few seconds after their last waiter and hold,
    without any reset, and start again on demand."""
    before = set(_helper_threads())
    distlock.configure(lease=3.0, renew_interval=0.2)
    holder = DistLock("idle", client=client)
    for _round in range(2):
        holder.acquire()
        waiter = DistLock("idle", client=client)
        assert not waiter.acquire(timeout=0.2)  # subscribes: the dispatcher runs
        assert any(t.name.startswith("distlock-pubsub") for t in _helper_threads())
        assert any(t.name.startswith("distlock-watchdog") for t in _helper_threads())
        renewals_seen(lambda: client.pttl("distlock:{idle}"))  # renewed, not lost
        assert holder.owned()
        holder.release()
        assert settle(lambda: set(_helper_threads()) <= before, 10.0), _helper_threads()


#: CPython's tests that cannot hold for a distributed lock, and why.
_CPYTHON_SKIPS = {
    # a private CPython hook (distlock's after-fork handling is its own, tested elsewhere)
    "test_at_fork_reinit",
    # the lock stays held when the test ends: a watchdog hold keeps its renewing thread
    "test_reacquire",
}
_CPYTHON_RLOCK_SKIPS = {
    # a thread ends while it holds: as with threading.RLock, the hold stays (until the process
    # exits), and with it the watchdog thread that renews it, which the test's own
    # wait_threads_exit() waits 30 s for
    "test_different_thread",
}
#: RLockTests that pass but end with the lock still held by the main thread (``del`` of a held
#: DistRLock object, or an acquire the test never releases): as with threading.RLock the hold
#: stays, reachable by its name through any other DistRLock object, and so does the watchdog
#: thread that renews it. They run last, their threads not counted: counted, each would
#: alter the environment, and its hold would hide the watchdog from every later test's count.
_CPYTHON_RLOCK_HELD = {"test_acquire_destroy", "test_locked_repr", "test_timeout"}


def _cpython_suite(base: Any, factory: Callable[..., Any], skips: Any, attr: str = "locktype",
                   held: Any = frozenset()) -> unittest.TestSuite:
    """CPython's own Lib/test/lock_tests.py class ``base`` against ``factory`` (set as the
    class' ``attr``: ``locktype``, ``semtype``, ``eventtype``, ``condtype`` or ``barriertype``):
    its setUp and tearDown count threads (threading_helper.threading_setup/cleanup, which gives
    a test's threads 1 s to end and flags the environment as altered otherwise). BarrierTests
    overrides them without counting, so its threads are counted here around its own.

    The tests named in ``held`` end with a hold the watchdog keeps renewing: they run last,
    and must pass, but their threads are not counted."""
    threading_helper = _threading_helper()

    class Suite(base):  # type: ignore[misc,valid-type]
        def setUp(self) -> None:
            counted = threading_helper.threading_setup()
            base.setUp(self)
            if not hasattr(self, "_threads"):  # the base does not count: count here
                self._distlock_threads = counted

        def tearDown(self) -> None:
            if self._testMethodName in held:  # count from now: nothing to wait for
                self._threads = self._distlock_threads = threading_helper.threading_setup()
            base.tearDown(self)
            if hasattr(self, "_distlock_threads"):
                threading_helper.threading_cleanup(*self._distlock_threads)

    if sys.version_info < (3, 11) and hasattr(base, "test_thread_leak"):
        bunch = sys.modules[base.__module__].Bunch

        def test_thread_leak(self: Any) -> None:
            """Python 3.11's form of this test. 3.9's and 3.10's also count the threads 0.4 s
            after its 15 threads end, which a watchdog that exits 0.2 s after its last hold
            misses on a loaded machine; 3.11 leaves that count to tearDown
            (threading_cleanup, graced here as 3.11 has it: see _graced_cleanup)."""
            lock = self.locktype()
            failed: List[BaseException] = []  # 3.9's and 3.10's Bunch only prints them

            def f() -> None:
                try:
                    lock.acquire()
                    lock.release()
                except BaseException as exc:  # noqa: BLE001 - reported below
                    failed.append(exc)

            bunch(f, 15).wait_for_finished()
            self.assertEqual(failed, [])

        Suite.test_thread_leak = test_thread_leak  # type: ignore[attr-defined]
    setattr(Suite, attr, staticmethod(factory))
    names = sorted(n for n in dir(base) if n.startswith("test_") and n not in skips)
    names.sort(key=lambda n: n in held)  # stable: the held ones last, each group sorted
    return unittest.TestSuite(Suite(name) for name in names)


def _graced_cleanup(orig_count: int, *_rest: Any) -> None:
    """``threading_helper.threading_cleanup`` as Python 3.11 and later have it: the environment
    is altered when the thread count is still above the one before after 1 s. Python 3.9's
    and 3.10's flag it at the first look, when the count or the very set of live thread
    objects differs, with no time for a thread to end: a pub/sub reader that ends a moment
    after the wait it served failed every test there."""
    from test import support

    deadline = time.monotonic() + 1.0
    while _thread._count() > orig_count:
        if time.monotonic() > deadline:
            support.environment_altered = True
            support.print_warning(f"threading_cleanup() failed to clean up threads in 1.0 s: "
                                  f"{_thread._count()} running, {orig_count} before")
            return
        time.sleep(0.01)


def _threading_helper() -> Any:
    """The module whose threading_setup and threading_cleanup lock_tests calls: 3.10 moved
    them from test.support to test.support.threading_helper."""
    try:
        from test.support import threading_helper
    except ImportError:  # Python 3.9
        from test import support
        return support
    return threading_helper


def _graced_setup() -> Any:
    return _thread._count(), len(threading._dangling)  # type: ignore[attr-defined]


def _alive() -> Any:
    """What is running now, for a failure's message: the threads, and each session's holds
    (a thread that outlives a test is most often a watchdog kept by a hold)."""
    from distlock._session.session import all_sessions

    return ([t.name for t in threading.enumerate()],
            [(s.id, list(s.holds)) for s in all_sessions()])


def _why_failed(result: unittest.TestResult) -> str:
    """A failed CPython test's tracebacks in full (a tuple of them was cut short in the
    assertion's message), then what runs now, with the stack of each thread but this one."""
    parts = [f"{test.id()}:\n{text}" for test, text in result.failures + result.errors]
    frames = sys._current_frames()
    for thread in threading.enumerate():
        if thread is not threading.current_thread() and thread.ident in frames:
            stack = "".join(traceback.format_stack(frames[thread.ident])[-6:])
            parts.append(f"thread {thread.name}:\n{stack}")
    parts.append(f"alive: {_alive()}")
    return "\n".join(parts)


def _run_cpython_suite(suite: unittest.TestSuite, at_least: int) -> None:
    """Run ``suite``: every test must pass, and its threads must end (see _cpython_suite)."""
    from test import support

    altered = []
    with pytest.MonkeyPatch.context() as patch:
        if sys.version_info < (3, 11):
            helper = _threading_helper()  # where lock_tests finds them
            patch.setattr(helper, "threading_setup", _graced_setup)
            patch.setattr(helper, "threading_cleanup", _graced_cleanup)
        for test in suite:
            # A thread that never ends alters the environment every time; one that ended a
            # little late on a loaded machine (CPython's bound is 1 s) does not do it twice.
            for _attempt in range(2):
                support.environment_altered = False
                result = unittest.TestResult()
                test.run(result)
                assert result.wasSuccessful(), _why_failed(result)
                if not support.environment_altered:
                    break
            else:
                altered.append(test.id())
    assert suite.countTestCases() >= at_least
    assert not altered, f"threads outlived these tests: {altered}; now: {_alive()}"


@pytest.mark.real_redis
@pytest.mark.slow
@pytest.mark.parametrize("cls", LOCK_TYPES)
def test_cpython_lock_tests_see_their_threads_end(url: str, client: Any, cls: Any) -> None:
    """CPython's lock tests count threads before and after each test: with helper threads that
    never exit, the contended ones failed for that alone."""
    lock_tests = pytest.importorskip("test.lock_tests", reason="CPython's test package is not installed")

    base, skips, held = lock_tests.LockTests, _CPYTHON_SKIPS, frozenset()
    if cls is DistRLock:
        base, skips = lock_tests.RLockTests, _CPYTHON_SKIPS | _CPYTHON_RLOCK_SKIPS
        held = _CPYTHON_RLOCK_HELD
    counter = iter(range(10**6))
    suite = _cpython_suite(base, lambda: cls(f"cpython:{next(counter)}", client=client), skips,
                           held=held)
    _run_cpython_suite(suite, 12)


#: CPython's repr tests match threading's class names and repr exactly; a Dist repr names the
#: Dist class and adds the shared name (``<distlock.DistSemaphore at 0x…: value=2 name='pool'>``,
#: docs/guides/sync.rst).
_CPYTHON_REPR = {"test_repr"}
#: Tests that pass but end with permits still held (by the test's threads, or by an object it
#: deleted; with threading too they are never given back). A held permit keeps the watchdog
#: thread for as long as it is held, a ``lease=`` permit too (the thread keeps its local
#: deadline: docs/safety.rst, "Belief keeps time"): they run last, their threads not counted
#: (see _cpython_suite). Counted, a lease variant was flagged as altered, ran again, and on a
#: loaded machine failed the second time (Python 3.10, at CPython's own count of its Bunch).
_CPYTHON_SEM_HELD = {
    "test_acquire_contended", "test_acquire_destroy", "test_acquire_timeout",
    "test_multirelease", "test_release_unacquired", "test_try_acquire",
    "test_try_acquire_contended",
}
_CPYTHON_EVENT_SKIPS = _CPYTHON_REPR | {
    # CPython's private after-fork hook and Event._cond (distlock's after-fork handling is its
    # own: a fresh session in the child, tested elsewhere)
    "test_at_fork_reinit",
}
_CPYTHON_DISTLOCK_COND_SKIPS = {
    # it assumes the condition's own lock is reentrant (threading.Condition's default RLock):
    # over a DistLock, as over a threading.Lock, the second acquire() blocks for ever
    "test_acquire",
}

#: kind -> (lock_tests class, the attribute it builds its primitive with, skips, tests whose
#: threads are not counted, how many tests run at least); the factory is made per test (it
#: needs the client)
_CPYTHON_SYNC = {
    "Semaphore": ("SemaphoreTests", "semtype", _CPYTHON_REPR, _CPYTHON_SEM_HELD, 11),
    "Semaphore/lease": ("SemaphoreTests", "semtype", _CPYTHON_REPR, _CPYTHON_SEM_HELD, 11),
    "BoundedSemaphore": ("BoundedSemaphoreTests", "semtype", _CPYTHON_REPR, _CPYTHON_SEM_HELD, 11),
    "BoundedSemaphore/lease": ("BoundedSemaphoreTests", "semtype", _CPYTHON_REPR, _CPYTHON_SEM_HELD,
                               11),
    "Event": ("EventTests", "eventtype", _CPYTHON_EVENT_SKIPS, set(), 4),
    "Condition/DistRLock": ("ConditionTests", "condtype", set(), set(), 7),
    "Condition/DistLock": ("ConditionTests", "condtype", _CPYTHON_DISTLOCK_COND_SKIPS, set(), 6),
    "Barrier": ("BarrierTests", "barriertype", _CPYTHON_REPR, set(), 10),
}


def _sync_factory(kind: str, client: Any) -> Callable[..., Any]:
    """A factory with lock_tests' signature for ``kind``: a fresh name on every call."""
    counter = iter(range(10**6))

    def name() -> str:
        return f"cpython:{kind}:{next(counter)}"

    primitive, _, variant = kind.partition("/")
    if primitive in ("Semaphore", "BoundedSemaphore"):
        sem = DistSemaphore if primitive == "Semaphore" else DistBoundedSemaphore
        lease = 60.0 if variant == "lease" else None
        return lambda value=1: sem(name(), value, client=client, lease=lease)
    if primitive == "Event":
        return lambda: DistEvent(name(), client=client)
    if primitive == "Condition":
        lock_type = DistRLock if variant == "DistRLock" else DistLock

        def condition(lock: Any = None) -> DistCondition:
            fresh = name()
            if lock is None:
                lock = lock_type(fresh, client=client)
            return DistCondition(fresh, lock, client=client)

        return condition
    assert primitive == "Barrier"
    return lambda parties, action=None, timeout=None: DistBarrier(
        name(), parties, action, timeout, client=client)


@pytest.mark.real_redis
@pytest.mark.slow
@pytest.mark.parametrize("kind", sorted(_CPYTHON_SYNC))
def test_cpython_sync_tests_see_their_threads_end(url: str, client: Any, kind: str) -> None:
    """CPython's own tests of Semaphore, BoundedSemaphore, Event, Condition and Barrier pass
    against their Dist twins, and the threads each test made distlock start end with it."""
    lock_tests = pytest.importorskip("test.lock_tests", reason="CPython's test package is not installed")
    base_name, attr, skips, held, at_least = _CPYTHON_SYNC[kind]
    suite = _cpython_suite(getattr(lock_tests, base_name), _sync_factory(kind, client), skips,
                           attr, held)
    _run_cpython_suite(suite, at_least)


# --- clean exit ---------------------------------------------------------------------------------

_EXITING_HOLDER = textwrap.dedent("""
    import sys, redis
    from distlock import DistLock, DistSemaphore
    client = redis.Redis.from_url(sys.argv[1])
    lock = DistLock("exit:lock", client=client)
    sem = DistSemaphore("exit:sem", 1, client=client)
    assert lock.acquire(blocking=False) and sem.acquire(blocking=False)
    print("held", flush=True)
    # no release: the interpreter exits with both still held (watchdog leases of 30 s)
""")


@pytest.mark.real_redis
def test_holds_are_given_back_at_interpreter_exit(url: str, client: Any) -> None:
    """A process that exits normally while it holds a lock and a permit gives both back, so
    the others need not wait out the 30 s lease (a SIGKILL still leaves the lease)."""
    proc = subprocess.run([sys.executable, "-c", _EXITING_HOLDER, url],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "held"
    assert not client.exists("distlock:{exit:lock}")
    lock = DistLock("exit:lock", client=client)
    assert lock.acquire(timeout=5)
    lock.release()
    sem = DistSemaphore("exit:sem", 1, client=client)
    assert sem.acquire(timeout=5)
    sem.release()
