"""Stateful property test: DistReadWriteLock against a model of a writer-preferring RW lock.

Three owners (three sessions, each on its own client, all driven from this thread) take and
give back both sides of one name in every order, without ever blocking: non-blocking tries and
short timeouts. A "ghost" waiting writer (an entry put straight into the writers' queue, as a
writer of another process would) comes and goes, so writer preference is part of the model.

The model, per owner: read depth, write depth and the token of each hold. Its rules:

- a read is granted on re-entry, to the write holder (downgrade), or when no one else writes
  and no writer waits;
- a write by a thread holding only the read lock (upgrade) returns False from a single try
  (non-blocking, ``try_lock(0)``) and is refused at once with RuntimeError if it would wait (a
  timeout); any other write is granted on re-entry, or when nobody else holds either side (a
  waiting writer does not block another writer);
- release of a side not held raises LockNotOwnedError;
- every new grant's token is above every earlier one; re-entries keep theirs.

After every step the invariants compare the model with ``locked()``, ``owned()``, the depths
and tokens, and the writers' queue. Teardown releases everything and checks that only the
token counter is left.
"""

from __future__ import annotations

import uuid
from typing import Any, Dict, List, Optional

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

from distlock import DistReadWriteLock, LockNotOwnedError
from distlock._core.keys import RWKeys
from distlock._primitives.rwlock import UPGRADE_REFUSED

SETTINGS = settings(
    max_examples=30,
    stateful_step_count=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)

OWNERS = (0, 1, 2)
GHOST = "ghost-writer-of-another-process"


class Owner:
    def __init__(self, rw: DistReadWriteLock) -> None:
        self.rw = rw
        self.reads = 0
        self.writes = 0
        self.read_token: Optional[int] = None
        self.write_token: Optional[int] = None


