"""Stateful property test: DistRLock against a model of ``threading.RLock``.

The machine drives one name through three kinds of caller:

- the owner: this thread, through two DistRLock objects of the name (one owner, as with one
  ``threading.RLock``), with acquire in every style, release, ``_release_save`` /
  ``_acquire_restore``;
- another thread of the same session (a small worker fed through a queue), which only ever
  tries without blocking, or with a short timeout, and releases at once;
- another session (a second client) in this same thread: a different owner too.

The model is a reentrancy count plus the tokens seen. After every step the invariants compare
it with what the lock reports (count, ownership, ``locked()``, token). Error wording is taken
from a real ``threading.RLock``. Every example uses a fresh name, and its teardown gives back
whatever the owner still holds and stops the worker.
"""

from __future__ import annotations

import queue
import threading
import uuid
from typing import Any, Callable, Optional, Tuple

from _support import rlock_depth
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from distlock import DistRLock, LockNotOwnedError

BOUND = 20.0

SETTINGS = settings(
    max_examples=40,
    stateful_step_count=20,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)


def _threading_message(call: Callable[[Any], Any]) -> str:
    try:
        call(threading.RLock())
    except RuntimeError as exc:
        return str(exc)
    raise AssertionError("threading.RLock accepted the call")


RELEASE_MESSAGE = _threading_message(lambda lock: lock.release())
RELEASE_SAVE_MESSAGE = _threading_message(lambda lock: lock._release_save())


class Worker:
    """A second thread of this process; runs one callable at a time, each bounded."""

    def __init__(self) -> None:
        self._inbox: queue.Queue[Optional[Callable[[], Any]]] = queue.Queue()
        self._outbox: queue.Queue[Tuple[bool, Any]] = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="stateful-worker", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            try:
                job = self._inbox.get(timeout=BOUND * 3)
            except queue.Empty:
                return  # abandoned (an example failed before its teardown): just end
            if job is None:
                return
            try:
                self._outbox.put((True, job()))
            except BaseException as exc:  # noqa: BLE001 - handed back to the caller
                self._outbox.put((False, exc))

    def call(self, job: Callable[[], Any]) -> Any:
        self._inbox.put(job)
        ok, value = self._outbox.get(timeout=BOUND)
        if not ok:
            raise value
        return value

    def stop(self) -> None:
        self._inbox.put(None)
        self._thread.join(BOUND)
        assert not self._thread.is_alive(), "stateful worker did not stop"


class RLockMachine(RuleBasedStateMachine):
    """Subclassed per test with ``client`` and ``client2`` set (fixtures cannot reach here)."""

    client: Any = None
    client2: Any = None

    def __init__(self) -> None:
        super().__init__()
        self.name = f"stateful:{uuid.uuid4().hex}"
        self.lock = DistRLock(self.name, client=self.client)
        self.alias = DistRLock(self.name, client=self.client)  # same name, same owner
        self.stranger = DistRLock(self.name, client=self.client2)  # another session
        self.worker = Worker()
        self.in_worker = self.worker.call(lambda: DistRLock(self.name, client=self.client))
        # the model
        self.count = 0
        self.token: Optional[int] = None
        self.last_token = 0  # the highest token any owner was granted so far
        self.saved: Optional[Tuple[int, int]] = None

    def _obj(self, via: str) -> DistRLock:
        return self.lock if via == "lock" else self.alias

    def _granted(self, token: Optional[int]) -> int:
        assert isinstance(token, int), token
        assert token > self.last_token, (token, self.last_token)
        self.last_token = token
        return token

    # --- the owner -----------------------------------------------------------------------

    @rule(via=st.sampled_from(["lock", "alias"]),
          style=st.sampled_from(["blocking", "nonblocking", "timeout", "with-timeout-max"]))
    def acquire(self, via: str, style: str) -> None:
        lock = self._obj(via)
        if self.count == 0:
            # Nobody else may hold it now; checked first so that a broken model fails here
            # instead of leaving a blocking acquire() below waiting for ever.
            assert not lock.locked()
        if style == "blocking":
            got = lock.acquire()
        elif style == "nonblocking":
            got = lock.acquire(blocking=False)
        elif style == "timeout":
            got = lock.acquire(timeout=BOUND)
        else:
            got = lock.acquire(True, threading.TIMEOUT_MAX)
        assert got is True  # the owner never waits: nobody else keeps the lock
        if self.count == 0:
            self.token = self._granted(lock.token)
        else:
            assert lock.token == self.token  # a re-entry keeps its token
        self.count += 1

    @rule(via=st.sampled_from(["lock", "alias"]))
    def release(self, via: str) -> None:
        lock = self._obj(via)
        if self.count == 0:
            try:
                lock.release()
            except LockNotOwnedError as exc:
                assert isinstance(exc, RuntimeError)
                assert str(exc) == RELEASE_MESSAGE
            else:
                raise AssertionError("release() of an unheld DistRLock did not raise")
            return
        assert lock.release() is None
        self.count -= 1
        if self.count == 0:
            self.token = None

    @rule()
    def release_save(self) -> None:
        if self.count == 0:
            try:
                self.lock._release_save()
            except RuntimeError as exc:
                assert str(exc) == RELEASE_SAVE_MESSAGE
            else:
                raise AssertionError("_release_save() of an unheld DistRLock did not raise")
            return
        state = self.lock._release_save()
        assert state[0] == self.count
        self.saved = state
        self.count = 0
        self.token = None

    @precondition(lambda self: self.saved is not None and self.count == 0)
    @rule(via=st.sampled_from(["lock", "alias"]))
    def acquire_restore(self, via: str) -> None:
        assert self.saved is not None
        self._obj(via)._acquire_restore(self.saved)
        self.count = self.saved[0]
        self.saved = None
        self.token = self._granted(self.lock.token)  # a restore is a new grant

    # --- other owners --------------------------------------------------------------------

    @rule(style=st.sampled_from(["nonblocking", "timeout"]))
    def other_thread_tries(self, style: str) -> None:
        lock = self.in_worker

        def attempt() -> Tuple[bool, bool, int, bool, Optional[int]]:
            owned, depth = lock._is_owned(), lock._recursion_count()
            got = lock.acquire(False) if style == "nonblocking" else lock.acquire(timeout=0.05)
            token = lock.token
            if got:
                lock.release()
            return owned, got, depth, lock._is_owned(), token

        owned_before, got, depth, owned_after, token = self.worker.call(attempt)
        assert owned_before is False and depth == 0 and owned_after is False
        assert got is (self.count == 0)
        if got:
            self._granted(token)
        else:
            assert token is None

    @rule()
    def other_session_tries(self) -> None:
        got = self.stranger.acquire(False)
        if got:
            token = self.stranger.token
            self.stranger.release()
            self._granted(token)
        assert got is (self.count == 0)
        assert self.stranger.token is None

    @rule()
    def other_thread_release_refused(self) -> None:
        def attempt() -> str:
            try:
                self.in_worker.release()
            except RuntimeError as exc:
                return str(exc)
            return "released"
        assert self.worker.call(attempt) == RELEASE_MESSAGE

    @rule()
    def locked_seen_by_everyone(self) -> None:
        held = self.count > 0
        assert self.worker.call(self.in_worker.locked) is held
        assert self.stranger.locked() is held

    # --- invariants ----------------------------------------------------------------------

    @invariant()
    def count_matches(self) -> None:
        assert self.lock._recursion_count() == self.count
        assert self.alias._recursion_count() == self.count

    @invariant()
    def ownership_matches(self) -> None:
        held = self.count > 0
        assert self.lock._is_owned() is held
        assert self.alias.owned() is held
        assert self.stranger.owned() is False

    @invariant()
    def locked_matches(self) -> None:
        assert self.lock.locked() is (self.count > 0)

    @invariant()
    def token_matches(self) -> None:
        assert self.lock.token == self.token
        assert self.alias.token == self.token
        assert (self.token is None) is (self.count == 0)

    def teardown(self) -> None:
        # Only cleanup (the invariants did the checking): give back what the lock says we
        # hold, which also covers a step that failed half-way.
        try:
            if self.lock._is_owned():
                self.lock._release_save()
        finally:
            self.worker.stop()


