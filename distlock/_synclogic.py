"""DistSemaphore's, DistEvent's and DistBarrier's rules that need no I/O.

Key names, argument checks (with :mod:`threading`'s own errors and wording), wait-entry
leases, the reply codes of the ``sem_*``, ``ev_*`` and ``bar_*`` scripts and the reprs. Shared by
the sync shells (``_semaphore.py``, ``_event.py``, ``_barrier.py``) and any future asyncio twin;
nothing here talks to Redis, starts a thread or reads a clock.
"""

from __future__ import annotations

import _thread
import itertools
import math
import operator
from dataclasses import dataclass
from typing import Optional, Tuple

from ._logic import Keys, lease_ms

__all__ = [
    "SemKeys", "EventKeys", "BarrierKeys",
    "check_sem_value", "check_sem_acquire_args", "check_release_n", "check_parties",
    "check_barrier_timeout", "check_action", "MAX_PERMITS",
    "permit_id", "entry_ms", "broken_keep_ms",
    "sem_repr", "event_repr", "barrier_repr",
    "value_mismatch", "parties_mismatch", "TOO_MANY_RELEASES",
    "SEM_MISMATCH", "REL_TOO_MANY", "REL_MISMATCH", "REL_OVERFLOW", "COUNT_OVERFLOW",
    "release_lost",
    "EV_SET", "EV_TAKEN", "EV_EXPIRED",
    "BAR_WAITING", "BAR_TRIPPED", "BAR_RUN", "BAR_BROKEN", "BAR_BUSY", "BAR_MISMATCH",
    "BAR_PENDING",
]


# --- key names ------------------------------------------------------------------------------

@dataclass(frozen=True)
class SemKeys:
    """Every key and channel of one DistSemaphore / DistBoundedSemaphore, under the name's tag.

    - ``sem``: sorted set, one member per held permit, permit id -> lease deadline (server ms);
      plus two counters with negative scores: ``~v`` -> -(value + 1), the value the semaphore
      was created with, and ``~x`` -> -(extra + 1), how many releases went beyond the permits
      held (threading's counter raised by ``release()`` without ``acquire()``; absent when 0).
      Live permits are the scores above now; expired ones (a holder that died) are removed by
      the next script that looks, in O(log n), so a dead holder's permits come back when its
      lease runs out. The free permits are ``value + extra - live permits``. The key lives as
      long as its latest lease while extra is 0, for good while it is not, and not at all at
      rest (nothing held, extra 0).
    - ``handed``: sorted set, permit id -> its lease deadline, for permits released on their
      owner's behalf by a process that held none (see ``DistSemaphore.release``): the owner's
      watchdog then forgets the permit instead of calling it lost.
    - ``queue``: sorted set, waiter id -> entry deadline (server ms): the callers waiting for a
      permit. While it exists, a release publishes a wake-up hint.
    - ``channel``: the hints, ``"<n>"``: wake up to n waiters per process.
    """

    sem: str
    handed: str
    queue: str
    channel: str

    @classmethod
    def of(cls, prefix: str, name: str) -> SemKeys:
        keys = Keys(prefix, name)
        return cls(sem=keys.sub("sem"), handed=keys.sub("sem:x"), queue=keys.sub("sem:q"),
                   channel=keys.sub("sem:wake"))

    @property
    def acquire(self) -> Tuple[str, str, str]:
        """KEYS of ``sem_acquire``."""
        return (self.sem, self.queue, self.channel)

    @property
    def release(self) -> Tuple[str, str, str, str]:
        """KEYS of ``sem_release``."""
        return (self.sem, self.handed, self.queue, self.channel)

    @property
    def renew(self) -> Tuple[str, str]:
        """KEYS of ``sem_renew``."""
        return (self.sem, self.handed)