class RWMachine(RuleBasedStateMachine):
    """Subclassed per test with ``clients`` set (fixtures cannot reach here)."""

    clients: List[Any] = []

    def __init__(self) -> None:
        super().__init__()
        self.name = f"rw-stateful:{uuid.uuid4().hex}"
        self.keys = RWKeys.of("distlock:", self.name)
        self.owners = [Owner(DistReadWriteLock(self.name, client=c, lease=60.0)) for c in self.clients]
        self.redis = self.clients[0]
        self.ghost = False
        self.last_token = 0

    def _granted(self, token: Optional[int]) -> int:
        assert isinstance(token, int), token
        assert token > self.last_token, (token, self.last_token)
        self.last_token = token
        return token

    def _others(self, i: int) -> List[Owner]:
        return [o for j, o in enumerate(self.owners) if j != i]

    @staticmethod
    def _try(side: Any, style: str) -> bool:
        if style == "nonblocking":
            return bool(side.acquire(blocking=False))
        if style == "timeout":
            return bool(side.acquire(timeout=0.05))
        return bool(side.try_lock(0))

    # --- reads ---------------------------------------------------------------------------

    @rule(i=st.sampled_from(OWNERS), style=st.sampled_from(["nonblocking", "timeout", "try_lock"]))
    def read(self, i: int, style: str) -> None:
        me = self.owners[i]
        expected = (me.reads > 0 or me.writes > 0
                    or (not any(o.writes for o in self._others(i)) and not self.ghost))
        got = self._try(me.rw.read_lock(), style)
        assert got is expected, (got, expected, style)
        if not got:
            assert me.rw.read_lock().token == me.read_token
            return
        if me.reads == 0:
            me.read_token = self._granted(me.rw.read_lock().token)
        else:
            assert me.rw.read_lock().token == me.read_token
        me.reads += 1

    @rule(i=st.sampled_from(OWNERS))
    def read_release(self, i: int) -> None:
        me = self.owners[i]
        if me.reads == 0:
            with pytest.raises(LockNotOwnedError):
                me.rw.read_lock().release()
            return
        me.rw.read_lock().release()
        me.reads -= 1
        if me.reads == 0:
            me.read_token = None

    # --- writes --------------------------------------------------------------------------

    @rule(i=st.sampled_from(OWNERS), style=st.sampled_from(["nonblocking", "timeout", "try_lock"]))
    def write(self, i: int, style: str) -> None:
        me = self.owners[i]
        side = me.rw.write_lock()
        if me.reads > 0 and me.writes == 0:
            if style != "timeout":  # a single try: no deadlock to refuse, just False
                assert self._try(side, style) is False
                return
            with pytest.raises(RuntimeError) as info:
                self._try(side, style)
            assert str(info.value) == UPGRADE_REFUSED
            return
        others = self._others(i)
        expected = me.writes > 0 or not any(o.reads or o.writes for o in others)
        got = self._try(side, style)
        assert got is expected, (got, expected, style)
        if not got:
            return
        if me.writes == 0:
            me.write_token = self._granted(side.token)
        else:
            assert side.token == me.write_token
        me.writes += 1

    @rule(i=st.sampled_from(OWNERS))
    def write_release(self, i: int) -> None:
        me = self.owners[i]
        if me.writes == 0:
            with pytest.raises(LockNotOwnedError):
                me.rw.write_lock().release()
            return
        me.rw.write_lock().release()
        me.writes -= 1
        if me.writes == 0:
            me.write_token = None

    @precondition(lambda self: any(o.writes for o in self.owners))
    @rule()
    def write_release_save_and_restore(self) -> None:
        """What threading.Condition.wait does with the write lock, from outside in."""
        me = next(o for o in self.owners if o.writes)
        side = me.rw.write_lock()
        depth, _ = side._release_save()
        assert depth == me.writes
        assert not side.owned()
        if me.reads:  # it kept the read lock: taking the write lock back would be an upgrade
            with pytest.raises(RuntimeError):
                side._acquire_restore((depth, 0))
            me.writes, me.write_token = 0, None
            return
        side._acquire_restore((depth, 0))  # nobody else can take it meanwhile (one thread)
        me.write_token = self._granted(side.token)

    # --- a writer of another process waits, or stops waiting ----------------------------

    @precondition(lambda self: not self.ghost)
    @rule()
    def ghost_starts_waiting(self) -> None:
        seconds, micros = self.redis.time()
        deadline = seconds * 1000 + micros // 1000 + 60_000
        self.redis.zadd(self.keys.queue, {GHOST: deadline})
        self.redis.pexpire(self.keys.queue, 60_000)
        self.ghost = True

    @precondition(lambda self: self.ghost)
    @rule()
    def ghost_gives_up(self) -> None:
        assert self.redis.zrem(self.keys.queue, GHOST) == 1
        self.ghost = False

    # --- invariants -----------------------------------------------------------------------

    @invariant()
    def matches_the_model(self) -> None:
        readers = any(o.reads for o in self.owners)
        writers = [o for o in self.owners if o.writes]
        assert len(writers) <= 1
        assert not (readers and writers and any(o.reads for o in self.owners if not o.writes))
        some = self.owners[0].rw
        assert some.read_lock().locked() is readers
        assert some.write_lock().locked() is bool(writers)
        for o in self.owners:
            r, w = o.rw.read_lock(), o.rw.write_lock()
            assert r.owned() is (o.reads > 0) and r._recursion_count() == o.reads
            assert w.owned() is (o.writes > 0) and w._recursion_count() == o.writes
            assert r.token == o.read_token and w.token == o.write_token
        # only the ghost ever stays queued: a writer that tried and failed left the queue
        assert self.redis.zrange(self.keys.queue, 0, -1) == ([GHOST.encode()] if self.ghost else [])

    def teardown(self) -> None:
        for o in self.owners:
            while o.writes:
                o.rw.write_lock().release()
                o.writes -= 1
            while o.reads:
                o.rw.read_lock().release()
                o.reads -= 1
        if self.ghost:
            self.redis.zrem(self.keys.queue, GHOST)
        left = sorted(self.redis.keys(f"distlock:{{{self.name}}}*"))
        fence = f"distlock:{{{self.name}}}:fence".encode()
        assert left in ([], [fence]), left
        self.redis.delete(fence)


def test_rwlock_against_model(backend: Any, client: Any) -> None:
    extra = [backend.client(), backend.client()]
    try:
        machine: Dict[str, Any] = {"clients": [client, *extra]}
        run_state_machine_as_test(type("RWMachineHere", (RWMachine,), machine), settings=SETTINGS)
    finally:
        for c in extra:
            c.close()
