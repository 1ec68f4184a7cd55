"""The scripts' replies as typed outcomes, and the waiting policy, without Redis.

``_core.outcomes`` decodes every reply a waiting primitive reads; ``_core.wait_policy.policy`` is the
one state machine every wait runs (threads now, asyncio later). Both are driven here with
made-up replies and a clock the test moves, so every branch is reached without a server.
"""

from __future__ import annotations

import threading
from typing import Any, List, Optional, Tuple

import pytest

from distlock._core import outcomes as oc
from distlock._core import replies as sl
from distlock._core.deadlines import Deadline
from distlock._core.wait_policy import FIRST, HINTED, LAST, WAIT, Sleep, Try, policy

# --- decoders ----------------------------------------------------------------------------------

def test_lock_replies() -> None:
    assert oc.lock_acquire(7) == oc.Granted(7)
    assert oc.lock_acquire(b"12") == oc.Granted(12)
    assert oc.lock_acquire(-1501) == oc.Busy(1.5)  # -(pttl + 1): the holder has 1500 ms left
    assert oc.lock_acquire(-1) == oc.Busy(None)  # the holder's lease is unknown: no bound
    assert oc.lock_acquire(0) == oc.Busy(None)
    assert oc.lock_release(0) == oc.Released(0)
    assert oc.lock_release(2) == oc.Released(2)
    assert oc.lock_release(-1) is oc.LOST
    assert oc.lock_reenter(5) == oc.Granted(5) and oc.lock_reenter(0) is oc.LOST


def test_semaphore_replies() -> None:
    assert oc.sem_acquire(3) == oc.Granted(3)
    assert oc.sem_acquire(-251) == oc.Busy(0.25)


def test_event_replies() -> None:
    assert oc.event_wait(sl.EV_SET, False) == oc.Done(True)
    assert oc.event_wait(sl.EV_TAKEN, True) == oc.Done(True)
    assert oc.event_wait(sl.EV_EXPIRED, False) is oc.REJOIN
    assert oc.event_wait(sl.EV_EXPIRED, True) == oc.Done(False)
    assert oc.event_wait(1234, False) == oc.Busy(None)
    assert oc.event_wait(1234, True) == oc.Done(False)


def test_barrier_replies() -> None:
    assert oc.barrier_poll(sl.BAR_TRIPPED, 2, False) == oc.Done(2)
    broken = oc.barrier_poll(sl.BAR_BROKEN, 2, True)
    assert isinstance(broken, oc.Failed) and isinstance(broken.error, threading.BrokenBarrierError)
    assert oc.barrier_poll(sl.BAR_PENDING, 0, True) == oc.Pending(None)
    assert oc.barrier_poll(sl.BAR_PENDING, 0, False) == oc.Busy(None)
    assert oc.barrier_poll(sl.BAR_WAITING, 0, False) == oc.Busy(None)


def test_condition_replies() -> None:
    assert oc.cond_leave(oc.LEAVE_NOTIFIED, False) == oc.Done(True)
    assert oc.cond_leave(oc.LEAVE_NOTIFIED, True) == oc.Done(True)
    assert oc.cond_leave(0, False) == oc.Busy(None)
    assert oc.cond_leave(0, True) == oc.Done(False)


def test_pending_is_a_busy_but_not_equal_to_one() -> None:
    assert isinstance(oc.Pending(1.0), oc.Busy)
    assert oc.Pending(1.0) != oc.Busy(1.0)
    assert repr(oc.Pending(None)) == "Pending(None)" and repr(oc.LOST) == "LOST"


# --- the policy --------------------------------------------------------------------------------

class FakeDeadline(Deadline):
    """A deadline on a clock the test moves (``now``); its sleep bound is Deadline's own."""

    def __init__(self, timeout: Optional[float]) -> None:
        self.now = 0.0
        self.at = timeout

    def remaining(self) -> Optional[float]:
        return None if self.at is None else max(0.0, self.at - self.now)

    def expired(self) -> bool:
        return self.at is not None and self.now >= self.at


def drive(deadline: FakeDeadline, replies: List[Any], **kwargs: Any) -> Tuple[List[Any], Any]:
    """Run the policy: answer each Try with the next reply, each Sleep by moving the clock by
    its bound (and, when the reply list says so, a hint). Return (steps seen, final outcome)."""
    steps = policy(deadline, 0.5, **kwargs)
    seen: List[Any] = []
    sent: Any = None
    while True:
        try:
            step = steps.send(sent)
        except StopIteration as stop:
            return seen, stop.value
        seen.append(step)
        if isinstance(step, Try):
            sent = replies.pop(0)
        else:
            assert isinstance(step, Sleep)
            woke = replies.pop(0) if replies and isinstance(replies[0], tuple) else (False, False)
            deadline.now += 0.0 if woke[0] else step.bound
            sent = woke


def modes(seen: List[Any]) -> List[str]:
    return [s.mode for s in seen if isinstance(s, Try)]


def test_a_grant_ends_the_wait() -> None:
    seen, final = drive(FakeDeadline(5.0), [oc.Busy(None), oc.Granted(9)], start=WAIT)
    assert final == oc.Granted(9)
    assert modes(seen) == [WAIT, WAIT]
    assert [s.bound for s in seen if isinstance(s, Sleep)] == [0.5]  # the cap


def test_sleep_is_the_least_of_cap_holder_and_time_left() -> None:
    seen, _ = drive(FakeDeadline(0.3), [oc.Busy(0.2), oc.Busy(0.2), oc.Busy(5.0)], start=WAIT)
    sleeps = [s for s in seen if isinstance(s, Sleep)]
    assert [round(s.bound, 3) for s in sleeps] == [0.2, 0.1]  # holder, then time left
    assert sleeps[0].limit == pytest.approx(0.3)  # non-strict: a later waiter may sleep up to it


