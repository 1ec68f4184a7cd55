"""Hypothesis state machines hold DistSemaphore, DistBoundedSemaphore, DistEvent and
DistBarrier to their threading twins' semantics.

Each model is the twin's own: a counter for the semaphores, a flag for the event, the waiting
parties and a broken flag for the barrier. Every machine also runs against the threading class
itself, which proves the model. Every wait in a thread is bounded, and every step waits for its
outcome with a bound, so a wrong implementation fails instead of hanging; no step asserts a
duration. Sizes are kept small (at most 30 examples of 20 steps) so the file stays fast.
"""

from __future__ import annotations

import queue
import sys
import threading
import time
import uuid
from typing import Any, Callable, List

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from distlock import DistBarrier, DistBoundedSemaphore, DistEvent, DistSemaphore

BOUND = 20.0
Broken = threading.BrokenBarrierError


def _settings(examples: int, steps: int) -> settings:
    return settings(max_examples=examples, stateful_step_count=steps, deadline=None,
                    database=None,
                    suppress_health_check=[HealthCheck.too_slow,
                                           HealthCheck.function_scoped_fixture])


def _until(check: Callable[[], Any], bound: float = BOUND) -> None:
    deadline = time.monotonic() + bound
    while not check():
        assert time.monotonic() < deadline, "condition not reached within the bound"
        time.sleep(0.005)


def _unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


# --- semaphores -----------------------------------------------------------------------------------

def semaphore_machine(factory: Callable[[int], Any], bounded: bool) -> type:
    class SemaphoreMachine(RuleBasedStateMachine):
        @initialize(value=st.integers(0, 3))
        def make(self, value: int) -> None:
            self.initial = value
            self.count = value
            self.sem = factory(value)

        @rule(blocking=st.booleans())
        def try_acquire(self, blocking: bool) -> None:
            expected = self.count > 0
            got = self.sem.acquire(False) if not blocking else self.sem.acquire(timeout=0.01)
            assert got is expected
            if got:
                self.count -= 1

        @rule(n=st.integers(1, 3))
        def release(self, n: int) -> None:
            if bounded and self.count + n > self.initial:
                with pytest.raises(ValueError, match="^Semaphore released too many times$"):
                    self.sem.release(n)
                return
            self.sem.release(n)
            self.count += n

        @rule(n=st.sampled_from([0, -1]))
        def bad_release(self, n: int) -> None:
            with pytest.raises(ValueError, match="^n must be one or more$"):
                self.sem.release(n)

        @rule()
        def release_from_other_thread(self) -> None:
            if bounded and self.count + 1 > self.initial:
                return
            box: List[Any] = []
            thread = threading.Thread(target=lambda: box.append(self.sem.release()), daemon=True)
            thread.start()
            thread.join(BOUND)
            assert box == [None]
            self.count += 1

        @invariant()
        def repr_shows_the_count(self) -> None:
            if not hasattr(self, "sem"):
                return
            if type(self.sem).__module__ == "threading" and sys.version_info < (3, 11):
                return  # threading's semaphores describe themselves from Python 3.11 on
            shown = f"{self.count}/{self.initial}" if bounded else f"{self.count}"
            assert f"value={shown}" in repr(self.sem), (repr(self.sem), self.count)

    return SemaphoreMachine


@pytest.mark.parametrize("cls", [threading.Semaphore, threading.BoundedSemaphore])
def test_model_against_threading_semaphores(cls: Any) -> None:
    run_state_machine_as_test(semaphore_machine(cls, cls is threading.BoundedSemaphore),
                              settings=_settings(30, 20))


@pytest.mark.parametrize("cls", [DistSemaphore, DistBoundedSemaphore])
def test_dist_semaphores_against_model(client: Any, cls: Any) -> None:
    def factory(value: int) -> Any:
        return cls(_unique("stateful-sem"), value, client=client)

    run_state_machine_as_test(semaphore_machine(factory, cls is DistBoundedSemaphore),
                              settings=_settings(30, 20))


# --- event ------------------------------------------------------------------------------------------

def _event_waiting(event: Any) -> int:
    if isinstance(event, DistEvent):
        return int(event._session().client.zcard(event._keys.waiters))
    return len(event._cond._waiters)


