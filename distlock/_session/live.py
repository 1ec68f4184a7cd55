"""``distlock.metrics()``: the figures of ``metrics`` with the live holds of this process, read
from the sessions' registries when asked (nothing is recorded on the acquire path for them).
"""

from __future__ import annotations

import time
from typing import Any, Dict, List

from .metrics import snapshot
from .session import all_sessions

__all__ = ["metrics", "live_holds"]


def live_holds() -> List[Dict[str, Any]]:
    """The grants this process holds now (a lock's or a read/write lock side's hold, a
    semaphore's permit; not a waiter's lease), oldest first: ``kind``, ``group``, ``name``,
    ``token`` (a permit's is 0), ``age`` (seconds since its grant was sent) and ``believed``
    (False once it is lost or past its local deadline or cap, until the holder releases it).
    No I/O."""
    now = time.monotonic()
    holds: List[Dict[str, Any]] = []
    for session in all_sessions():
        for hold in list(session.holds.values()):
            meter, granted_at = hold.meter, hold.granted_at
            if meter is None or not granted_at:
                continue
            believed = (not hold.lost and not hold.suspended
                        and now < hold.ends_at())
            holds.append({"kind": meter.kind, "group": meter.series.group, "name": meter.name,
                          "token": hold.token, "age": max(0.0, now - granted_at),
                          "believed": believed})
    holds.sort(key=lambda h: h["age"], reverse=True)
    return holds


def metrics() -> Dict[str, Any]:
    """Return this process' distlock metrics as plain data (``distlock.metrics()``):
    ``metrics.snapshot()`` (``series``, ``groups``, ``max_groups``) and ``holds``
    (``live_holds()``). docs/guides/operating.rst describes every field."""
    data = snapshot()
    data["holds"] = live_holds()
    return data
