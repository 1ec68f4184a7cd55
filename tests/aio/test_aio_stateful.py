"""Stateful property tests of distlock.asyncio's locks against models.

- ``distlock.asyncio.DistLock`` against a model of ``asyncio.Lock``: one holder at most, which
  is an object (any task may release through it); ``release()`` by an object that does not
  hold it raises RuntimeError at once; ``locked()`` says whether anyone holds it. The same
  rules also run against ``asyncio.Lock`` itself, which proves the model.
- ``distlock.asyncio.DistRLock`` against a model of a task-reentrant lock: the holding task
  re-enters (through any object of the name), keeps its fencing token while it does, and only
  it may release; a task of another session (another client: another process) is another
  owner even in the same task.

Every modelled owner is a real task: an ``Owner`` is one long-lived task of the ``aio``
fixture's loop (tests/support/_aio.py) that runs the calls handed to it one after another, so a
DistRLock's owner is that task throughout. Tries are non-blocking, with a short timeout, or
cancelled (``asyncio.wait_for``; ``asyncio.timeout`` for a task-owned lock), which must leave
nothing behind; a blocking acquire is only
made when the model says it cannot wait. Every call is bounded, every example uses a fresh
name, and its teardown gives back what it holds and ends its tasks.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import uuid
from typing import Any, Callable, Dict, Optional

import pytest
from _aio import AioRunner, _make_queue, _serve
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test

import distlock
import distlock.asyncio as aio_

BOUND = 20.0
#: a "short timeout": how long a try waits for a lock somebody else holds
SHORT = 0.05

SETTINGS = settings(
    max_examples=25,
    stateful_step_count=20,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)

STYLES = ["nonblocking", "timeout", "wait_for"]
#: A task-owned lock's tries: ``asyncio.wait_for`` runs the acquire in a task of its own
#: before Python 3.12, which would then own the hold; ``asyncio.timeout`` (3.11+) cancels it
#: in the calling task.
RSTYLES = ["nonblocking", "timeout", *(["cancelled"] if hasattr(asyncio, "timeout") else [])]


class Owner:
    """One task of ``runner``'s loop that runs the calls handed to it, one at a time (a
    callable's awaitable result is awaited there)."""

    def __init__(self, runner: AioRunner) -> None:
        self.runner = runner
        self.queue = runner.run(_make_queue())
        self.task = asyncio.run_coroutine_threadsafe(_serve(self.queue), runner.loop)

    def call(self, fn: Callable[[], Any]) -> Any:
        done: concurrent.futures.Future = concurrent.futures.Future()
        self.runner.loop.call_soon_threadsafe(self.queue.put_nowait, (fn, done))
        return done.result(BOUND)

    def outcome(self, fn: Callable[[], Any]) -> Any:
        """``call(fn)``'s result, or the exception it raised."""
        try:
            return self.call(fn)
        except Exception as exc:  # noqa: BLE001 - compared with the model
            return exc

    def stop(self) -> None:
        self.task.cancel()