def event_machine(factory: Callable[[], Any]) -> type:
    class EventMachine(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.event = factory()
            self.flag = False
            self.results: queue.Queue[bool] = queue.Queue()
            self.threads: List[threading.Thread] = []

        @precondition(lambda self: not self.flag and len(self.threads) < 3)
        @rule()
        def start_waiter(self) -> None:
            event, results = self.event, self.results
            thread = threading.Thread(target=lambda: results.put(event.wait(60.0)), daemon=True)
            thread.start()
            self.threads.append(thread)
            _until(lambda: _event_waiting(event) == len(self.threads))

        def _collect(self) -> None:
            got = [self.results.get(timeout=BOUND) for _ in self.threads]
            assert got == [True] * len(got)
            for thread in self.threads:
                thread.join(BOUND)
            self.threads = []

        @rule()
        def set(self) -> None:
            self.event.set()
            self.flag = True
            self._collect()

        @rule()
        def pulse(self) -> None:
            """set() then clear() at once: every waiter still returns True."""
            self.event.set()
            self.event.clear()
            self.flag = False
            self._collect()

        @rule()
        def clear(self) -> None:
            self.event.clear()
            self.flag = False

        @rule(timeout=st.sampled_from([0, -1, 0.01]))
        def own_wait(self, timeout: float) -> None:
            assert self.event.wait(timeout) is self.flag

        @invariant()
        def flag_matches(self) -> None:
            assert self.event.is_set() is self.flag
            assert self.results.empty()

        def teardown(self) -> None:
            self.event.set()
            for thread in self.threads:
                thread.join(BOUND)
            self.event.clear()

    return EventMachine


def test_model_against_threading_event() -> None:
    run_state_machine_as_test(event_machine(threading.Event), settings=_settings(30, 20))


@pytest.mark.slow
def test_dist_event_against_model(client: Any) -> None:
    run_state_machine_as_test(event_machine(lambda: DistEvent(_unique("stateful-ev"), client=client)),
                              settings=_settings(30, 20))
    # a waiter woken by the hint returns at once; its entry goes a moment later (deferred)
    _until(lambda: not list(client.scan_iter(match="distlock:*ev*")))


# --- barrier ---------------------------------------------------------------------------------------

PARTIES = 3


def barrier_machine(factory: Callable[[int], Any]) -> type:
    class BarrierMachine(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.barrier = factory(PARTIES)
            self.broken = False
            self.results: queue.Queue[Any] = queue.Queue()
            self.threads: List[threading.Thread] = []

        def _start(self, count: int) -> None:
            barrier, results = self.barrier, self.results

            def run() -> None:
                try:
                    results.put(barrier.wait(60.0))
                except Broken:
                    results.put(Broken)

            for _ in range(count):
                thread = threading.Thread(target=run, daemon=True)
                thread.start()
                self.threads.append(thread)

        def _collect(self) -> List[Any]:
            got = [self.results.get(timeout=BOUND) for _ in self.threads]
            for thread in self.threads:
                thread.join(BOUND)
            self.threads = []
            return got

        def _all_broken(self) -> None:
            count = len(self.threads)
            assert self._collect() == [Broken] * count

        @precondition(lambda self: not self.broken and len(self.threads) < PARTIES - 1)
        @rule()
        def arrive(self) -> None:
            self._start(1)
            _until(lambda: self.barrier.n_waiting == len(self.threads))

        @precondition(lambda self: not self.broken)
        @rule()
        def trip(self) -> None:
            """The missing parties arrive, the last of them in this thread."""
            self._start(PARTIES - 1 - len(self.threads))
            _until(lambda: self.barrier.n_waiting == PARTIES - 1)
            own = self.barrier.wait(60.0)
            assert sorted([own, *self._collect()]) == list(range(PARTIES))

        @precondition(lambda self: not self.broken and len(self.threads) < PARTIES - 1)
        @rule(timeout=st.sampled_from([0, 0.02]))
        def wait_times_out(self, timeout: float) -> None:
            with pytest.raises(Broken):
                self.barrier.wait(timeout)
            self._all_broken()
            self.broken = True

        @rule()
        def abort(self) -> None:
            self.barrier.abort()
            self._all_broken()
            self.broken = True

        @rule()
        def reset(self) -> None:
            self.barrier.reset()
            self._all_broken()
            self.broken = False

        @precondition(lambda self: self.broken)
        @rule()
        def wait_when_broken(self) -> None:
            with pytest.raises(Broken):
                self.barrier.wait(0.01)

        @invariant()
        def state_matches(self) -> None:
            assert self.barrier.broken is self.broken
            assert self.barrier.n_waiting == (0 if self.broken else len(self.threads))
            assert self.results.empty()

        def teardown(self) -> None:
            self.barrier.abort()
            for thread in self.threads:
                thread.join(BOUND)
            self.barrier.reset()

    return BarrierMachine


def test_model_against_threading_barrier() -> None:
    run_state_machine_as_test(barrier_machine(threading.Barrier), settings=_settings(30, 20))


@pytest.mark.slow
def test_dist_barrier_against_model(client: Any) -> None:
    run_state_machine_as_test(
        barrier_machine(lambda parties: DistBarrier(_unique("stateful-bar"), parties, client=client)),
        settings=_settings(30, 20))
