"""Bad input: a hypothesis sweep over every public constructor and method (issue 7).

Each call either works or raises the right built-in type (TypeError, ValueError,
OverflowError, RuntimeError) with a message that names what was wrong, and a rejected call
writes nothing to Redis: the whole keyspace (keys, types, values, TTLs) is the same before and
after. Where ``threading`` has the same call (acquire's arguments, Condition.notify and wait),
the expected outcome is what the ``threading`` twin does with the same arguments.

``BUILDERS`` is the table of primitives; adding one is one entry.
"""

from __future__ import annotations

import decimal
import fractions
import math
import threading
from dataclasses import dataclass
from typing import Any, Callable, Dict, Optional, Type

import faults
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import distlock
from distlock import LockLostError, LockNotOwnedError
from distlock._logic import MAX_LEASE

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
    expected = ValueError if isinstance(value, str) else TypeError
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
        distlock.configure(lease=30.0, renew_interval=10.0, wait_cap=2.0)
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
