"""A watchdog's renewal round (``renew_round``, run on its ``renewals`` worker): every
watchdog hold renewed, and every hold suspended by a reset confirmed, in one pipelined round
trip; and the read that checks holds granted before the watchdog's connection opened
(``check_round``). ``wd`` is the ``_session.watchdog.Watchdog`` whose round it is (not
imported here: that module imports this one)."""

from __future__ import annotations

import logging
import time
from typing import Any, Dict, List, Optional

import redis

from .._core.outcomes import ENDED, RENEWED, renewal
from .._core.replicas import batch_wait, renewal_counts
from .._core.settings import settings
from .hold import Hold
from .metrics import renewed

__all__ = ["renew_round", "give_back_lost", "check_round", "refused"]

log = logging.getLogger("distlock")


def refused(exc: BaseException) -> bool:
    """Whether ``exc``, met talking to the server, says the server may be gone (a restart: the
    connection was refused or reset), which suspends belief in the holds; a timeout says only
    that it is slow."""
    return isinstance(exc, redis.ConnectionError) and not isinstance(exc, redis.TimeoutError)


def renew_round(wd: Any) -> Optional[float]:
    """Renew every live watchdog hold in one pipelined round trip, and confirm every
    suspended fixed-lease hold in the same one (renewed to no more than what is left of its
    local lease: a fixed lease is never lengthened).

    Return None when all went through, or a short delay before the next try after a
    failure of any kind. A hold that cannot be renewed before its lease runs out is marked
    lost: a renewal that fails is never silent. A connection reset suspends the holds.
    """
    with wd.mutex:
        holds = [h for h in list(wd.holds.values())
                 if not h.lost and (h.watchdog or h.suspended)]
    if not holds:
        return None
    lease_ms = max(1, int(settings().lease * 1000))
    retry = min(1.0, settings().renew_interval)
    sent_at = time.monotonic()
    failed = False
    try:
        executor = wd._executor()
        batch = executor.renewal_batch()
        # Holds made with min_replicas: one WAIT ends the round trip, on its connection
        wait = batch_wait((hold.acks for hold in holds), settings().renew_interval)
        if wait is not None:
            batch.wait(*wait)
        queued = []
        for hold in holds:
            try:
                if hold.watchdog:
                    hold.renew(batch, hold, lease_ms)
                else:
                    left_ms = int(hold.valid_for_if_confirmed() * 1000)
                    if left_ms <= 0:
                        continue  # it ends now anyway: nothing to confirm
                    hold.renew(batch, hold, left_ms)
                queued.append(hold)
            except Exception as exc:  # noqa: BLE001 - one primitive's bug is not everyone's loss
                log.exception("distlock: watchdog could not queue the renewal of %s", hold.key)
                failed = True
                wd._expire([hold], exc)
        holds = queued
        replies = batch.execute(raise_on_error=False) if holds else []
    except Exception as exc:  # noqa: BLE001 - any failure: retry, and report what ran out
        log.warning("distlock: watchdog could not renew %d hold(s): %r", len(holds), exc)
        if refused(exc):
            wd.suspend(f"the connection to the server failed ({exc!r})")
        failures: Dict[Any, List[int]] = {}
        for hold in holds:
            failures.setdefault(hold.meter.series if hold.meter is not None else None, [0, 0])[1] += 1
        renewed(failures, None)
        wd._expire(holds, exc)
        return retry
    rtt = time.monotonic() - sent_at
    tally: Dict[Any, List[int]] = {}  # per series: [renewed, failed]
    acked = batch.acked if wait is not None else None
    unacked: List[Hold] = []
    late: List[Hold] = []
    for i, (hold, reply) in enumerate(zip(holds, replies)):
        counts = tally.setdefault(hold.meter.series if hold.meter is not None else None, [0, 0])
        if isinstance(reply, Exception):
            log.warning("distlock: watchdog renewal of %s failed: %r", hold.key, reply)
            failed = True
            counts[1] += 1
            wd._expire([hold])
            continue
        outcome = renewal(reply)
        if outcome is RENEWED and not renewal_counts(hold.acks, None if acked is None else acked[i]):
            # Too few replicas acknowledged it: it does not count. The hold keeps its last
            # acknowledged deadline, and is lost once that passes (looked at again soon).
            failed = True
            counts[1] += 1
            unacked.append(hold)
        elif outcome is RENEWED and hold.lost:
            # It came back after its deadline had ended belief in it: nobody believes it,
            # so give it back rather than keep it for a lease
            counts[1] += 1
            late.append(hold)
        elif outcome is RENEWED:
            counts[0] += 1
            if hold.watchdog:
                hold.lease_ms = lease_ms
                hold.expires_at = sent_at + lease_ms / 1000.0 - executor.margin(lease_ms)
            if not hold.suspended or hold.unbelieved_at <= sent_at:  # else sent before
                hold.suspended = False  # the reset: it confirms nothing (the next round does)
                hold.unbelieved_at = 0.0
        elif outcome is ENDED:
            wd.drop(hold)  # ended without a loss (a permit released on our behalf)
        else:
            counts[1] += 1
            if not hold.releasing and wd.registered(hold):
                wd._on_lost(hold, "a renewal found it gone or someone else's")
    renewed(tally, rtt)
    if late:
        give_back_lost(wd, late)
    if unacked:
        wd._expire(unacked, cause="too few replicas acknowledged its renewals before its "
                                    "last acknowledged lease ran out")
        give_back_lost(wd, unacked)
    return retry if failed else None