@dataclass(frozen=True)
class EventKeys:
    """Every key and channel of one DistEvent.

    - ``flag``: string ``"1"``; it exists exactly while the event is set. An Event is state:
      a set event stays set in Redis, for good, until ``clear()``.
    - ``waiters``: sorted set, waiter id -> entry deadline (server ms). ``set()`` moves every
      live entry to ``taken`` and names those waiters in one hint: the event was set while they
      waited, even if it was cleared since.
    - ``taken``: sorted set, waiter id -> entry deadline: the entries a ``set()`` took, until
      each waiter has looked (a woken waiter's look takes its own out). A waiter whose entry is
      gone returns True only when it finds itself here, so a restart that lost the data is
      never taken for a ``set()``. Gone once the waiters looked, or their deadlines passed.
    - ``channel``: hints ``=id1,id2,...`` naming the waiters a ``set()`` took (``*`` when too
      many to name).
    """

    flag: str
    waiters: str
    channel: str
    taken: str

    @classmethod
    def of(cls, prefix: str, name: str) -> EventKeys:
        keys = Keys(prefix, name)
        return cls(flag=keys.sub("ev"), waiters=keys.sub("ev:w"), channel=keys.sub("ev:wake"),
                   taken=keys.sub("ev:t"))


@dataclass(frozen=True)
class BarrierKeys:
    """Every key and channel of one DistBarrier.

    - ``state``: hash, ``p`` -> parties, ``g`` -> the current generation (strictly increasing,
      floored by the server clock in µs), ``o`` -> the first generation this hash recorded,
      ``k`` -> until when (server ms) the parties released by the latest trip may look (their
      latest lease deadline), ``b`` -> ``"1"`` while broken, and while the last party of a
      generation runs the action: ``a`` -> that generation, ``ad`` -> the runner's lease
      deadline (server ms), ``ar`` -> the runner's id. A party whose generation is no longer
      the current one learns that it tripped from this hash: it ended after ``o`` and is not
      among the broken ones. So the hash lives for good while broken (until ``reset()``), as
      long as the leases in it while parties wait, at rest until ``k`` (without ``p``: at rest
      the number of parties is forgotten), and then not at all. A party that finds no hash
      that knows its generation (the server lost its data, or every lease in it ran out before
      it looked) does not take that for a trip: its generation broke.
    - ``waiters``: sorted set, waiter id -> lease deadline (server ms): the parties of the current
      generation that arrived and wait. A party's index is the size of this set when it
      arrived. A lease that runs out (the party's process died) breaks the barrier.
    - ``broken``: sorted set, generation -> when the record goes (server ms): generations that
      ended broken (timeout, abort, reset, an action that raised, a dead party). A generation
      that ended and is not here tripped.
    - ``channel``: hints ``=id1,...`` naming the parties a trip released (they return at
      once), and ``*`` when the barrier breaks (every waiter looks).
    """

    state: str
    waiters: str
    broken: str
    channel: str

    @classmethod
    def of(cls, prefix: str, name: str) -> BarrierKeys:
        keys = Keys(prefix, name)
        return cls(state=keys.sub("bar"), waiters=keys.sub("bar:w"), broken=keys.sub("bar:x"),
                   channel=keys.sub("bar:wake"))

    @property
    def all(self) -> Tuple[str, str, str, str]:
        """The keys in the order every ``bar_*`` script takes them."""
        return (self.state, self.waiters, self.broken, self.channel)


# --- argument checks ------------------------------------------------------------------------

#: The largest count a semaphore keeps: Redis scores and Lua numbers are doubles, exact up to
#: 2**53, and a larger count would overflow the scripts' integer replies.
MAX_PERMITS = 2 ** 53 - 1


