"""Replica-acknowledged grants (``min_replicas``): the checks and the arithmetic, without I/O.

A lock or a semaphore made with ``min_replicas=k`` (k >= 1) sends each grant's script with a
``WAIT k timeout_ms`` behind it, on the same connection, in one write (the executor's ``run``
with ``acks``): the grant counts only once k replicas have acknowledged it. What is here:

- the checks of ``min_replicas`` and ``replica_timeout`` (constructors and ``configure()``),
  and the TypeError of the primitives that take neither;
- ``Acks``: what one primitive asks for, resolved against ``configure()``'s defaults;
- what a grant's reply and its acknowledgement count mean (``short_of``), and the error;
- the watchdog's share: one ``WAIT`` for a whole batch of renewals (``batch_wait``), and
  which holds it counts for (``renewal_counts``).

Re-entries (a DistRLock's count going up) create no grant and send no WAIT; releases are sent
as they are, never undone and never waited for (see docs/guides/replicas.rst).
"""

from __future__ import annotations

import math
from typing import Any, Callable, Iterable, Optional, Tuple

from .errors import NotEnoughReplicasError
from .flow import Flow

__all__ = ["Acks", "check_min_replicas", "check_replica_timeout", "acks_for", "refuse_options",
           "refuse_quorum", "short_of", "not_enough", "batch_wait", "renewal_counts", "check_options",
           "give_back_unacked",
           "DEFAULT_REPLICA_TIMEOUT", "MAX_REPLICAS"]

#: ``replica_timeout``'s default (seconds). A healthy replica acknowledges a write within a
#: network round trip (well under a millisecond on a LAN, a few across zones), so the timeout
#: only matters when a replica is missing or stalled: it is then what a grant that cannot be
#: acknowledged costs before it is given back. Half a second rides out a replica's short stall
#: (a fork for a snapshot, a busy moment) without making a failing acquire slow.
DEFAULT_REPLICA_TIMEOUT = 0.5

#: The largest ``min_replicas`` accepted: far beyond any real replica set, and a bound for a
#: number that goes to Redis as an argument.
MAX_REPLICAS = 1000

#: (k, timeout in ms): what one grant asks the server to wait for; None when k is 0
Acks = Optional[Tuple[int, int]]


def check_min_replicas(value: object) -> int:
    """Return ``value`` as a count of replicas (an int, 0 up to ``MAX_REPLICAS``), or raise
    TypeError (not an int, or a bool) / ValueError (negative, too many)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"min_replicas must be an int, not {type(value).__name__}")
    if value < 0:
        raise ValueError("min_replicas must be >= 0")
    if value > MAX_REPLICAS:
        raise ValueError(f"min_replicas must be <= {MAX_REPLICAS}")
    return value


def check_replica_timeout(value: object) -> float:
    """Return ``value`` as a positive, finite number of seconds (at most an hour), or raise
    TypeError / ValueError."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"replica_timeout must be a number of seconds, not {type(value).__name__}")
    seconds = float(value) if not isinstance(value, int) or abs(value) < 10 ** 9 else 1e9
    if math.isnan(seconds):
        raise ValueError("replica_timeout must not be NaN")
    if seconds <= 0 or math.isinf(seconds) or seconds > 3600:
        raise ValueError("replica_timeout must be a positive number of seconds, at most 3600")
    return seconds


def check_options(min_replicas: object, replica_timeout: object) -> Tuple[Optional[int], Optional[float]]:
    """A constructor's two options, checked; None stands for ``configure()``'s default."""
    k = None if min_replicas is None else check_min_replicas(min_replicas)
    timeout = None if replica_timeout is None else check_replica_timeout(replica_timeout)
    return k, timeout


def acks_for(min_replicas: Optional[int], replica_timeout: Optional[float], settings: Any) -> Acks:
    """What a grant asks for: (k, timeout ms), or None when k is 0 (then nothing is waited for,
    and nothing is sent: the uncontended path is unchanged). ``settings``: ``configure()``'s."""
    k = settings.min_replicas if min_replicas is None else min_replicas
    if not k:
        return None
    timeout = settings.replica_timeout if replica_timeout is None else replica_timeout
    return k, max(1, int(timeout * 1000))  # WAIT's 0 would wait for ever


def refuse_options(kind: str, min_replicas: object, replica_timeout: object) -> None:
    """TypeError for a primitive that grants nothing replicas could acknowledge (an event, a
    condition, a barrier) when it is given either option."""
    for name, value in (("min_replicas", min_replicas), ("replica_timeout", replica_timeout)):
        if value is not None:
            raise TypeError(
                f"{kind}() takes no {name}: only locks and semaphores grant holds that replicas "
                "acknowledge (a condition waits on its lock's: give the lock min_replicas)")


def refuse_quorum(quorum: bool, min_replicas: Optional[int]) -> None:
    """TypeError for ``min_replicas`` with a Redlock quorum (a list of independent masters):
    the masters have no replicas to wait for; the quorum is its own answer to a master's
    loss. ``quorum``: the primitive's client is one (``distlock._redis.topology``); see
    docs/guides/replicas.rst."""
    if min_replicas and quorum:
        raise TypeError("min_replicas does not apply to a Redlock quorum (a list of masters): "
                        "use one or the other")


def short_of(acks: Tuple[int, int], acknowledged: Any) -> Optional[int]:
    """How many replicas acknowledged a grant (WAIT's reply), when that is fewer than asked
    for; None when enough did. A reply that is not a count (an error) counts as none."""
    try:
        got = int(acknowledged)
    except (TypeError, ValueError):
        got = 0
    return got if got < acks[0] else None


def not_enough(name: str, acknowledged: int, required: int) -> NotEnoughReplicasError:
    """The error of a grant given back for want of acknowledgements."""
    return NotEnoughReplicasError(
        f"{name!r}: {acknowledged} of {required} replicas acknowledged the grant",
        acknowledged=acknowledged, required=required)


def batch_wait(wanted: Iterable[Acks], renew_interval: float) -> Acks:
    """The one ``WAIT`` at the end of a batch of renewals: the most replicas any hold in it
    asks for, and the longest timeout, at most half the renew interval (the watchdog's
    connection times out after one interval). None when no hold asks for any."""
    most = longest = 0
    for acks in wanted:
        if acks is not None:
            most = max(most, acks[0])
            longest = max(longest, acks[1])
    if not most:
        return None
    return most, max(1, min(longest, int(renew_interval * 500)))


def renewal_counts(acks: Acks, acknowledged: Any) -> bool:
    """Whether a renewal counts for a hold that asks for ``acks`` when the batch's WAIT
    answered ``acknowledged`` (None: there was no WAIT)."""
    if acks is None:
        return True
    return short_of(acks, acknowledged) is None


def give_back_unacked(name: str, acks: Tuple[int, int], acknowledged: Any,
                      undo: Callable[[], Flow[None]]) -> Flow[None]:
    """After a grant sent with ``acks``: when too few replicas acknowledged it, give it back
    (``undo``: the primitive's lost-grant path, which reads what the server holds before it
    releases anything, so a reply lost on the way is never a release sent blind) and raise
    NotEnoughReplicasError. Nothing happens when enough did."""
    got = short_of(acks, acknowledged)
    if got is None:
        return
    yield from undo()
    raise not_enough(name, got, acks[0])