def test_the_try_at_the_deadline_is_the_last_and_a_refusal_then_times_out() -> None:
    seen, final = drive(FakeDeadline(0.5), [oc.Busy(None), oc.Busy(None)], start=WAIT)
    assert modes(seen) == [WAIT, LAST]
    assert final is oc.TIMED_OUT


def test_no_deadline_never_times_out() -> None:
    replies: List[Any] = [oc.Busy(None)] * 50 + [oc.Granted(1)]
    seen, final = drive(FakeDeadline(None), replies, start=WAIT)
    assert final == oc.Granted(1) and LAST not in modes(seen)


def test_first_step_then_waits_and_zero_timeout_skips_the_sleep() -> None:
    seen, final = drive(FakeDeadline(0.0), [oc.Busy(None), oc.Done(False)])
    assert modes(seen) == [FIRST, LAST] and final == oc.Done(False)
    assert not [s for s in seen if isinstance(s, Sleep)]


def test_a_named_hint_ends_the_wait() -> None:
    seen, final = drive(FakeDeadline(5.0), [oc.Busy(None), (True, True)])
    assert final is oc.NAMED and modes(seen) == [FIRST]


def test_hints_answered_without_registering_then_back_off_after_a_lost_race() -> None:
    replies: List[Any] = [oc.Busy(None), (True, False), oc.Busy(None), oc.Granted(4)]
    seen, final = drive(FakeDeadline(5.0), replies, start=WAIT, answers_hints=True)
    assert modes(seen) == [WAIT, HINTED, WAIT]
    sleeps = [s for s in seen if isinstance(s, Sleep)]
    assert sleeps[1].bound <= 0.002  # the back-off after the lost race, not the cap
    assert final == oc.Granted(4)


def test_without_answers_hints_a_hint_is_a_plain_wait() -> None:
    seen, _ = drive(FakeDeadline(5.0), [oc.Busy(None), (True, False), oc.Granted(1)], start=WAIT)
    assert modes(seen) == [WAIT, WAIT]


def test_pending_ignores_the_deadline_and_repeats_the_same_try() -> None:
    replies: List[Any] = [oc.Busy(None), oc.Pending(None), oc.Pending(None), oc.Done(3)]
    seen, final = drive(FakeDeadline(0.0), replies)
    assert modes(seen) == [FIRST, LAST, LAST, LAST] and final == oc.Done(3)


def test_pending_arrival_repeats_the_first_step() -> None:
    seen, final = drive(FakeDeadline(5.0), [oc.Pending(0.01), oc.Done(0)])
    assert modes(seen) == [FIRST, FIRST] and final == oc.Done(0)
    assert [s.bound for s in seen if isinstance(s, Sleep)] == [0.01]


def test_strict_caps_every_waiter_at_the_bound() -> None:
    seen, _ = drive(FakeDeadline(5.0), [oc.Busy(0.2), oc.Granted(1)], start=WAIT, strict=True)
    sleep = [s for s in seen if isinstance(s, Sleep)][0]
    assert sleep.limit == sleep.bound == 0.2


def test_failed_ends_the_wait_and_a_non_outcome_is_refused() -> None:
    error = ValueError("x")
    _, final = drive(FakeDeadline(5.0), [oc.Failed(error)])
    assert isinstance(final, oc.Failed) and final.error is error
    with pytest.raises(TypeError):
        drive(FakeDeadline(5.0), [42])


def test_renewal_replies() -> None:
    """Every renewal script answers 1 (renewed), 2 (ended without a loss) or anything else
    (lost); the watchdog reads them only through this decoder."""
    assert oc.renewal(1) is oc.RENEWED
    assert oc.renewal(2) is oc.ENDED
    for reply in (0, -1, None):
        assert oc.renewal(reply) is oc.LOST


def test_semaphore_mismatch_and_release_replies() -> None:
    assert oc.sem_acquire(3) == oc.Granted(3)
    assert oc.sem_acquire(sl.SEM_MISMATCH) is oc.MISMATCH
    assert oc.sem_acquire(-1501) == oc.Busy(1.5)
    assert oc.sem_release(2) == oc.Freed(2)
    assert oc.sem_release(0).lost == frozenset()
    freed = oc.sem_release([1, b"a:1:x", "b:2:y"])
    assert freed.free == 1 and freed.lost == frozenset({"a:1:x", "b:2:y"})
    assert oc.sem_release(sl.REL_MISMATCH) is oc.MISMATCH
    assert oc.sem_release(sl.REL_TOO_MANY) is oc.TOO_MANY
    assert oc.sem_release(sl.REL_OVERFLOW) is oc.OVERFLOW


def test_barrier_arrival_and_done() -> None:
    assert oc.barrier_arrival(sl.BAR_BUSY, 250) == oc.Pending(0.25)
    assert oc.barrier_arrival(sl.BAR_MISMATCH, 3) is oc.MISMATCH
    broken = oc.barrier_arrival(sl.BAR_BROKEN, 0)
    assert isinstance(broken, oc.Failed) and isinstance(broken.error, threading.BrokenBarrierError)
    assert oc.barrier_arrival(sl.BAR_TRIPPED, 2) == oc.Done(2)
    assert oc.barrier_arrival(sl.BAR_RUN, 1) is oc.RUN_ACTION
    assert oc.barrier_arrival(sl.BAR_WAITING, 0) is oc.JOINED
    assert isinstance(oc.barrier_done(sl.BAR_BROKEN), oc.Failed)
    assert oc.barrier_done(sl.BAR_TRIPPED) == oc.Done(None)
