"""The read-back of holds granted before the watchdog's connection opened
(``Watchdog._witness``, ``renewal.check_round``), against a stub executor: which holds it
reads, and what a failed read does. No thread, no server."""

from __future__ import annotations

from typing import Any, Callable, Iterator, List, Optional

import pytest
import redis

from distlock._session.hold import Hold
from distlock._session.watchdog import Watchdog


class _Batch:
    def __init__(self, owner: _Executor) -> None:
        self._owner = owner

    def command(self, *args: Any) -> None:
        self._owner.sent.append(args)

    def execute(self, raise_on_error: bool = True) -> List[Any]:
        if self._owner.error is not None:
            raise self._owner.error
        return self._owner.replies


class _Executor:
    def __init__(self, replies: Optional[List[Any]] = None, error: Optional[BaseException] = None) -> None:
        self.replies = replies or []
        self.error = error
        self.sent: List[Any] = []

    def renewal_batch(self) -> _Batch:
        return _Batch(self)

    # what the watchdog thread (started by a suspension) asks between rounds
    def renewal_reset(self, then: Any) -> bool:
        return False

    def renewal_sockets(self) -> List[Any]:
        return []


@pytest.fixture
def lost() -> List[Any]:
    """What the watchdogs of a test reported lost: (key, cause)."""
    return []


@pytest.fixture
def watchdog(lost: List[Any]) -> Iterator[Callable[[_Executor], Watchdog]]:
    """Make watchdogs on stub executors; each is closed after the test (a suspension starts
    its thread)."""
    made: List[Watchdog] = []

    def make(executor: _Executor) -> Watchdog:
        wd = Watchdog(lambda: executor, "read-back", lambda hold, cause: lost.append((hold.key, cause)))
        made.append(wd)
        return wd

    yield make
    for wd in made:
        wd.holds.clear()
        wd.close(join=True)


def _hold(wd: Watchdog, key: str, *, token: int, grant: bool) -> Hold:
    hold = Hold(None, key, "owner", token=token, count=1, watchdog=False, lease_ms=60_000,
                sent_at=0.0, renew=lambda *a: None, notify=(lambda listener: None) if grant else None,
                grant=grant)
    wd.holds[(key, "owner")] = hold
    return hold


def test_only_grants_are_read_back(watchdog: Any, lost: List[Any]) -> None:
    """A barrier's or a condition's waiter lease may be gone by right (the barrier tripped, the
    last waiter was notified): it is not read, and not reported lost."""
    executor = _Executor(replies=[0, None])
    wd = watchdog(executor)
    _hold(wd, "lock", token=7, grant=True)
    waiters = _hold(wd, "waiters", token=0, grant=False)
    wd._witness(1.0)
    assert [args[1] for args in executor.sent] == ["lock", "lock"]
    assert lost == [("lock", lost[0][1])] and "gone" in lost[0][1]
    assert not waiters.lost and not waiters.suspended


def test_a_hold_with_another_token_is_reported_lost(watchdog: Any, lost: List[Any]) -> None:
    wd = watchdog(_Executor(replies=[1, b"8"]))
    _hold(wd, "lock", token=7, grant=True)
    wd._witness(1.0)
    assert [key for key, _ in lost] == ["lock"]


def test_a_hold_still_there_is_left_believed(watchdog: Any, lost: List[Any]) -> None:
    wd = watchdog(_Executor(replies=[1, b"7"]))
    hold = _hold(wd, "lock", token=7, grant=True)
    wd._witness(1.0)
    assert lost == [] and not hold.suspended


def test_a_refused_read_suspends_the_holds(watchdog: Any, lost: List[Any]) -> None:
    """The server that granted them may be gone: a fixed lease, which no regular round renews,
    is not believed until the round that the suspension calls for confirms it."""
    wd = watchdog(_Executor(error=redis.ConnectionError("refused")))
    hold = _hold(wd, "lock", token=7, grant=True)
    wd._witness(1.0)
    assert hold.suspended and not hold.believed() and wd._confirm
    assert lost == []


def test_a_slow_read_changes_nothing(watchdog: Any, lost: List[Any]) -> None:
    wd = watchdog(_Executor(error=redis.TimeoutError("slow")))
    hold = _hold(wd, "lock", token=7, grant=True)
    wd._witness(1.0)
    assert not hold.suspended and lost == []


def test_a_semaphore_key_gone_is_left_to_the_renewal(watchdog: Any, lost: List[Any]) -> None:
    """A permit released on its owner's behalf deletes the key at rest, with no restart: the
    read-back leaves the permit to its renewal, which reads the handed permits."""
    wd = watchdog(_Executor(replies=[0, None]))
    hold = _hold(wd, "distlock:{s}:sem", token=7, grant=True)
    wd._witness(1.0)
    assert lost == [] and not hold.lost