class ThreadingRLockMachine(RuleBasedStateMachine):
    """The model's own rules against ``threading.RLock``, which proves the model."""

    def __init__(self) -> None:
        super().__init__()
        self.lock = threading.RLock()
        self.count = 0
        self.saved: Any = None
        self.worker = Worker()

    @rule(style=st.sampled_from(["blocking", "nonblocking", "timeout"]))
    def acquire(self, style: str) -> None:
        got = {"blocking": lambda: self.lock.acquire(),
               "nonblocking": lambda: self.lock.acquire(blocking=False),
               "timeout": lambda: self.lock.acquire(timeout=BOUND)}[style]()
        assert got is True
        self.count += 1

    @rule()
    def release(self) -> None:
        if self.count == 0:
            try:
                self.lock.release()
            except RuntimeError as exc:
                assert str(exc) == RELEASE_MESSAGE
            else:
                raise AssertionError("release() of an unheld RLock did not raise")
            return
        self.lock.release()
        self.count -= 1

    @rule()
    def release_save(self) -> None:
        if self.count == 0:
            try:
                self.lock._release_save()
            except RuntimeError as exc:
                assert str(exc) == RELEASE_SAVE_MESSAGE
            else:
                raise AssertionError("_release_save() of an unheld RLock did not raise")
            return
        self.saved = self.lock._release_save()
        assert self.saved[0] == self.count
        self.count = 0

    @precondition(lambda self: self.saved is not None and self.count == 0)
    @rule()
    def acquire_restore(self) -> None:
        self.lock._acquire_restore(self.saved)
        self.count = self.saved[0]
        self.saved = None

    @rule()
    def other_thread_tries(self) -> None:
        def attempt() -> bool:
            got = self.lock.acquire(False)
            if got:
                self.lock.release()
            return got
        assert self.worker.call(attempt) is (self.count == 0)

    @invariant()
    def count_matches(self) -> None:
        # _recursion_count() where this interpreter's RLock has it (not 3.9, 3.10, 3.11.2)
        assert rlock_depth(self.lock) == self.count
        assert self.lock._is_owned() is (self.count > 0)

    def teardown(self) -> None:
        for _ in range(self.count):
            self.lock.release()
        self.worker.stop()


def test_threading_rlock_obeys_the_model() -> None:
    run_state_machine_as_test(ThreadingRLockMachine, settings=SETTINGS)


def test_dist_rlock_against_model(client: Any, backend: Any) -> None:
    client2 = backend.client()
    try:
        machine = type("BoundRLockMachine", (RLockMachine,), {"client": client, "client2": client2})
        run_state_machine_as_test(machine, settings=SETTINGS)
    finally:
        client2.close()
