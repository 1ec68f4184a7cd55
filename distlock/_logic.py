"""Everything that needs no I/O: argument checks, key names, deadlines, reply codes, reprs.

The sync shell (and a future asyncio one) import from here, so there is one copy of each rule.
Nothing in this module talks to Redis, starts a thread or reads a clock other than
``time.monotonic``.
"""

from __future__ import annotations

import _thread
import math
import random
import time
from typing import Optional, Tuple

__all__ = [
    "Keys",
    "Deadline",
    "escape_name",
    "unescape_name",
    "check_acquire_args",
    "check_name",
    "check_lease",
    "check_try_lock_timeout",
    "lease_ms",
    "lock_repr",
]


# --- argument checks ------------------------------------------------------------------------

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


#: The longest lease accepted, in seconds: Redis' PEXPIRE takes a signed 64-bit number of
#: milliseconds, but a year is already far past any sensible lease.
MAX_LEASE = 366 * 24 * 3600.0


def lease_ms(seconds: float) -> int:
    """Seconds to whole milliseconds, rounded up so that a lease never comes out shorter."""
    return max(1, math.ceil(seconds * 1000.0))


# --- key names ------------------------------------------------------------------------------

def escape_name(name: str) -> str:
    """The name as it appears inside the hash tag: ``%``, ``{`` and ``}`` percent-encoded.

    Without it a name starting with ``}`` would give an empty tag (Redis then hashes the whole
    key, scattering one primitive over several slots). The encoding is reversible
    (``unescape_name``) and leaves every name without those three characters unchanged.
    """
    if "%" in name or "{" in name or "}" in name:
        return name.replace("%", "%25").replace("{", "%7B").replace("}", "%7D")
    return name


def unescape_name(escaped: str) -> str:
    """Inverse of ``escape_name``."""
    if "%" not in escaped:
        return escaped
    return escaped.replace("%7D", "}").replace("%7B", "{").replace("%25", "%")


class Keys:
    """Key and channel names of one primitive.

    Every name is ``<prefix>{<name>}<suffix>``: the braces are a Redis Cluster hash tag, so all
    keys of one primitive map to one slot and every script touches one slot only. Braces and
    ``%`` inside a name are percent-encoded (``escape_name``), so the tag is always the whole,
    non-empty name, and two names never share a key. Suffixes are chosen so that no
    ``}suffix`` ends another (``tests/test_logic.py`` checks both). The names are computed once:
    they are on every round trip.
    """

    __slots__ = ("prefix", "name", "tag", "lock", "fence", "channel", "queue")

    def __init__(self, prefix: str, name: str) -> None:
        self.prefix = prefix
        self.name = name
        self.tag = f"{prefix}{{{escape_name(name)}}}"
        #: hash: owner -> reentrancy count, plus the ``:t`` (token) and ``:i`` (info) fields
        self.lock = self.tag
        #: string: the last fencing token granted for this name; the only key left at rest
        self.fence = self.tag + ":fence"
        #: pub/sub channel: wake-up hints for every waiter of the name (force-release, and
        #: primitives built on top); exclusive locks wake one process via ``waiter_channel``
        self.channel = self.tag + ":wake"
        #: sorted set: the wake-up channels of processes waiting for an exclusive lock
        self.queue = self.tag + ":q"

    def waiter_channel(self, session_id: str) -> str:
        """The wake-up channel of one process (session) waiting for an exclusive lock."""
        return f"{self.channel}:{session_id}"

    def sub(self, suffix: str) -> str:
        """Another key of the same primitive (same hash tag), for primitives built on top."""
        return f"{self.tag}:{suffix}"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Keys) and (self.prefix, self.name) == (other.prefix, other.name)

    def __hash__(self) -> int:
        return hash((self.prefix, self.name))

    def __repr__(self) -> str:
        return f"Keys(prefix={self.prefix!r}, name={self.name!r})"


# --- deadlines ------------------------------------------------------------------------------

class Backoff:
    """How long a waiter that lost a race stays out of the waiting registry.

    A hint wakes a waiter when the lock is released, but under steady contention the releasing
    process often takes the lock again before the woken waiter's try arrives. A waiter that
    keeps answering hints it then loses only costs everyone round trips (the holder's script
    runs queue behind its tries), so after each such loss it sleeps unregistered (no release
    wakes it) for ``first`` seconds, doubling with every further loss up to ``most``, with
    jitter so that several losers do not come back together; then it registers again. A lone
    waiter never loses a race and so never backs off: its handoff stays one hint long.
    """

    __slots__ = ("_next", "_most")

    def __init__(self, first: float = 0.002, most: float = 0.1) -> None:
        self._next = first
        self._most = most

    def lost(self) -> float:
        """The next backoff, in seconds (between half and all of the current step)."""
        step = self._next
        self._next = min(step * 2.0, self._most)
        return step * random.uniform(0.5, 1.0)


class Deadline:
    """A point on ``time.monotonic()``'s clock, or none at all (wait forever)."""

    __slots__ = ("_at",)

    def __init__(self, timeout: Optional[float]) -> None:
        self._at = None if timeout is None else time.monotonic() + timeout

    def remaining(self) -> Optional[float]:
        """Seconds left (never negative), or ``None`` without a deadline."""
        if self._at is None:
            return None
        return max(0.0, self._at - time.monotonic())

    def expired(self) -> bool:
        return self._at is not None and time.monotonic() >= self._at

    def sleep_bound(self, holder: Optional[float], cap: float) -> float:
        """How long a waiter may sleep before it must try again.

        min(time left, the holder's remaining lease in seconds, cap): a lost wake-up or a
        crashed holder then costs at most this long. A holder lease of None, or of 0 or less
        (unknown), counts as no bound.
        """
        bound = cap
        if holder is not None and holder > 0:
            bound = min(bound, holder)
        left = self.remaining()
        if left is not None:
            bound = min(bound, left)
        return bound


# --- reply codes ----------------------------------------------------------------------------

#: release script: the hold was not (or no longer) ours, or its token changed.
RELEASE_LOST = -1


def registry_lease_ms(wait_cap: float) -> int:
    """How long a process stays registered as waiting after its last failed try: longer than
    the longest a head waiter sleeps between tries (``wait_cap``), so a live process never drops
    out, and short enough that a dead one stops being woken within seconds."""
    return int((2 * wait_cap + 1) * 1000)


# --- reprs ----------------------------------------------------------------------------------

def lock_repr(obj: object, kind: str, name: str, locked: bool, extra: str = "") -> str:
    """``<locked distlock.DistRLock object name='orders:42' owner=… count=… at 0x…>``."""
    state = "locked" if locked else "unlocked"
    extra = f" {extra}" if extra else ""
    return f"<{state} distlock.{kind} object name={name!r}{extra} at {hex(id(obj))}>"
