"""Even shares for the default locks: the yield rule's bookkeeping, with no I/O.

A default (not fair) DistLock or DistRLock lets a releasing process take the lock straight
back (barging): a re-take costs one round trip, where handing the lock to a waiter in another
process costs a pub/sub hop and a round trip there. Barging alone starves waiters. The yield
rule keeps most of its speed and shares the lock out evenly:

- a process that got the lock by waiting for it starts a *quantum*: ``barge_limit``
  (``Settings.barge_limit``, L) over the number of processes taking turns (n; the yielding
  release counts them and tells the process it yields to: a ``y<n>`` hint). Within it, its
  releases free the lock without waking anyone (``lock_release`` with KEEP): it is about to
  take the lock again, and a woken waiter would only lose that race. If it has not tried to
  take the lock again ``NUDGE_AFTER`` after such a release, its watchdog thread wakes the
  next waiting process then (``lock_nudge``);
- once its quantum is over (or if it never waited), its release yields (YIELD): the lock is
  kept for the longest-registered waiting process for a moment, and only that process is told
  (``free_hold`` in ``lua/_prelude.lua``). That process' quantum starts when it takes it.

So a round of all n processes lasts about L (plus n hand-offs): a waiter is passed over
for about L at most, whatever n, and each process gets an even share of every round.

This module keeps each process' quanta (``Runs``, one per session, keyed by lock key); the
clock is ``time.monotonic()``, read by this process only.
"""

from __future__ import annotations

from typing import Dict, List, Optional

__all__ = ["Runs", "KEEP", "YIELD", "NUDGE_AFTER", "quantum"]

#: lock_release's ARGV[4]: free without waking anyone (in a quantum), or yield (after one)
KEEP, YIELD = "k", "y"

#: how long after a release in its quantum a process that has not tried to take the lock again
#: wakes the next waiting process (seconds): much longer than a loop's turn back to acquire(),
#: short against the hop a woken waiter then needs
NUDGE_AFTER = 0.001

#: the number of processes taking turns assumed when a process got the lock without a
#: ``y<n>`` hint (a nudge, or a bounded re-check, woke it)
TURNS = 2

#: a process keeps the quanta of this many names at most (see ``Runs.start``)
MOST = 256

# the fields of one name's entry in ``Runs``
_END, _EPOCH, _RELEASED_EPOCH, _RELEASED_AT, _PENDING = range(5)


def quantum(limit: float, turns: int) -> float:
    """A process' quantum: ``limit`` (barge_limit) shared by ``turns`` processes (0: unknown)."""
    return limit / (turns or TURNS)


class Runs:
    """This process' quanta, per lock key: when its quantum ends, how many times it has tried
    to take the lock (its *epoch*), and its last release in a quantum (for ``nudge``)."""

    __slots__ = ("_runs",)

    def __init__(self) -> None:
        self._runs: Dict[str, List[float]] = {}

    def start(self, key: str, now: float, quantum: float) -> None:
        """A wait for ``key`` was granted at ``now``: a quantum starts (see ``quantum``).
        Entries long past mean nothing any more; they are dropped when the table is full, so
        that it stays small whatever the number of names."""
        runs = self._runs
        if len(runs) >= MOST and key not in runs:
            for old in [k for k, run in runs.items() if now - run[_END] >= 1.0 and not run[_PENDING]]:
                del runs[old]
            if len(runs) >= MOST:
                runs.clear()
        end = now + quantum
        run = runs.get(key)
        if run is None:
            runs[key] = [end, 0.0, -1.0, 0.0, 0.0]
        else:
            run[_END] = end

    def keeps(self, key: str, now: float) -> bool:
        """Is this process in its quantum for ``key``: may its release keep the lock to itself?"""
        run = self._runs.get(key)
        return run is not None and now < run[_END]

    def touch(self, key: str) -> None:
        """This process tries to take ``key`` (a first try): a new epoch."""
        run = self._runs.get(key)
        if run is not None:
            run[_EPOCH] += 1

    def released(self, key: str, now: float) -> bool:
        """This process released ``key`` in its quantum at ``now``, waking nobody. True when a
        ``nudge`` must be scheduled (none is pending)."""
        run = self._runs[key]
        run[_RELEASED_EPOCH] = run[_EPOCH]
        run[_RELEASED_AT] = now
        if run[_PENDING]:
            return False
        run[_PENDING] = 1.0
        return True

    def nudge(self, key: str, now: float) -> Optional[float]:
        """A scheduled nudge is due: 0 to wake a waiter now; the time to look again (a later
        release moved it); None when this process has tried to take the lock since."""
        run = self._runs.get(key)
        if run is None:
            return None
        run[_PENDING] = 0.0
        if run[_EPOCH] != run[_RELEASED_EPOCH]:
            return None
        due = run[_RELEASED_AT] + NUDGE_AFTER
        if now < due:
            run[_PENDING] = 1.0
            return due
        return 0.0

    def __len__(self) -> int:
        return len(self._runs)
