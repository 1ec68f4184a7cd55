"""A hypothesis state machine holds DistCondition to threading.Condition's semantics.

The model is threading.Condition's own: a FIFO of waiting threads. ``notify(n)`` wakes the
min(n, waiting) oldest (``n`` read as threading reads it), ``notify_all`` all of them, a wait
that times out leaves the queue without taking anyone's notification, and ``wait`` restores the
lock's recursion level. The same machine runs against ``threading.Condition`` itself, which
proves the model, and against DistCondition with its default DistRLock and with a DistLock.

Every wait in a thread is bounded (60 s) and every step waits for its outcome with a bound, so
a wrong implementation fails instead of hanging; no step asserts a duration.
"""

from __future__ import annotations

import collections
import math
import queue
import threading
import uuid
from typing import Any, Callable, Deque, Dict, List, Tuple

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from distlock import DistCondition, DistLock

BOUND = 20.0
MAX_WAITERS = 4

#: ``n`` as notify() may get it: threading's loop reads floats, NaN, infinities and negatives
NOTIFY_ARGS = st.one_of(st.integers(-1, MAX_WAITERS + 1), st.sampled_from([0.5, 1.5, math.inf, math.nan]))


def _woken_by(n: float, waiting: int) -> int:
    """How many of ``waiting`` waiters threading's ``notify(n)`` wakes."""
    if not n > 0:
        return 0
    if math.isinf(n):
        return waiting
    return min(waiting, math.ceil(n))


def make_machine(factory: Callable[[], Any], reentrant: bool) -> type:
    class ConditionMachine(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.cond = factory()
            self.model: Deque[int] = collections.deque()
            self.results: queue.Queue[Tuple[int, bool]] = queue.Queue()
            self.threads: Dict[int, threading.Thread] = {}
            self.next_label = 0

        # --- waiters in threads -----------------------------------------------------------

        def _start(self, timeout: float) -> int:
            label = self.next_label
            self.next_label += 1
            started = threading.Event()
            cond, results = self.cond, self.results

            def run() -> None:
                with cond:
                    started.set()
                    results.put((label, cond.wait(timeout)))

            thread = threading.Thread(target=run, daemon=True)
            thread.start()
            assert started.wait(BOUND)
            with cond:  # free only once the waiter is inside wait(), queued
                pass
            self.threads[label] = thread
            return label

        def _collect(self, count: int) -> List[Tuple[int, bool]]:
            got = [self.results.get(timeout=BOUND) for _ in range(count)]
            for label, _ok in got:
                self.threads.pop(label).join(BOUND)
            return got

        @precondition(lambda self: len(self.model) < MAX_WAITERS)
        @rule()
        def start_waiter(self) -> None:
            self.model.append(self._start(60.0))

        @rule()
        def waiter_times_out(self) -> None:
            """A waiter behind the others times out; nobody notifies meanwhile."""
            label = self._start(0.05)
            assert self._collect(1) == [(label, False)]

        # --- notify -----------------------------------------------------------------------

        @rule(n=NOTIFY_ARGS)
        def notify(self, n: float) -> None:
            count = _woken_by(n, len(self.model))
            with self.cond:
                self.cond.notify(n)
            got = self._collect(count)
            expected = [self.model.popleft() for _ in range(count)]
            assert sorted(got) == [(label, True) for label in expected]
            with self.cond:  # every woken waiter is through; nobody else woke
                assert self.results.empty()

        @rule()
        def notify_all(self) -> None:
            count = len(self.model)
            with self.cond:
                self.cond.notify_all()
            got = self._collect(count)
            assert sorted(got) == [(label, True) for label in self.model]
            self.model.clear()
            with self.cond:
                assert self.results.empty()

        # --- the calling thread's own waits -------------------------------------------------

        @rule(timeout=st.sampled_from([0, -1, 0.01, 0.05]),
              depth=st.integers(1, 3) if reentrant else st.just(1))
        def own_wait_times_out(self, timeout: float, depth: int) -> None:
            """Only this thread notifies, so its own wait can only time out; the lock comes
            back at its depth."""
            for _ in range(depth):
                self.cond.acquire()
            try:
                assert self.cond.wait(timeout) is False
                assert self.cond._is_owned()
            finally:
                for _ in range(depth):
                    self.cond.release()
            if reentrant:
                assert not self.cond._is_owned()

        @rule()
        def misuse(self) -> None:
            with pytest.raises(RuntimeError, match="^cannot wait on un-acquired lock$"):
                self.cond.wait(0)
            with pytest.raises(RuntimeError, match="^cannot notify on un-acquired lock$"):
                self.cond.notify()
            with pytest.raises(RuntimeError, match="^cannot notify on un-acquired lock$"):
                self.cond.notify_all()

        @invariant()
        def nobody_woke_unasked(self) -> None:
            assert self.results.empty()

        def teardown(self) -> None:
            with self.cond:
                self.cond.notify_all()
            for thread in self.threads.values():
                thread.join(BOUND)
            assert not [t for t in self.threads.values() if t.is_alive()]

    return ConditionMachine


def _settings(examples: int) -> settings:
    return settings(max_examples=examples, stateful_step_count=10, deadline=None, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


def test_model_against_threading_condition() -> None:
    run_state_machine_as_test(make_machine(threading.Condition, True), settings=_settings(25))


@pytest.mark.slow
def test_dist_condition_against_model(client: Any) -> None:
    def factory() -> DistCondition:
        return DistCondition(f"stateful-{uuid.uuid4().hex[:10]}", client=client)

    run_state_machine_as_test(make_machine(factory, True), settings=_settings(15))
    assert not [k for k in client.scan_iter(match="distlock:*cond:*")]


@pytest.mark.slow
def test_dist_condition_with_distlock_against_model(client: Any) -> None:
    def factory() -> DistCondition:
        name = f"stateful-{uuid.uuid4().hex[:10]}"
        return DistCondition(name, DistLock(name, client=client))

    run_state_machine_as_test(make_machine(factory, False), settings=_settings(10))
    assert not [k for k in client.scan_iter(match="distlock:*cond:*")]
