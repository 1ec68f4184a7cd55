"""In-process metrics: counters and histograms per primitive kind and name group. No I/O.

Every primitive object has a ``Meter`` (made on first use): its kind (``lock``, ``rlock``,
``read``, ``write``, ``semaphore``, ``bounded_semaphore``, ``condition``, ``event``,
``barrier``), its name, and the ``Series`` of its (kind, group), where the group is
``Settings.metric_group(name)`` (default: the name's first ``:``-separated segment). Names are
unbounded (``orders:<id>``), groups are not: at most ``MAX_GROUPS`` distinct groups per
process, further ones are counted under ``other``. No label holds a raw name unless the user's
function returns it.

What is recorded, and where:

- ``acquire``: every acquire or wait, by outcome (``acquired``, ``timeout``, ``refused``: a
  non-blocking try that was refused, ``error``), with the time from its first try to the
  grant or the give-up (``wait_seconds``); ``waited``: those that had to wait; ``hinted``:
  grants won by a try that answered a pub/sub hint (a hand-off);
- ``hold_seconds``: from a grant to its end (a release, or the hold found lost);
- ``lost``: leases found lost;
- ``renewals`` and ``renew_failures``, and ``renew_seconds``: the watchdog's batched round
  trip, once per series per round.

``snapshot()`` (``distlock.metrics()``) returns all of it as plain data; see
docs/guides/operating.rst for every field. ``distlock.prometheus`` exposes the same figures.
"""

from __future__ import annotations

import bisect
import threading
from typing import Any, Callable, Dict, List, Optional, Tuple

__all__ = ["Meter", "Series", "Histogram", "meter", "snapshot", "reset", "default_group",
           "OUTCOMES", "WAIT_BUCKETS", "HOLD_BUCKETS", "RENEW_BUCKETS", "MAX_GROUPS", "OTHER"]

OUTCOMES = ("acquired", "timeout", "refused", "error")

#: Histogram bucket upper bounds, in seconds (a last, infinite bucket is implied).
WAIT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
                30.0, 60.0)
HOLD_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 1800.0,
                3600.0)
RENEW_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)

#: How many distinct groups one process keeps apart; the rest share ``OTHER``.
MAX_GROUPS = 100
OTHER = "other"


def default_group(name: str) -> str:
    """The name's first ``:``-separated segment: ``orders:42`` -> ``orders``."""
    return name.split(":", 1)[0]


class Histogram:
    """Counts per bucket (not cumulative; the last one is +Inf), their sum and count."""

    __slots__ = ("bounds", "counts", "sum", "count")

    def __init__(self, bounds: Tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.sum += value
        self.count += 1

    def data(self) -> Dict[str, Any]:
        return {"buckets": list(self.bounds) + [float("inf")], "counts": list(self.counts),
                "sum": self.sum, "count": self.count}


class Series:
    """The figures of one (kind, group). Updated under its own lock: threads of one process
    record into the same series."""

    __slots__ = ("kind", "group", "lock", "acquire", "waited", "hinted", "lost", "renewals",
                 "renew_failures", "wait", "hold", "renew")

    def __init__(self, kind: str, group: str) -> None:
        self.kind = kind
        self.group = group
        self.lock = threading.Lock()
        self.acquire = dict.fromkeys(OUTCOMES, 0)
        self.waited = 0
        self.hinted = 0
        self.lost = 0
        self.renewals = 0
        self.renew_failures = 0
        self.wait = Histogram(WAIT_BUCKETS)
        self.hold = Histogram(HOLD_BUCKETS)
        self.renew = Histogram(RENEW_BUCKETS)

    def data(self) -> Dict[str, Any]:
        with self.lock:
            return {
                "kind": self.kind, "group": self.group, "acquire": dict(self.acquire),
                "waited": self.waited, "hinted": self.hinted, "lost": self.lost,
                "renewals": self.renewals, "renew_failures": self.renew_failures,
                "wait_seconds": self.wait.data(), "hold_seconds": self.hold.data(),
                "renew_seconds": self.renew.data(),
            }


class Meter:
    """What one primitive object records through: its kind, its name, its series (and the
    grouping rule it was made with)."""

    __slots__ = ("kind", "name", "series", "rule")

    def __init__(self, kind: str, name: str, series: Series, rule: Any = None) -> None:
        self.kind = kind
        self.name = name
        self.series = series
        self.rule = rule

    def acquired(self, outcome: str, seconds: float, waited: bool = False, hinted: bool = False) -> None:
        """One acquire or wait ended with ``outcome`` after ``seconds`` from its first try."""
        series = self.series
        wait = series.wait
        with series.lock:  # Histogram.observe, inline: this runs on every acquire
            series.acquire[outcome] += 1
            wait.counts[bisect.bisect_left(wait.bounds, seconds)] += 1
            wait.sum += seconds
            wait.count += 1
            if waited:
                series.waited += 1
            if hinted:
                series.hinted += 1

    def held(self, seconds: float) -> None:
        hold = self.series.hold
        with self.series.lock:  # Histogram.observe, inline: this runs on every release
            hold.counts[bisect.bisect_left(hold.bounds, seconds)] += 1
            hold.sum += seconds
            hold.count += 1

    def lost(self) -> None:
        series = self.series
        with series.lock:
            series.lost += 1


def renewed(tally: Dict[Any, List[int]], seconds: Optional[float]) -> None:
    """A watchdog round's renewals: per series (None: a hold without one), ``[renewed,
    failed]``; its round trip took ``seconds`` (None when it never came back)."""
    for series, (ok, failed) in tally.items():
        if series is None:
            continue
        with series.lock:
            series.renewals += ok
            series.renew_failures += failed
            if seconds is not None:
                series.renew.observe(seconds)


# --- the registry ----------------------------------------------------------------------------

_lock = threading.Lock()
_series: Dict[Tuple[str, str], Series] = {}
_groups: Dict[str, str] = {}  # what each group a rule returned is counted as (itself, or OTHER)


def meter(kind: str, name: str, rule: Optional[Callable[[str], str]]) -> Meter:
    """The meter of a primitive of ``kind`` and ``name``, grouped by ``rule`` (None: the
    default). A rule that raises or returns something other than a str counts as ``other``."""
    try:
        group = default_group(name) if rule is None else rule(name)
        if not isinstance(group, str):
            group = OTHER
    except Exception:  # noqa: BLE001 - a user's rule must never break an acquire
        group = OTHER
    with _lock:
        counted = _groups.get(group)
        if counted is None:
            counted = group if len(_groups) < MAX_GROUPS else OTHER
            if counted == group:
                _groups[group] = group
        key = (kind, counted)
        series = _series.get(key)
        if series is None:
            series = _series[key] = Series(kind, counted)
    return Meter(kind, name, series, rule)


def all_series() -> List[Series]:
    with _lock:
        return list(_series.values())


def snapshot() -> Dict[str, Any]:
    """Return this process' distlock metrics as plain data (``distlock.metrics()``).

    ``{"series": [...], "groups": n, "max_groups": 100}``: one series per primitive kind and
    name group, with its counters and histograms; docs/guides/operating.rst describes every
    field. The figures are copied: later activity does not change the returned dicts."""
    series = all_series()
    with _lock:
        groups = len(_groups)
    return {"series": [s.data() for s in series], "groups": groups, "max_groups": MAX_GROUPS}


def reset() -> None:
    """Forget every figure (tests; a process that wants to start counting afresh). Meters
    made before keep counting into series that are no longer reported: make primitives anew."""
    with _lock:
        _series.clear()
        _groups.clear()
