"""The process-wide settings (``configure()``'s tunables): what they are, their checks, and the
one place they change. No I/O; the default client is ``_session.config``'s."""

from __future__ import annotations

import math
import os
import threading
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Dict, Optional

from .checks import check_max_hold, check_retention, check_seconds
from .replicas import DEFAULT_REPLICA_TIMEOUT, check_min_replicas, check_replica_timeout

#: ``Settings.barge_limit``'s default, seconds: see docs/guides/locks.rst, "Even shares"
DEFAULT_BARGE_LIMIT = 0.05


@dataclass(frozen=True)
class Settings:
    """Tunables shared by every primitive of this process.

    - ``prefix``: the start of every key and channel (``distlock:``).
    - ``lease``: the internal lease of watchdog holds, in seconds (30).
    - ``renew_interval``: how often the watchdog renews those holds, in seconds (10); must be
      shorter than ``lease``.
    - ``wait_cap``: the longest a waiter at the head of its process' queue sleeps before it
      tries again, whatever pub/sub says (3 s). Other waiters of the same lock in the same
      process sleep at most ``wait_cap * queue_cap_factor``.
    - ``fence_retention``: how long a name's fencing-token counter outlives its last hold, at
      least, in seconds (3600; at most one lease more); 0: it lives at most as long as the
      last hold's lease (a release does not shorten it). See docs/safety.rst.
    - ``metric_group``: how a name is grouped in the metrics (``distlock.metrics()``): a
      function of the name returning a short label; None (the default) takes the name's
      first ``:``-separated segment (``orders:42`` -> ``orders``). See docs/guides/operating.rst.
    - ``min_replicas``: how many replicas must acknowledge a grant of a lock or a semaphore
      made without its own ``min_replicas`` (0: none, nothing is waited for); and
      ``replica_timeout``: how long a grant waits for them, in seconds (0.5). See
      docs/guides/replicas.rst.
    - ``barge_limit``: about how long one round of the processes contending for a default
      (not fair) DistLock or DistRLock lasts, in seconds (0.05): each process that got the lock
      by waiting keeps it for this over the number of processes taking turns, then yields it to
      the one that has waited longest; 0: it yields at every contended release; ``math.inf``:
      never (pure barging). See docs/guides/locks.rst, "Even shares under contention".
    - ``max_hold``: the longest any hold may be kept, in seconds, for primitives made without
      their own ``max_hold`` (``math.inf``, the default: no cap). At the cap the hold is given
      back and reported lost. See docs/guides/bound.rst.
    """

    prefix: str = "distlock:"
    lease: float = 30.0
    renew_interval: float = 10.0
    wait_cap: float = 3.0
    queue_cap_factor: float = 10.0
    fence_retention: float = 3600.0
    metric_group: Optional[Callable[[str], str]] = field(default=None, compare=False)
    min_replicas: int = 0
    replica_timeout: float = DEFAULT_REPLICA_TIMEOUT
    barge_limit: float = DEFAULT_BARGE_LIMIT
    max_hold: float = math.inf
    #: Redlock (``client=[...]``): the clock drift allowed per hold, in seconds; None: 1% of
    #: the lease plus 2 ms (see ``_core.quorum.drift``)
    redlock_drift: Optional[float] = None
    #: ``fence_retention`` in ms, as the scripts take it (computed once, not per call)
    fence_retention_ms: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "fence_retention_ms", int(self.fence_retention * 1000))


_lock = threading.Lock()
_settings = Settings()


def settings() -> Settings:
    return _settings


def reset_settings() -> None:
    """Back to the defaults (the default client is left as it is); for tests."""
    global _settings
    with _lock:
        _settings = Settings()


def check_barge_limit(value: object) -> float:
    """``configure(barge_limit=)``: seconds, zero or more; ``math.inf`` turns the rule off."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"barge_limit must be a number of seconds, not {type(value).__name__}")
    seconds = float(value)
    if math.isnan(seconds) or seconds < 0:
        raise ValueError("barge_limit must be zero or more seconds (math.inf: never)")
    return seconds


def check_drift(value: object) -> float:
    """``configure(redlock_drift=)``: seconds, zero or more."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value == 0:
        return 0.0
    return check_seconds(value, "redlock_drift")


def changed(
    prefix: Optional[str] = None,
    lease: Optional[float] = None,
    renew_interval: Optional[float] = None,
    wait_cap: Optional[float] = None,
    fence_retention: Optional[float] = None,
    metric_group: Optional[Callable[[str], str]] = None,
    min_replicas: Optional[int] = None,
    replica_timeout: Optional[float] = None,
    redlock_drift: Optional[float] = None,
    barge_limit: Optional[float] = None,
    max_hold: Optional[float] = None,
) -> Settings:
    """The settings in force with the given ones changed (``None``: unchanged), checked; nothing
    is installed (see ``install``). TypeError or ValueError on a bad value."""
    changes: Dict[str, Any] = {}
    if prefix is not None:
        if not isinstance(prefix, str):
            raise TypeError(f"prefix must be a str, not {type(prefix).__name__}")
        if "{" in prefix or "}" in prefix:
            raise ValueError("prefix must not contain '{' or '}': the name is the hash tag")
        changes["prefix"] = prefix
    if lease is not None:
        changes["lease"] = check_seconds(lease, "lease")
    if renew_interval is not None:
        changes["renew_interval"] = check_seconds(renew_interval, "renew_interval")
    if wait_cap is not None:
        changes["wait_cap"] = check_seconds(wait_cap, "wait_cap")
    if fence_retention is not None:
        changes["fence_retention"] = check_retention(fence_retention)
    if metric_group is not None:
        if not callable(metric_group):
            raise TypeError(f"metric_group must be callable, not {type(metric_group).__name__}")
        changes["metric_group"] = metric_group
    if min_replicas is not None:
        changes["min_replicas"] = check_min_replicas(min_replicas)
    if replica_timeout is not None:
        changes["replica_timeout"] = check_replica_timeout(replica_timeout)
    if redlock_drift is not None:
        changes["redlock_drift"] = check_drift(redlock_drift)
    if barge_limit is not None:
        changes["barge_limit"] = check_barge_limit(barge_limit)
    if max_hold is not None:
        changes["max_hold"] = check_max_hold(max_hold)
    new = replace(_settings, **changes)
    if new.renew_interval >= new.lease:
        raise ValueError("renew_interval must be shorter than lease")
    return new


def install(new: Settings) -> None:
    """Put ``new`` (from ``changed``) in force for the whole process."""
    global _settings
    with _lock:
        _settings = new


def _after_fork_in_child() -> None:
    global _lock
    _lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