def check_sem_value(value: object) -> int:
    """A semaphore's initial value: ``threading``'s check first (``value < 0`` raises
    ValueError, a value that cannot be compared raises its TypeError), then it must be an
    integer: a count of permits kept in Redis (``threading`` would take 2.5; distlock raises
    TypeError), at most ``MAX_PERMITS`` (OverflowError)."""
    if value < 0:  # type: ignore[operator]  # TypeError for non-numbers, as threading
        raise ValueError("semaphore initial value must be >= 0")
    count = operator.index(value)  # type: ignore[arg-type]
    if count > MAX_PERMITS:
        raise OverflowError(f"semaphore initial value must be at most 2**53 - 1, not {count}")
    return count


def check_sem_acquire_args(blocking: object, timeout: object) -> Tuple[bool, Optional[float]]:
    """``Semaphore.acquire(blocking, timeout)`` read as :mod:`threading` reads it.

    Return ``(blocking, seconds)``: seconds None waits for ever, 0.0 tries once.

    - ``blocking`` false with a timeout: ValueError, threading's wording;
    - a timeout threading cannot wait on raises what threading raises when it waits: TypeError
      (from ``time + timeout`` or ``timeout > 0``), OverflowError (CPython's lock code). distlock
      checks it at once, even when a permit is free; threading only when it has to wait;
    - zero or negative: one try, no wait, as threading;
    - NaN: ValueError from CPython's lock code (threading itself would spin for ever).
    """
    if not blocking and timeout is not None:
        raise ValueError("can't specify timeout for non-blocking acquire")
    if not blocking:
        return False, 0.0
    if timeout is None:
        return True, None
    return True, _wait_seconds(timeout)


def _wait_seconds(timeout: object) -> float:
    """The checks ``threading`` makes on a timeout before it waits, in its order."""
    0.0 + timeout  # type: ignore[operator]  # TypeError as threading's ``_time() + timeout``
    if isinstance(timeout, float) and math.isnan(timeout):
        _probe(timeout)  # ValueError: "Invalid value NaN (not a number)"
    if not timeout > 0:  # type: ignore[operator]  # TypeError for complex, as Condition.wait
        return 0.0
    _probe(timeout)  # OverflowError for a timeout no lock can wait on
    return float(timeout)  # type: ignore[arg-type]


def _probe(timeout: object) -> None:
    probe = _thread.allocate_lock()  # free: acquire() only parses its arguments and returns
    probe.acquire(True, timeout)  # type: ignore[arg-type]
    probe.release()


def check_release_n(n: object) -> int:
    """``release(n)``: threading's ``n < 1`` check and wording, then an integer (threading
    fails on a fraction too, after raising the count; distlock raises before changing
    anything)."""
    if n < 1:  # type: ignore[operator]
        raise ValueError("n must be one or more")
    count = operator.index(n)  # type: ignore[arg-type]
    if count > MAX_PERMITS:
        raise OverflowError(f"n must be at most 2**53 - 1, not {count}")
    return count


def check_parties(parties: object) -> int:
    """A barrier's parties: an integer, at least 1 (``threading`` checks neither before Python
    3.13; a barrier of 0 parties would never trip)."""
    count = operator.index(parties)  # type: ignore[arg-type]
    if count < 1:
        raise ValueError("parties must be >= 1")
    return int(count)


def check_barrier_timeout(timeout: object) -> Optional[float]:
    """A barrier's timeout: None (wait for ever), or seconds; zero or negative breaks the
    barrier at once unless the caller is the last party, as in ``threading``. The errors are
    the ones threading raises when it waits: TypeError, OverflowError; NaN raises ValueError
    (threading would spin for ever)."""
    if timeout is None:
        return None
    return _wait_seconds(timeout)


def check_action(action: object) -> None:
    if action is not None and not callable(action):
        raise TypeError(f"action must be callable or None, not {type(action).__name__}")


# --- ids and leases -------------------------------------------------------------------------

_sequence = itertools.count(1)


def permit_id(session_id: str, thread_ident: int) -> str:
    """A fresh id for one acquire: ``<session>:<thread>:<n>``. The thread part lets
    ``release()`` give back the calling thread's permits first."""
    return f"{session_id}:{thread_ident}:{next(_sequence)}"


