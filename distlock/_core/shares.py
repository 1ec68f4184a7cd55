"""Even shares for the default locks: the yield rule's bookkeeping, with no I/O.

A default (not fair) DistLock or DistRLock lets a releasing process take the lock straight
back (barging): a re-take costs one round trip, where handing the lock to a waiter in another
process costs a pub/sub hop and a round trip there. Barging alone starves waiters. The yield
rule keeps most of its speed and shares the lock out evenly:

- a process that got the lock by waiting for it, and that came straight back for the lock
  after its last release (within ``COMEBACK``: it loops), starts a *quantum*: ``barge_limit``
  (``Settings.barge_limit``, L) over the number of processes taking turns (n; the yielding
  release counts them and tells the process it yields to: a ``y<n>`` hint). Within it, its
  releases free the lock without waking anyone (``lock_release`` with KEEP): it is about to
  take the lock again, and a woken waiter would only lose that race. If it has not tried to
  take the lock again ``NUDGE_AFTER`` after such a release, its watchdog thread wakes the
  next waiting process then (``lock_nudge``);
- once its quantum is over (or if it never waited, or does not loop: a process that takes the
  lock once and goes, whose quantum would only make the next waiter wait for the nudge), its
  release yields (YIELD): the lock is
  kept for the longest-registered waiting process for a moment, and only that process is told
  (``free_hold`` in ``lua/_prelude.lua``). That process' quantum starts when it takes it.

So a round of all n processes lasts about L (plus n hand-offs): a waiter is passed over
for about L at most, whatever n, and each process gets an even share of every round.

This module keeps each process' quanta (``Runs``, one per session, keyed by lock key); the
clock is ``time.monotonic()``, read by this process only.
"""

from __future__ import annotations

import math
import threading
from typing import Dict, Optional

__all__ = ["Runs", "KEEP", "YIELD", "NUDGE_AFTER", "COMEBACK", "quantum"]

#: lock_release's ARGV[4]: free without waking anyone (in a quantum), or yield (after one)
KEEP, YIELD = "k", "y"

#: how long after a release in its quantum a process that has not tried to take the lock again
#: wakes the next waiting process (seconds): much longer than a loop's turn back to acquire(),
#: short against the hop a woken waiter then needs
NUDGE_AFTER = 0.001

#: a process that tries to take the lock again within this long after its release loops: its
#: next turn gets a quantum (seconds)
COMEBACK = 0.005

#: the number of processes taking turns assumed when a process got the lock without a
#: ``y<n>`` hint (a nudge, or a bounded re-check, woke it)
TURNS = 2

#: a process keeps the quanta of this many names at most (see ``Runs.start``)
MOST = 256

def quantum(limit: float, turns: int) -> float:
    """A process' quantum: ``limit`` (barge_limit) shared by ``turns`` processes (0: unknown)."""
    return limit / (turns or TURNS)


class _Run:
    """One lock's entry in ``Runs``."""

    __slots__ = ("end", "released_at", "tried", "pending", "loops")

    def __init__(self, now: float) -> None:
        self.end = now  #: when its quantum ends (now: a first turn has none)
        self.released_at = -math.inf  #: its last release
        self.tried = False  #: it tried to take the lock again since that release
        self.pending = False  #: a nudge is scheduled
        self.loops = False  #: it came straight back after its last release


class Runs:
    """This process' quanta, per lock key (``_Run``): when its quantum ends, its last release
    (for ``nudge``), whether it tried to take the lock since, and whether it came straight
    back after it (it loops).

    Threads share it: the user's (every method) and the watchdog's (``nudge``). ``start`` is
    the one method that changes the table, under a lock; the others look one entry up and set
    its fields. A release reads ``pending`` after it has set ``tried`` and ``released_at``,
    and ``nudge`` reads those after it has cleared ``pending``, so a release that finds a
    nudge pending (and schedules none) is always seen by that nudge."""

    __slots__ = ("_runs", "_lock")

    def __init__(self) -> None:
        self._runs: Dict[str, _Run] = {}
        self._lock = threading.Lock()

    def start(self, key: str, now: float, quantum: float) -> None:
        """A wait for ``key`` was granted at ``now``: a quantum of ``quantum`` seconds starts,
        if this process loops (none for a first turn: it is yet to show that it does).
        Entries long past mean nothing any more; they are dropped when the table is full, so
        that it stays small whatever the number of names, and so are all others if that is
        not enough, except those with a nudge pending (few, and gone in a moment: their nudge
        needs them)."""
        with self._lock:
            runs = self._runs
            if len(runs) >= MOST and key not in runs:
                for old in [k for k, run in runs.items() if now - run.end >= 1.0 and not run.pending]:
                    del runs[old]
                if len(runs) >= MOST:
                    for old in [k for k, run in runs.items() if not run.pending]:
                        del runs[old]
            run = runs.get(key)
            if run is None:
                runs[key] = _Run(now)
            else:
                run.end = now + quantum if run.loops else now

    def keeps(self, key: str, now: float) -> bool:
        """Is this process in its quantum for ``key``: may its release keep the lock to itself?"""
        run = self._runs.get(key)
        return run is not None and now < run.end

    def touch(self, key: str, now: float) -> None:
        """This process tries to take ``key`` at ``now`` (a first try); it loops if that is
        within ``COMEBACK`` of its last release."""
        run = self._runs.get(key)
        if run is not None:
            run.tried = True
            run.loops = now - run.released_at < COMEBACK

    def released(self, key: str, now: float, kept: bool) -> bool:
        """This process released ``key`` at ``now`` (``kept``: in its quantum, waking nobody).
        True when a ``nudge`` must be scheduled (kept, and none is pending)."""
        run = self._runs.get(key)
        if run is None:
            return False
        run.tried = False
        run.released_at = now
        if not kept or run.pending:
            return False
        run.pending = True
        return True

    def nudge(self, key: str, now: float) -> Optional[float]:
        """A scheduled nudge is due: 0 to wake a waiter now; the time to look again (a later
        release moved it); None when this process has tried to take the lock since."""
        run = self._runs.get(key)
        if run is None:
            return None
        run.pending = False
        if run.tried:
            return None
        due = run.released_at + NUDGE_AFTER
        if now < due:
            run.pending = True
            return due
        return 0.0

    def __len__(self) -> int:
        return len(self._runs)
