"""Bad input: a hypothesis sweep over every public constructor and method (issue 7).

Each call either works or raises the right built-in type (TypeError, ValueError,
OverflowError, RuntimeError) with a message that names what was wrong, and a rejected call
writes nothing to Redis: the whole keyspace (keys, types, values, TTLs) is the same before and
after. Where ``threading`` has the same call (acquire's arguments, Condition.notify and wait),
the expected outcome is what the ``threading`` twin does with the same arguments.

``BUILDERS`` is the table of primitives; adding one is one entry.
"""

from __future__ import annotations

import _thread
import decimal
import fractions
import math
import operator
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, Optional, Type

import faults
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import distlock
from distlock import LockLostError, LockNotOwnedError
from distlock._core.deadlines import MAX_LEASE
from distlock._primitives.semaphore import MAX_PERMITS

# --- the table ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Builder:
    """How to build one lock-like object: ``build(name, client, **options)``."""

    make: Callable[..., Any]
    has_lease: bool = True


def _rw(side: str) -> Callable[..., Any]:
    def make(name: Any, client: Any, **options: Any) -> Any:
        rw = distlock.DistReadWriteLock(name, client=client, **options)  # type: ignore[attr-defined]
        return rw.read_lock() if side == "read" else rw.write_lock()
    return make


def _builders() -> Dict[str, Builder]:
    table = {
        "DistLock": Builder(lambda name, client, **kw: distlock.DistLock(name, client=client, **kw)),
        "DistRLock": Builder(lambda name, client, **kw: distlock.DistRLock(name, client=client, **kw)),
    }
    if hasattr(distlock, "DistReadWriteLock"):
        table["DistReadWriteLock.read"] = Builder(_rw("read"))
        table["DistReadWriteLock.write"] = Builder(_rw("write"))
    if hasattr(distlock, "DistCondition"):
        table["DistCondition"] = Builder(
            lambda name, client, **kw: distlock.DistCondition(name, client=client, **kw),  # type: ignore[attr-defined]
            has_lease=False)
    return table


BUILDERS = _builders()
KINDS = sorted(BUILDERS)

SWEEP = settings(max_examples=40, deadline=None,
                 suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

# --- strategies -----------------------------------------------------------------------------

ODD_OBJECTS = st.sampled_from([None, b"x", bytearray(b"x"), 1j, [], (), {}, object(), True, False,
                               decimal.Decimal("1.5"), fractions.Fraction(1, 3), "1", "nan"])

NAMES = st.one_of(
    st.text(max_size=30),
    st.sampled_from(["", " ", "{", "}", "{}", "{a}", "a{b}c", "}{", "{{x}}", "x\x00y", "\x00",
                     "é☃𝄞", "\ud800", "a\udfffb", "n" * 65536, "ä" * 65536, "*", "?", "[a]"]),
    st.binary(max_size=8), st.integers(), st.floats(allow_nan=True), ODD_OBJECTS,
)

NUMBERS = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(min_value=-(10 ** 30), max_value=10 ** 30),
    st.sampled_from([0, -1, -1.0, 0.0, -0.0, 1e-300, 5e-324, 2 ** 63, 10 ** 400, math.nan, math.inf,
                     -math.inf, threading.TIMEOUT_MAX, threading.TIMEOUT_MAX * 2, MAX_LEASE,
                     MAX_LEASE * 1.01]),
    ODD_OBJECTS,
)


# --- helpers --------------------------------------------------------------------------------

def outcome(call: Callable[[], Any]) -> Any:
    """The exception ``call`` raises (type and message), or ``None`` with its result."""
    try:
        return None, call()
    except Exception as exc:  # noqa: BLE001 - compared by the test
        return exc, None


def rejected_writes_nothing(client: Any, call: Callable[[], Any]) -> Optional[BaseException]:
    """Run ``call``; when it raises, assert the keyspace did not change; return the exception."""
    before = faults.keyspace(client)
    exc, _ = outcome(call)
    if exc is not None:
        assert faults.keyspace(client) == before, f"rejected call {exc!r} wrote to Redis"
    return exc