async def _maybe(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value


async def _try(lock: Any, style: str, dist: bool) -> bool:
    """One try that may not wait long: ``blocking=False`` or ``timeout=SHORT`` (asyncio.Lock
    has neither: a wait_for instead), or a plain acquire cancelled by ``wait_for``."""
    if dist and style == "nonblocking":
        return bool(await lock.acquire(blocking=False))
    if dist and style == "timeout":
        return bool(await lock.acquire(timeout=SHORT))
    if style == "cancelled":
        try:
            async with asyncio.timeout(SHORT):  # type: ignore[attr-defined]
                return bool(await lock.acquire())
        except asyncio.TimeoutError:
            return False
    try:
        return bool(await asyncio.wait_for(lock.acquire(), SHORT))
    except asyncio.TimeoutError:
        return False


# --- DistLock, and asyncio.Lock ------------------------------------------------------------

class LockMachine(RuleBasedStateMachine):
    """Subclassed per test with ``runner`` and ``make`` set: ``make(name)`` returns the lock
    objects to drive, by label; ``dist`` says whether they are distlock's."""

    runner: Any = None
    make: Any = None
    dist = True

    def __init__(self) -> None:
        super().__init__()
        self.name = f"aio-stateful:{uuid.uuid4().hex}"
        self.owners = [Owner(self.runner) for _ in range(2)]
        self.locks: Dict[str, Any] = self.owners[0].call(lambda: type(self).make(self.name))
        # the model
        self.holder: Optional[str] = None
        self.token: Optional[int] = None
        self.last_token = 0

    def _granted(self, label: str, owner: Owner) -> None:
        self.holder = label
        if self.dist:
            token = owner.call(lambda: self.locks[label].token)
            assert isinstance(token, int) and token > self.last_token, (token, self.last_token)
            self.token = self.last_token = token

    @rule(label=st.sampled_from(["a", "b", "c"]), who=st.integers(0, 1),
          style=st.sampled_from(STYLES))
    def try_acquire(self, label: str, who: int, style: str) -> None:
        label = label if label in self.locks else "a"
        owner, lock = self.owners[who], self.locks[label]
        got = owner.call(lambda: _try(lock, style, self.dist))
        assert got is (self.holder is None), (got, self.holder)
        if got:
            self._granted(label, owner)

    @rule(label=st.sampled_from(["a", "b", "c"]), who=st.integers(0, 1))
    def acquire_when_free(self, label: str, who: int) -> None:
        label = label if label in self.locks else "a"
        owner, lock = self.owners[who], self.locks[label]
        if self.holder is not None:
            return  # it would wait for ever: nobody else releases
        assert owner.call(lambda: _maybe(lock.locked())) is False
        assert owner.call(lambda: lock.acquire()) is True
        self._granted(label, owner)

    @rule(label=st.sampled_from(["a", "b", "c"]), who=st.integers(0, 1))
    def release(self, label: str, who: int) -> None:
        """Any task may release through the holding object; any other release raises
        RuntimeError at once, in the call (not when awaited)."""
        label = label if label in self.locks else "a"
        owner, lock = self.owners[who], self.locks[label]
        if self.holder != label:
            result = owner.outcome(lambda: lock.release())  # the error is not deferred
            assert isinstance(result, RuntimeError), result
            return
        assert owner.outcome(lambda: lock.release()) is None
        self.holder, self.token = None, None

    @rule(label=st.sampled_from(["a", "b", "c"]), who=st.integers(0, 1))
    def locked(self, label: str, who: int) -> None:
        label = label if label in self.locks else "a"
        lock = self.locks[label]
        assert self.owners[who].call(lambda: _maybe(lock.locked())) is (self.holder is not None)

    @invariant()
    def ownership_matches(self) -> None:
        if not self.dist:
            return
        for label, lock in self.locks.items():
            owned, token = self.owners[1].call(lambda lock=lock: (lock.owned(), lock.token))
            assert owned is (self.holder == label), (label, self.holder)
            assert token == (self.token if self.holder == label else None), (label, token)

    @invariant()
    def locked_matches(self) -> None:
        lock = self.locks["a"]
        assert self.owners[0].call(lambda: _maybe(lock.locked())) is (self.holder is not None)
        if self.dist:  # the blocking shell sees the same lock
            assert distlock.DistLock(self.name, client=self.sync_client).locked() is \
                (self.holder is not None)

    sync_client: Any = None

    def teardown(self) -> None:
        try:
            if self.holder is not None:
                lock = self.locks[self.holder]
                self.owners[0].outcome(lambda: lock.release())
        finally:
            for owner in self.owners:
                owner.stop()


def test_asyncio_lock_obeys_the_model() -> None:
    runner = AioRunner()
    try:
        machine = type("AsyncioLockMachine", (LockMachine,),
                       {"runner": runner, "make": staticmethod(lambda _name: {"a": asyncio.Lock()}),
                        "dist": False})
        run_state_machine_as_test(machine, settings=SETTINGS)
    finally:
        runner.close()


@pytest.mark.real_redis
def test_dist_lock_against_asyncio_lock_model(url: str, client: Any, aio: Any) -> None:
    first, second = aio.client(url), aio.client(url)

    def make(name: str) -> Dict[str, Any]:
        # "a" and "b": two objects of one client (two asyncio.Locks' worth of holders: the
        # hold is the object's); "c": another client, another session, as another process
        return {"a": aio_.DistLock(name, client=first), "b": aio_.DistLock(name, client=first),
                "c": aio_.DistLock(name, client=second)}

    machine = type("BoundDistLockMachine", (LockMachine,),
                   {"runner": aio, "make": staticmethod(make), "sync_client": client})
    run_state_machine_as_test(machine, settings=SETTINGS)


# --- DistRLock: a task-reentrant lock ------------------------------------------------------

class RLockMachine(RuleBasedStateMachine):
    """Three owner tasks, two DistRLock objects of one client ("a", "b": one owner per task
    whatever the object) and a third of another client (the stranger: another owner even in
    the same task). Subclassed per test with ``runner``, ``first`` and ``second`` set."""

    runner: Any = None
    first: Any = None
    second: Any = None

    def __init__(self) -> None:
        super().__init__()
        self.name = f"aio-stateful-r:{uuid.uuid4().hex}"
        self.owners = [Owner(self.runner) for _ in range(3)]
        self.locks = {"a": aio_.DistRLock(self.name, client=self.first),
                      "b": aio_.DistRLock(self.name, client=self.first)}
        self.stranger = aio_.DistRLock(self.name, client=self.second)
        # the model
        self.owner: Optional[int] = None
        self.count = 0
        self.token: Optional[int] = None
        self.last_token = 0

    def _new_token(self, token: Any) -> int:
        assert isinstance(token, int) and token > self.last_token, (token, self.last_token)
        self.last_token = token
        return token

    @rule(who=st.integers(0, 2), label=st.sampled_from(["a", "b"]), style=st.sampled_from(RSTYLES))
    def try_acquire(self, who: int, label: str, style: str) -> None:
        lock = self.locks[label]

        async def attempt() -> Any:
            return await _try(lock, style, True), lock.token

        got, token = self.owners[who].call(attempt)
        expected = self.owner is None or self.owner == who
        assert got is expected, (got, who, self.owner, self.count)
        if not got:
            assert token == (self.token if self.owner == who else None)
            return
        if self.count == 0:
            self.owner, self.token = who, self._new_token(token)
        else:
            assert token == self.token, "a re-entry changed the token"
        self.count += 1

    @rule(who=st.integers(0, 2), label=st.sampled_from(["a", "b"]))
    def acquire_when_possible(self, who: int, label: str) -> None:
        """A blocking acquire, made only when it cannot wait: the lock is free, or ours."""
        if self.owner not in (None, who):
            return
        lock = self.locks[label]

        async def take() -> Any:
            return await lock.acquire(), lock.token

        got, token = self.owners[who].call(take)
        assert got is True
        if self.count == 0:
            self.owner, self.token = who, self._new_token(token)
        assert token == self.token
        self.count += 1

    @rule(who=st.integers(0, 2), label=st.sampled_from(["a", "b"]))
    def release(self, who: int, label: str) -> None:
        lock = self.locks[label]
        result = self.owners[who].outcome(lambda: lock.release())
        if self.owner != who:
            # not the owner (or nobody holds it): RuntimeError at once, the hold untouched
            assert isinstance(result, RuntimeError), result
            return
        assert result is None, result
        self.count -= 1
        if self.count == 0:
            self.owner, self.token = None, None

    @rule(who=st.integers(0, 2), style=st.sampled_from(RSTYLES))
    def stranger_tries(self, who: int, style: str) -> None:
        """Another session, in any task (the owner's too), is another owner."""
        stranger = self.stranger

        async def attempt() -> Any:
            got = await _try(stranger, style, True)
            token = stranger.token
            if got:
                await stranger.release()
            return got, token, stranger.owned()

        got, token, owned_after = self.owners[who].call(attempt)
        assert got is (self.count == 0), (got, self.count)
        assert owned_after is False
        if got:
            self._new_token(token)
        else:
            assert token is None

    @rule(who=st.integers(0, 2))
    def stranger_release_refused(self, who: int) -> None:
        result = self.owners[who].outcome(lambda: self.stranger.release())
        assert isinstance(result, RuntimeError), result

    @invariant()
    def every_task_sees_the_model(self) -> None:
        for who, owner in enumerate(self.owners):
            mine = self.owner == who
            for label, lock in self.locks.items():
                seen = owner.call(lambda lock=lock: (lock.owned(), lock._recursion_count(), lock.token))
                assert seen == (mine, self.count if mine else 0, self.token if mine else None), \
                    (who, label, seen, self.owner, self.count)
            assert owner.call(lambda: self.stranger.owned()) is False

    @invariant()
    def locked_matches(self) -> None:
        for lock in (self.locks["a"], self.stranger):
            assert self.owners[0].call(lambda lock=lock: lock.locked()) is (self.count > 0)

    def teardown(self) -> None:
        try:
            if self.owner is not None:
                owner, lock = self.owners[self.owner], self.locks["a"]
                for _ in range(self.count):
                    owner.outcome(lambda: lock.release())
        finally:
            for owner in self.owners:
                owner.stop()


@pytest.mark.real_redis
def test_dist_rlock_against_task_reentrant_model(url: str, client: Any, aio: Any) -> None:
    machine = type("BoundDistRLockMachine", (RLockMachine,),
                   {"runner": aio, "first": aio.client(url), "second": aio.client(url)})
    run_state_machine_as_test(machine, settings=SETTINGS)


