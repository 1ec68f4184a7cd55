"""A hold: what this process knows of one grant it was given, and how long it may believe it.

The belief rule (docs/design.rst, principle 14; docs/safety.rst): a hold's local deadline,
``expires_at``, is the monotonic time its last acknowledged grant or renewal was *sent*, plus
its lease, less the executor's clock margin (a Redlock quorum's drift). Past it, or once the
hold is ``lost`` or ``suspended`` (its server's connection was reset and no renewal has
confirmed it since), ``believed()`` is False and ``valid_for()`` is 0.0, whatever I/O is in
flight: no round trip is needed to stop believing. The watchdog fires ``on_lost`` at that
deadline (``watchdog``). A hold made with ``max_hold`` is also not believed past its cap
(``cap_at``), where the watchdog reports it lost and gives it back."""

from __future__ import annotations

import math
import time
import weakref
from typing import Any, Callable, List, Optional, Tuple

from .metrics import Meter

#: renew(batch, hold, lease_ms): queue one renewal of a hold on ``batch`` (an ``_redis.executor.Batch``).
Renew = Callable[[Any, "Hold", int], Any]


#: end(hold): give the whole hold back (one round trip); used at interpreter exit.
End = Callable[["Hold"], Any]


#: notify(listener): tell one of the hold's listeners (a primitive) that the hold was lost.
Notify = Callable[[Any], Any]


class Hold:
    """What this process knows of one hold it was granted.

    ``count`` mirrors the reentrancy count kept in Redis; ``token`` is the fencing token of the
    grant. ``lost`` is set once the hold is found gone or someone else's; after that ``release``
    raises LockLostError and the watchdog leaves it alone.
    """

    __slots__ = (
        "session", "key", "owner", "token", "count", "watchdog", "lease_ms", "expires_at",
        "lost", "listeners", "notify", "renew", "end", "releasing", "pin", "meter", "granted_at",
        "pending", "acks", "suspended", "ran_out", "unbelieved_at", "sent_at",
        "cap_at", "max_hold", "alarms", "cause", "__weakref__",
    )

    def __init__(self, session: Any, key: str, owner: str, *, token: int, count: int,
                 watchdog: bool, lease_ms: int, sent_at: float, renew: Renew,
                 end: Optional[End] = None, notify: Optional[Notify] = None,
                 meter: Optional[Meter] = None, grant: bool = False,
                 acks: Optional[Tuple[int, int]] = None) -> None:
        self.session = session
        self.key = key
        self.owner = owner
        self.token = token
        self.count = count
        self.watchdog = watchdog
        self.lease_ms = lease_ms
        #: monotonic time by which the lease runs out unless renewed (counted from the moment the
        #: grant was *sent*, so it is never later than the server's own deadline)
        self.expires_at = sent_at + lease_ms / 1000.0
        #: when its grant was sent (time.monotonic())
        self.sent_at = sent_at
        self.lost = False
        #: set while a release of this hold is in flight: a renewal that finds the hold gone
        #: then raced the release, and says nothing about a lost lease
        self.releasing = False
        #: the primitive objects to tell when the hold is found lost, through ``notify``
        self.listeners: weakref.WeakSet[Any] = weakref.WeakSet()
        self.notify = notify
        #: the primitive that made the hold knows its script and keys
        self.renew = renew
        self.end = end
        #: what must stay alive while the hold does (the user's client, for a session that
        #: talks through it)
        self.pin: Any = None
        #: the primitive's meter (``_session.metrics``): renewals and a lost lease count there
        self.meter = meter
        #: for a grant (a lock, a permit; not a waiter's lease): when it was sent, until its
        #: hold time is recorded (then 0.0)
        self.granted_at = sent_at if grant else 0.0
        #: an asyncio release of this hold still in flight (``_core.flow.Started``), which a
        #: re-entry by the same task waits for
        self.pending: Any = None
        #: (k, timeout ms) for a hold of a primitive made with ``min_replicas``: a renewal
        #: counts (advances ``expires_at``) only once k replicas acknowledged it; None: 0
        self.acks = acks
        #: the connection to the hold's server was reset (a restart, a failover, a dropped
        #: link) and no renewal has confirmed the hold since: it is not believed meanwhile
        self.suspended = False
        #: its local deadline passed before anything else ended it (``lost`` is set too): the
        #: thread still holds it in ``threading``'s sense until it releases (``_is_owned``)
        self.ran_out = False
        #: when (time.monotonic()) belief in it ended by a suspension or a loss; 0.0 while it
        #: is believed (a deadline that passed ends it at ``expires_at``). The nemesis records
        #: a belief's end from it (``distlock.testing``)
        self.unbelieved_at = 0.0
        #: the cap (``max_hold`` seconds after the grant was sent, time.monotonic()): there the
        #: watchdog reports the hold lost and gives it back; inf: no cap (see ``capped``)
        self.cap_at = math.inf
        self.max_hold = math.inf
        #: ``on_long_hold`` alarms still to fire: (when, callback), earliest first; the
        #: watchdog thread runs each once, at its time, while the hold lives
        self.alarms: List[Tuple[float, Callable[[], Any]]] = []
        #: why it was reported lost (``Session.mark_lost``); None while it is not
        self.cause: Optional[str] = None

    def capped(self, max_hold: float) -> None:
        """Cap the hold at ``max_hold`` seconds from its grant's send (inf: no cap)."""
        self.max_hold = max_hold
        self.cap_at = self.sent_at + max_hold

    def alarm(self, seconds: float, callback: Callable[[], Any]) -> None:
        """Run ``callback`` in the watchdog thread once the hold is ``seconds`` old."""
        self.alarms.append((self.sent_at + seconds, callback))
        self.alarms.sort(key=lambda alarm: alarm[0])

    def ends_at(self) -> float:
        """When belief in the hold ends unless it is renewed first (time.monotonic()): its
        local deadline, or its cap if that comes first."""
        return min(self.expires_at, self.cap_at)

    def due(self) -> float:
        """The earliest time the watchdog must look at the hold: its local deadline, its cap,
        or its first ``on_long_hold`` alarm."""
        due = self.ends_at()
        return min(due, self.alarms[0][0]) if self.alarms else due

    def end_cause(self, now: float) -> str:
        """Why belief in the hold ended at ``now``, past its cap or its local deadline (the
        cause ``on_lost`` is told, whichever thread saw it first)."""
        if now >= self.cap_at:
            return f"held longer than max_hold ({self.max_hold:g} s)"
        if self.watchdog:
            return "its lease ran out unrenewed"
        return f"its lease of {self.lease_ms / 1000.0:g} s ran out"

    def believed(self) -> bool:
        """True while the holder may believe it holds: not lost, not suspended, and before its
        local deadline (the belief rule, above). No round trip: a non-blocking look at the
        watchdog's idle connection (``Watchdog.look_for_reset``) suspends the hold here if its
        server has closed it since the watchdog thread last looked."""
        now = time.monotonic()
        if self.lost or self.suspended or now >= self.ends_at():
            return False
        self.session.watchdog.look_for_reset()
        return not self.lost and not self.suspended

    def valid_for_if_confirmed(self) -> float:
        """``valid_for`` as it would be were the hold not suspended (what a confirmation may
        renew a fixed lease to)."""
        return 0.0 if self.lost else max(0.0, self.ends_at() - time.monotonic())

    def valid_for(self) -> float:
        """Seconds for which the hold is still known to be valid (0.0 once it is not believed).
        No round trip."""
        if not self.believed():
            return 0.0
        return max(0.0, self.ends_at() - time.monotonic())