def expected_name_error(name: Any) -> Optional[Type[Exception]]:
    if not isinstance(name, str):
        return TypeError
    if not name:
        return ValueError
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return ValueError
    return None


def expected_seconds_error(value: Any) -> Optional[Type[Exception]]:
    """What ``lease=value`` must raise (None for lease None is the watchdog)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return TypeError
    try:
        seconds = float(value)
    except OverflowError:
        return OverflowError
    if math.isnan(seconds) or seconds <= 0 or math.isinf(seconds):
        return ValueError
    if seconds > MAX_LEASE:
        return OverflowError
    return None


def use(lock: Any) -> None:
    """Take and give back a lock that was built: it must work on a free name."""
    assert lock.acquire(blocking=False) is True
    try:
        lock.release()
    except LockLostError:
        pass  # a lease of a few microseconds may run out before the release


_counter = [0]


def fresh(prefix: str) -> str:
    _counter[0] += 1
    return f"bad-{prefix}-{_counter[0]}"


# --- names ----------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", KINDS)
@SWEEP
@given(name=NAMES)
def test_names(client: Any, kind: str, name: Any) -> None:
    build = BUILDERS[kind].make
    expected = expected_name_error(name)
    exc = rejected_writes_nothing(client, lambda: build(name, client))
    if expected is None:
        assert exc is None, f"{name!r} refused: {exc!r}"
        lock = build(name, client)
        use(lock)
        for key in client.scan_iter(match="distlock:*"):
            assert key.startswith(b"distlock:{")
    else:
        assert type(exc) is expected, (name, exc)
        assert "name" in str(exc)


# --- leases ---------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", [k for k in KINDS if BUILDERS[k].has_lease])
@SWEEP
@given(lease=NUMBERS)
def test_constructor_lease(client: Any, kind: str, lease: Any) -> None:
    build = BUILDERS[kind].make
    expected = expected_seconds_error(lease)
    name = fresh("lease")
    exc = rejected_writes_nothing(client, lambda: build(name, client, lease=lease))
    if expected is None:
        assert exc is None, f"lease={lease!r} refused: {exc!r}"
        use(build(name, client, lease=lease))
    else:
        assert type(exc) is expected, (lease, exc)
        assert "lease" in str(exc)


# --- acquire(blocking, timeout): exactly threading's checks ---------------------------------

@pytest.mark.parametrize("kind", KINDS)
@SWEEP
@given(blocking=st.one_of(st.booleans(), ODD_OBJECTS, st.integers(-2, 2)), timeout=NUMBERS)
def test_acquire_arguments_as_threading(client: Any, kind: str, blocking: Any, timeout: Any) -> None:
    twin_exc, _ = outcome(lambda: _twin_acquire(blocking, timeout))
    lock = BUILDERS[kind].make(fresh("acq"), client)
    exc = rejected_writes_nothing(client, lambda: lock.acquire(blocking, timeout))
    if twin_exc is None:
        assert exc is None, f"acquire({blocking!r}, {timeout!r}) refused: {exc!r}"
        lock.release()
    else:
        assert type(exc) is type(twin_exc) and str(exc) == str(twin_exc), (blocking, timeout, exc)


def _twin_acquire(blocking: Any, timeout: Any) -> bool:
    twin = threading.Lock()
    got = twin.acquire(blocking, timeout)
    if got:
        twin.release()
    return got


# --- try_lock(timeout, lease) ---------------------------------------------------------------

def expected_try_timeout_error(value: Any) -> Optional[Type[Exception]]:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return TypeError
    try:
        seconds = float(value)
    except OverflowError:
        return OverflowError
    if math.isnan(seconds) or seconds < 0:
        return ValueError
    if seconds > threading.TIMEOUT_MAX:
        return OverflowError
    return None


@pytest.mark.parametrize("kind", [k for k in KINDS if hasattr(BUILDERS[k].make("x", None), "try_lock")])
@SWEEP
@given(timeout=NUMBERS, lease=st.one_of(st.none(), NUMBERS))
def test_try_lock_arguments(client: Any, kind: str, timeout: Any, lease: Any) -> None:
    lock = BUILDERS[kind].make(fresh("try"), client)
    expected = expected_try_timeout_error(timeout) or expected_seconds_error(lease)
    exc = rejected_writes_nothing(client, lambda: lock.try_lock(timeout, lease))
    if expected is None:
        assert exc is None, f"try_lock({timeout!r}, {lease!r}) refused: {exc!r}"
        try:
            lock.release()
        except LockLostError:
            pass
    else:
        assert type(exc) is expected, (timeout, lease, exc)
        assert "timeout" in str(exc) or "lease" in str(exc)


# --- client ---------------------------------------------------------------------------------

BAD_URLS = ["", "http://127.0.0.1:1/0", "127.0.0.1:6379", "redis://127.0.0.1:notaport/0"]


@pytest.mark.parametrize("kind", KINDS)
@SWEEP
@given(value=st.one_of(ODD_OBJECTS.filter(lambda v: v is not None and not isinstance(v, str)),
                       st.integers(), st.sampled_from(BAD_URLS)))
def test_client_argument(client: Any, kind: str, value: Any) -> None:
    exc = rejected_writes_nothing(client, lambda: BUILDERS[kind].make(fresh("client"), value))
    assert exc is not None
    # an empty list is the right type for DistLock and DistRLock (a Redlock quorum), but empty
    empty_quorum = isinstance(value, (list, tuple)) and not value and kind in ("DistLock", "DistRLock")
    expected = ValueError if isinstance(value, str) or empty_quorum else TypeError
    assert isinstance(exc, expected), (value, exc)
    assert str(exc)


# --- release, on_lost -----------------------------------------------------------------------

@pytest.mark.parametrize("kind", KINDS)
def test_release_unheld_is_runtime_error_and_writes_nothing(client: Any, kind: str) -> None:
    lock = BUILDERS[kind].make(fresh("rel"), client)
    exc = rejected_writes_nothing(client, lock.release)
    assert isinstance(exc, RuntimeError)
    if kind != "DistCondition":
        assert isinstance(exc, LockNotOwnedError)
    twin = threading.RLock() if kind != "DistLock" else threading.Lock()
    twin_exc, _ = outcome(twin.release)
    assert str(exc) == str(twin_exc)


@pytest.mark.parametrize("kind", [k for k in KINDS if k != "DistCondition"])
@SWEEP
@given(callback=ODD_OBJECTS)
def test_on_lost_needs_a_callable(client: Any, kind: str, callback: Any) -> None:
    lock = BUILDERS[kind].make(fresh("cb"), client)
    exc = rejected_writes_nothing(client, lambda: lock.on_lost(callback))
    assert type(exc) is TypeError and "callable" in str(exc)


# --- configure ------------------------------------------------------------------------------

@SWEEP
@given(field=st.sampled_from(["lease", "renew_interval", "wait_cap"]), value=NUMBERS)
def test_configure_numbers(client: Any, field: str, value: Any) -> None:
    before = distlock.configure()
    exc = rejected_writes_nothing(client, lambda: distlock.configure(**{field: value}))
    after = distlock.configure()
    if value is None:
        assert exc is None and after == before
        return
    expected = expected_seconds_error(value)
    if expected is None and field == "renew_interval" and float(value) >= before.lease:
        expected = ValueError
    if expected is None and field == "lease" and float(value) <= before.renew_interval:
        expected = ValueError
    if expected is None:
        assert exc is None, (field, value, exc)
        distlock._core.settings.reset_settings()
    else:
        assert type(exc) is expected, (field, value, exc)
        assert after == before, "a refused configure() changed the settings"


@SWEEP
@given(prefix=st.one_of(ODD_OBJECTS.filter(lambda v: not isinstance(v, str)), st.integers()))
def test_configure_prefix_type(client: Any, prefix: Any) -> None:
    before = distlock.configure()
    exc = rejected_writes_nothing(client, lambda: distlock.configure(prefix=prefix))
    if prefix is None:
        assert exc is None
    else:
        assert type(exc) is TypeError and "prefix" in str(exc)
    assert distlock.configure() == before


# --- Condition: notify(n), wait(timeout), as threading.Condition ----------------------------

needs_condition = pytest.mark.skipif(not hasattr(distlock, "DistCondition"),
                                     reason="DistCondition is not in this tree yet")


@needs_condition
@SWEEP
@given(n=NUMBERS)
def test_condition_notify_n_as_threading(client: Any, n: Any) -> None:
    # threading.Condition.notify loops ``while waiters and n > 0``: with a waiter (the case
    # that matters: a distributed condition cannot know there is none) it evaluates n > 0.
    twin_exc, _ = outcome(lambda: n > 0)
    cond = distlock.DistCondition(fresh("notify"), client=client)  # type: ignore[attr-defined]
    with cond:
        exc = rejected_writes_nothing(client, lambda: cond.notify(n))
    if twin_exc is None:
        assert exc is None, (n, exc)
    else:
        assert type(exc) is type(twin_exc), (n, exc, twin_exc)


@needs_condition
@SWEEP
@given(timeout=NUMBERS)
def test_condition_wait_timeout_as_threading(client: Any, timeout: Any) -> None:
    # Only values threading refuses, or that do not wait (a long wait has no place here).
    twin = threading.Condition()
    if timeout is None or (isinstance(timeout, (int, float)) and timeout > 0.01
                           and timeout == timeout):  # not NaN
        return
    with twin:
        twin_exc, twin_result = outcome(lambda: twin.wait(timeout))
    cond = distlock.DistCondition(fresh("wait"), client=client)  # type: ignore[attr-defined]
    with cond:
        exc, result = outcome(lambda: cond.wait(timeout))
        assert cond._is_owned(), "wait() did not take the lock back"
    if twin_exc is None:
        assert exc is None and result == twin_result, (timeout, exc, result)
    else:
        assert type(exc) is type(twin_exc), (timeout, exc, twin_exc)


@needs_condition
def test_condition_notify_unheld_writes_nothing(client: Any) -> None:
    cond = distlock.DistCondition(fresh("unheld"), client=client)  # type: ignore[attr-defined]
    for call in (cond.notify, cond.notify_all, cond.wait):
        exc = rejected_writes_nothing(client, call)
        assert type(exc) is RuntimeError and "un-acquired lock" in str(exc)


# --- DistSemaphore, DistBoundedSemaphore, DistEvent, DistBarrier --------------------------------
#
# Not lock-like (threading's Semaphore, Event and Barrier have other signatures and errors), so
# they have their own table. Where threading checks an argument only when it has to wait, the
# expected outcome is what it raises then (``waiting_error``), computed without waiting;
# distlock checks it at once, as the classes document.

needs_sync = pytest.mark.skipif(
    not all(hasattr(distlock, k) for k in ("DistSemaphore", "DistBoundedSemaphore", "DistEvent",
                                           "DistBarrier")),
    reason="the sync primitives are not in this tree yet")


def _sync_builders() -> Dict[str, Callable[..., Any]]:
    if not all(hasattr(distlock, k) for k in ("DistSemaphore", "DistBoundedSemaphore",
                                              "DistEvent", "DistBarrier")):
        return {}
    return {
        "DistSemaphore": lambda name, client, **kw: distlock.DistSemaphore(name, client=client, **kw),  # type: ignore[attr-defined]
        "DistBoundedSemaphore": lambda name, client, **kw: distlock.DistBoundedSemaphore(  # type: ignore[attr-defined]
            name, client=client, **kw),
        "DistEvent": lambda name, client, **kw: distlock.DistEvent(name, client=client, **kw),  # type: ignore[attr-defined]
        "DistBarrier": lambda name, client, **kw: distlock.DistBarrier(name, 1, client=client, **kw),  # type: ignore[attr-defined]
    }


SYNC = _sync_builders()
SYNC_KINDS = sorted(SYNC)
SEM_KINDS = [k for k in SYNC_KINDS if "Semaphore" in k]


def use_sync(obj: Any) -> None:
    """Use a sync object that was built, leaving nothing in Redis."""
    if hasattr(obj, "set"):  # an event
        assert obj.is_set() is False
        obj.set()
        assert obj.wait(0) is True
        obj.clear()
    elif hasattr(obj, "parties"):  # a barrier of one party: wait() trips at once
        assert obj.wait() == 0
    else:
        assert obj.acquire(blocking=False) is True
        try:
            obj.release()
        except LockLostError:
            pass  # a lease of a few microseconds may run out before the release


def waiting_error(timeout: Any) -> Optional[Exception]:
    """What threading raises for ``timeout`` when it has to wait (Semaphore.acquire,
    Barrier.wait): ``_time() + timeout``, then Condition.wait's ``timeout > 0`` and the lock's
    own parsing of it. Computed on a free lock: nothing waits. None: threading takes it."""
    try:
        time.monotonic() + timeout
        if timeout > 0:
            probe = _thread.allocate_lock()
            probe.acquire(True, timeout)
            probe.release()
    except Exception as exc:  # noqa: BLE001 - compared by the test
        return exc
    return None


def is_nan(value: Any) -> bool:
    return isinstance(value, float) and math.isnan(value)


@needs_sync
@pytest.mark.parametrize("kind", SYNC_KINDS)
@SWEEP
@given(name=NAMES)
def test_sync_names(client: Any, kind: str, name: Any) -> None:
    build = SYNC[kind]
    expected = expected_name_error(name)
    exc = rejected_writes_nothing(client, lambda: build(name, client))
    if expected is None:
        assert exc is None, f"{name!r} refused: {exc!r}"
        use_sync(build(name, client))
        assert faults.keyspace(client) == {}, "a sync object at rest left keys behind"
    else:
        assert type(exc) is expected, (name, exc)
        assert "name" in str(exc)


@needs_sync
@pytest.mark.parametrize("kind", SYNC_KINDS)
@SWEEP
@given(value=st.one_of(ODD_OBJECTS.filter(lambda v: v is not None and not isinstance(v, str)),
                       st.integers(), st.sampled_from(BAD_URLS)))
def test_sync_client_argument(client: Any, kind: str, value: Any) -> None:
    exc = rejected_writes_nothing(client, lambda: SYNC[kind](fresh("client"), value))
    assert exc is not None
    # an empty list is the right type for DistLock and DistRLock (a Redlock quorum), but empty
    empty_quorum = isinstance(value, (list, tuple)) and not value and kind in ("DistLock", "DistRLock")
    expected = ValueError if isinstance(value, str) or empty_quorum else TypeError
    assert isinstance(exc, expected), (value, exc)
    assert str(exc)


@needs_sync
@pytest.mark.parametrize("kind", SEM_KINDS)
@SWEEP
@given(lease=NUMBERS)
def test_semaphore_lease(client: Any, kind: str, lease: Any) -> None:
    expected = expected_seconds_error(lease)
    name = fresh("semlease")
    exc = rejected_writes_nothing(client, lambda: SYNC[kind](name, client, lease=lease))
    if expected is None:
        assert exc is None, f"lease={lease!r} refused: {exc!r}"
        use_sync(SYNC[kind](name, client, lease=lease))
    else:
        assert type(exc) is expected, (lease, exc)
        assert "lease" in str(exc)


@needs_sync
@pytest.mark.parametrize("kind", SEM_KINDS)
@SWEEP
@given(value=NUMBERS)
def test_semaphore_value(client: Any, kind: str, value: Any) -> None:
    """threading's check (``value < 0``: ValueError; TypeError when it cannot compare), then
    a count of permits must be an integer (TypeError; threading would take 2.5) that Redis
    keeps exactly (OverflowError above 2**53 - 1)."""
    twin_exc, _ = outcome(lambda: threading.Semaphore(value))
    expected: Optional[Type[Exception]] = type(twin_exc) if twin_exc is not None else None
    if expected is None:
        index_exc, _ = outcome(lambda: operator.index(value))
        if index_exc is not None:
            expected = TypeError
        elif operator.index(value) > MAX_PERMITS:
            expected = OverflowError  # Redis keeps a count exactly up to 2**53 - 1
    name = fresh("semvalue")
    exc = rejected_writes_nothing(client, lambda: SYNC[kind](name, client, value=value))
    if expected is None:
        assert exc is None, f"value={value!r} refused: {exc!r}"
        sem = SYNC[kind](name, client, value=value)
        if value > 0:
            use_sync(sem)
        else:
            assert sem.acquire(blocking=False) is False
        assert faults.keyspace(client) == {}
    else:
        assert type(exc) is expected, (value, exc)
        if twin_exc is not None:
            assert str(exc) == str(twin_exc)


@needs_sync
@pytest.mark.parametrize("kind", SEM_KINDS)
@SWEEP
@given(blocking=st.one_of(st.booleans(), ODD_OBJECTS, st.integers(-2, 2)), timeout=NUMBERS)
def test_semaphore_acquire_arguments(client: Any, kind: str, blocking: Any, timeout: Any) -> None:
    """threading.Semaphore.acquire's checks, made at once (a free permit or not): a timeout
    with blocking false, then what a timeout raises when threading has to wait; NaN raises
    ValueError (threading would spin for ever)."""
    sem = SYNC[kind](fresh("semacq"), client)
    exc = rejected_writes_nothing(client, lambda: sem.acquire(blocking, timeout))
    if not blocking and timeout is not None:
        assert type(exc) is ValueError and str(exc) == "can't specify timeout for non-blocking acquire"
        return
    twin_exc = waiting_error(timeout) if blocking and timeout is not None else None
    if twin_exc is not None:
        assert type(exc) is type(twin_exc) and str(exc) == str(twin_exc), (timeout, exc)
    elif blocking and is_nan(timeout):
        assert type(exc) is ValueError and "NaN" in str(exc), (timeout, exc)
    else:
        assert exc is None, f"acquire({blocking!r}, {timeout!r}) refused: {exc!r}"
        sem.release()
    assert faults.keyspace(client) == {}


@needs_sync
@pytest.mark.parametrize("kind", SEM_KINDS)
@SWEEP
@given(n=NUMBERS)
def test_semaphore_release_n(client: Any, kind: str, n: Any) -> None:
    """threading's ``n < 1`` check and wording, then an integer, checked before anything
    changes; a bounded semaphore then refuses to go above its value, changing nothing."""
    sem = SYNC[kind](fresh("semrel"), client)
    exc = rejected_writes_nothing(client, lambda: sem.release(n))
    below_exc, below = outcome(lambda: n < 1)
    if below_exc is not None:
        assert type(exc) is type(below_exc), (n, exc)
    elif below:
        assert type(exc) is ValueError and str(exc) == "n must be one or more"
    elif outcome(lambda: operator.index(n))[0] is not None:
        assert type(exc) is TypeError, (n, exc)
    elif operator.index(n) > MAX_PERMITS:
        assert type(exc) is OverflowError and "n must be" in str(exc), (n, exc)
    elif "Bounded" in kind:
        assert type(exc) is ValueError and str(exc) == "Semaphore released too many times"
    else:
        assert exc is None, f"release({n!r}) refused: {exc!r}"


@needs_sync
@pytest.mark.parametrize("kind", SEM_KINDS)
@SWEEP
@given(callback=ODD_OBJECTS)
def test_semaphore_on_lost_needs_a_callable(client: Any, kind: str, callback: Any) -> None:
    sem = SYNC[kind](fresh("semcb"), client)
    exc = rejected_writes_nothing(client, lambda: sem.on_lost(callback))
    assert type(exc) is TypeError and "callable" in str(exc)


@needs_sync
@SWEEP
@given(timeout=NUMBERS)
def test_event_wait_timeout_as_threading(client: Any, timeout: Any) -> None:
    """threading.Event.wait's errors (Condition.wait's ``timeout > 0``, then the lock's parsing)
    when it has to wait; a valid timeout that would wait is tried on a set event instead."""
    twin_exc: Optional[Exception] = None
    waits = False
    try:
        if timeout is not None and timeout > 0:
            probe = _thread.allocate_lock()
            probe.acquire(True, timeout)
            probe.release()
            waits = timeout > 0.01
    except Exception as err:  # noqa: BLE001
        twin_exc = err
    event = distlock.DistEvent(fresh("evwait"), client=client)  # type: ignore[attr-defined]
    if twin_exc is None and (timeout is None or waits):
        event.set()
        assert event.wait(timeout) is True
        event.clear()
        return
    exc, result = outcome(lambda: event.wait(timeout))
    if twin_exc is None:
        assert exc is None and result is False, (timeout, exc, result)
    else:
        assert type(exc) is type(twin_exc), (timeout, exc, twin_exc)
    assert faults.keyspace(client) == {}, "a wait that returned at once left its entry"


@needs_sync
@SWEEP
@given(parties=NUMBERS, action=st.one_of(ODD_OBJECTS, st.just(lambda: None)), timeout=NUMBERS)
def test_barrier_constructor(client: Any, parties: Any, action: Any, timeout: Any) -> None:
    """parties: an integer (TypeError), at least 1 (ValueError); action: callable or None
    (TypeError); timeout: what threading raises when it waits, NaN: ValueError."""
    expected: Optional[Type[Exception]] = None
    word = ""
    if outcome(lambda: operator.index(parties))[0] is not None:
        expected, word = TypeError, ""
    elif operator.index(parties) < 1:
        expected, word = ValueError, "parties"
    elif action is not None and not callable(action):
        expected, word = TypeError, "action"
    elif timeout is not None:
        twin_exc = waiting_error(timeout)
        if twin_exc is not None:
            expected = type(twin_exc)
        elif is_nan(timeout):
            expected = ValueError
    name = fresh("bar")
    exc = rejected_writes_nothing(
        client, lambda: distlock.DistBarrier(name, parties, action, timeout, client=client))  # type: ignore[attr-defined]
    if expected is None:
        assert exc is None, f"DistBarrier({parties!r}, {action!r}, {timeout!r}) refused: {exc!r}"
    else:
        assert type(exc) is expected, (parties, action, timeout, exc)
        assert word in str(exc)


@needs_sync
@SWEEP
@given(timeout=NUMBERS)
def test_barrier_wait_timeout(client: Any, timeout: Any) -> None:
    """A barrier of one party never waits: a valid timeout returns index 0 and leaves nothing;
    a bad one raises what threading raises when it waits, before anything is written."""
    barrier = distlock.DistBarrier(fresh("barwait"), 1, client=client)  # type: ignore[attr-defined]
    exc = rejected_writes_nothing(client, lambda: barrier.wait(timeout))
    twin_exc = None if timeout is None else waiting_error(timeout)
    if twin_exc is not None:
        assert type(exc) is type(twin_exc), (timeout, exc, twin_exc)
    elif is_nan(timeout):
        assert type(exc) is ValueError, (timeout, exc)
    else:
        assert exc is None, f"wait({timeout!r}) refused: {exc!r}"
        assert barrier.wait(timeout) == 0
    assert barrier.broken is False
    assert faults.keyspace(client) == {}