def give_back_lost(wd: Any, holds: List[Hold]) -> None:
    """Holds just reported lost while Redis still has them (their renewals went through on
    the master, unacknowledged): give them back, as their owners are told they hold
    nothing. Each ``end`` checks the hold is still ours; what fails ends with its lease."""
    for hold in holds:
        if not hold.lost or hold.end is None or hold.releasing or not wd.registered(hold):
            continue
        try:
            hold.end(hold)
        except Exception as exc:  # noqa: BLE001 - it then ends with its lease
            log.warning("distlock: could not give back %s: %r", hold.key, exc)


def check_round(wd: Any, holds: List[Hold]) -> None:
    """Read, in one pipelined round trip on the watchdog's own connection, whether each of
    ``holds`` is still in Redis, writing nothing (``Watchdog._witness``): a hold whose key is
    gone, or whose hash names another token, was granted by a server that restarted since,
    and is reported lost. Where a read cannot tell (a sorted set has no token to compare), the
    hold stays as it is. A failure changes nothing: the renewals and the deadline go on."""
    try:
        batch = wd._executor().renewal_batch()
        for hold in holds:
            batch.command("EXISTS", hold.key)
            batch.command("HGET", hold.key, ":t")
        replies = batch.execute(raise_on_error=False)
    except Exception as exc:  # noqa: BLE001 - see below
        log.debug("distlock: could not check holds on the watchdog's connection: %r", exc)
        if refused(exc):
            # the server that granted them may be gone: suspended, the holds are confirmed
            # (or lost) by the round that suspension calls for, fixed leases included, which
            # the regular rounds do not renew
            wd.suspend(f"the watchdog could not read its holds back ({exc!r})")
        return
    for i, hold in enumerate(holds):
        exists, token = replies[2 * i], replies[2 * i + 1]
        if isinstance(token, bytes):
            token = token.decode()
        # EXISTS and HGET (the documented ACL allows both); HGET of a sorted set is an error
        # reply: no token to compare, the key's existence tells
        gone = exists == 0 or (isinstance(token, str) and token != str(hold.token))
        if gone and exists == 0 and hold.key.endswith(":sem"):
            # a permit released on its owner's behalf deletes a semaphore's key at rest with no
            # restart at all: its renewal, which reads the handed permits, decides (sem_renew)
            continue
        if gone and not hold.lost and not hold.releasing and wd.registered(hold):
            wd._on_lost(hold, "the watchdog's first read found it gone or someone else's "
                              "(its server restarted, or the key was removed, after the grant)")
