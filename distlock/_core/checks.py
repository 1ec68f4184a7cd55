"""Argument checks"""

from __future__ import annotations

import _thread
import math
from typing import Optional, Tuple

from .deadlines import MAX_LEASE


def check_acquire_args(blocking: object, timeout: object) -> Tuple[bool, Optional[float]]:
    """Check ``acquire(blocking, timeout)`` exactly as :mod:`threading` does.

    Return ``(blocking, timeout)`` where timeout is ``None`` for "wait forever" and a
    non-negative float of seconds otherwise.

    The check is delegated to a fresh, uncontended ``_thread`` lock: its ``acquire`` parses
    the same two arguments with CPython's own code, so every ValueError, OverflowError and
    TypeError (and its wording) is the one this interpreter's ``threading`` raises, whatever
    its version. The probe lock is private to this call and is free, so it never waits.
    """
    probe = _thread.allocate_lock()
    probe.acquire(blocking, timeout)  # type: ignore[arg-type]  # raises like threading
    probe.release()
    if not blocking:
        return False, 0.0
    seconds = float(timeout)  # type: ignore[arg-type]  # int, float and bool all pass the probe
    if seconds == -1:
        return True, None
    return True, seconds


def check_name(name: object) -> str:
    """Return ``name`` if it is a non-empty str; raise TypeError or ValueError otherwise."""
    if not isinstance(name, str):
        raise TypeError(f"name must be a str, not {type(name).__name__}")
    if not name:
        raise ValueError("name must not be empty")
    try:
        name.encode("utf-8")
    except UnicodeEncodeError as exc:  # lone surrogates: no key can carry them
        raise ValueError(f"name must be encodable as UTF-8: {exc.reason} at position {exc.start}") from None
    return name


def check_retention(value: object) -> float:
    """``configure(fence_retention=...)``: seconds, 0 allowed (the counter goes with the hold)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"fence_retention must be a number of seconds, not {type(value).__name__}")
    if value == 0:
        return 0.0
    return check_seconds(value, "fence_retention")


def check_seconds(value: object, what: str) -> float:
    """Return ``value`` as a positive, finite float of seconds, or raise TypeError/ValueError."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{what} must be a number of seconds, not {type(value).__name__}")
    try:
        seconds = float(value)
    except OverflowError:  # an int beyond any float
        raise OverflowError(f"{what} is too large (at most {MAX_LEASE:.0f} seconds)") from None
    if math.isnan(seconds):
        raise ValueError(f"{what} must not be NaN")
    if seconds <= 0 or math.isinf(seconds):
        raise ValueError(f"{what} must be a positive, finite number of seconds")
    if seconds > MAX_LEASE:
        raise OverflowError(f"{what} is too large (at most {MAX_LEASE:.0f} seconds)")
    return seconds


def check_lease(lease: object) -> Optional[float]:
    """Return ``None`` (watchdog) or a positive finite float of seconds."""
    if lease is None:
        return None
    return check_seconds(lease, "lease")


def check_max_hold(value: object) -> Optional[float]:
    """``max_hold``: None (the ``configure()`` default), ``math.inf`` (no cap), or a positive
    number of seconds; TypeError or ValueError otherwise."""
    if value is None:
        return None
    if isinstance(value, float) and math.isinf(value) and value > 0:
        return math.inf
    return check_seconds(value, "max_hold")


def refuse_max_hold(lock: object, max_hold: object) -> None:
    """A condition's ``max_hold`` caps the holds of the lock it makes: with a lock of the
    caller's own, TypeError (the cap is that lock's). Checked like the lock's own otherwise."""
    if max_hold is None:
        return
    if lock is not None:
        raise TypeError("max_hold is the lock's: give it to the lock the condition waits on")
    check_max_hold(max_hold)


def check_try_lock_timeout(timeout: object) -> Optional[float]:
    """``try_lock`` timeout: ``None`` waits forever, otherwise a non-negative finite number."""
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
        raise TypeError(f"timeout must be a number of seconds, not {type(timeout).__name__}")
    try:
        seconds = float(timeout)
    except OverflowError:  # an int beyond any float
        raise OverflowError("timeout value is too large") from None
    if math.isnan(seconds):
        raise ValueError("timeout must not be NaN")
    if seconds < 0:
        raise ValueError("timeout value must be a non-negative number")
    if seconds > _thread.TIMEOUT_MAX:
        raise OverflowError("timeout value is too large")
    return seconds





def check_wait_timeout(timeout: object) -> Optional[float]:
    """``wait(timeout)`` as :mod:`threading` reads it: None waits for ever, a positive number
    waits that long, anything else (zero, negative, NaN) does not wait at all.

    Return None or the seconds (0.0 for "do not wait"). A value ``threading`` rejects raises
    the same error: TypeError from the comparison with 0 for a non-number, OverflowError (from
    CPython's own lock code) for a timeout too large to wait on.
    """
    if timeout is None:
        return None
    if timeout > 0:  # type: ignore[operator]  # TypeError for non-numbers, as threading
        _blocking, seconds = check_acquire_args(True, timeout)
        return seconds
    return 0.0





def wait_seconds(timeout: object) -> float:
    """The checks ``threading`` makes on a timeout before it waits, in its order."""
    0.0 + timeout  # type: ignore[operator]  # TypeError as threading's ``_time() + timeout``
    if isinstance(timeout, float) and math.isnan(timeout):
        probe_timeout(timeout)  # ValueError: "Invalid value NaN (not a number)"
    if not timeout > 0:  # type: ignore[operator]  # TypeError for complex, as Condition.wait
        return 0.0
    probe_timeout(timeout)  # OverflowError for a timeout no lock can wait on
    return float(timeout)  # type: ignore[arg-type]


def probe_timeout(timeout: object) -> None:
    probe = _thread.allocate_lock()  # free: acquire() only parses its arguments and returns
    probe.acquire(True, timeout)  # type: ignore[arg-type]
    probe.release()