def entry_ms(wait_cap: float, queue_cap_factor: float) -> int:
    """The lease of a waiter's entry (semaphore queue, event waiters), refreshed at every look.

    A waiter looks at least every ``wait_cap * queue_cap_factor`` seconds (the longest sleep of
    a waiter that is not the first of its process); twice that plus a second covers a missed
    beat and a slow round trip. A waiter that died stops counting that long after its last look.
    """
    return lease_ms(2.0 * wait_cap * queue_cap_factor + 1.0)


def broken_keep_ms(lease: float, wait_cap: float, queue_cap_factor: float) -> int:
    """How long a barrier remembers that a generation broke: far longer than any of its waiters
    can go without looking (a waiter that cannot look that long has lost its lease too)."""
    return lease_ms(max(10.0 * lease, 4.0 * wait_cap * queue_cap_factor, 60.0))


# --- reply codes ----------------------------------------------------------------------------

#: sem_acquire: the semaphore is in use with another value (nothing changed)
SEM_MISMATCH = 0
#: sem_release: a bounded semaphore would go above its value (nothing changed)
REL_TOO_MANY = -1
#: sem_release: the semaphore is in use with another value (nothing changed)
REL_MISMATCH = -2
#: sem_release: the count would go above ``MAX_PERMITS`` (nothing changed)
REL_OVERFLOW = -3

TOO_MANY_RELEASES = "Semaphore released too many times"
COUNT_OVERFLOW = ("semaphore count would go above 2**53 - 1, the largest count Redis keeps "
                  "exactly")


def release_lost(lost: int, name: str) -> str:
    return (f"{lost} of the permits released on semaphore {name!r} had been lost (their lease "
            "ran out) and had come back already; the rest of the release was done")


def value_mismatch(name: str, stored: object, ours: int) -> str:
    return (f"semaphore {name!r} was created with value {stored}, not {ours}: every process "
            "must give a semaphore the same value")


def parties_mismatch(name: str, stored: object, ours: int) -> str:
    return (f"barrier {name!r} was created with parties={stored}, not {ours}: every party "
            "must give a barrier the same number of parties")


#: ev_wait: the event is set
EV_SET = -1
#: ev_wait: a set() took this waiter's entry: the event was set while it waited
EV_TAKEN = -2
#: ev_wait: the entry ran out before anyone took it; the waiter must join again
EV_EXPIRED = -3

#: bar_wait / bar_poll codes (first element of the reply)
BAR_WAITING = 0
BAR_TRIPPED = 1
BAR_RUN = 2
BAR_PENDING = 3
BAR_BROKEN = -1
BAR_BUSY = -2
BAR_MISMATCH = -3


# --- reprs ----------------------------------------------------------------------------------

def sem_repr(obj: object, kind: str, name: str, value: int, initial: Optional[int]) -> str:
    """``<distlock.DistSemaphore at 0x…: value=2 name='pool'>``: threading's shape, plus the
    name; ``value=2/3`` for a bounded one. The value is the count of free permits as of this
    object's last round trip (a repr does no I/O)."""
    shown = f"{value}/{initial}" if initial is not None else f"{value}"
    return f"<distlock.{kind} at {id(obj):#x}: value={shown} name={name!r}>"


def event_repr(obj: object, name: str, flag: bool) -> str:
    """``<distlock.DistEvent at 0x…: set name='ready'>``, as of the last round trip."""
    return f"<distlock.DistEvent at {id(obj):#x}: {'set' if flag else 'unset'} name={name!r}>"


def barrier_repr(obj: object, name: str, broken: bool, waiting: int, parties: int) -> str:
    """``<distlock.DistBarrier at 0x…: waiters=1/3 name='b'>`` or ``…: broken name='b'>``."""
    state = "broken" if broken else f"waiters={waiting}/{parties}"
    return f"<distlock.DistBarrier at {id(obj):#x}: {state} name={name!r}>"
