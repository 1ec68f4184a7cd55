"""The watchdog thread's loop against a stub executor whose renewal round takes a while: one
round at a time, the next due from the end of the last, and no spinning while one is in
flight. Counts over a bounded run are upper bounds: a slow machine only lowers them."""

from __future__ import annotations

import time
from typing import Any, Iterator, List

import pytest

import distlock
from distlock._core.settings import reset_settings
from distlock._session.hold import Hold
from distlock._session.watchdog import Watchdog

ROUND = 0.3  # how long the stub's round trip takes
RUN = 2.0


class _Slow:
    def __init__(self) -> None:
        self.rounds = 0

    def renewal_batch(self) -> _Slow:
        return self

    def execute(self, raise_on_error: bool = True) -> List[Any]:
        self.rounds += 1
        time.sleep(ROUND)
        return [1]

    def renewal_reset(self, then: Any) -> bool:
        return False

    def renewal_sockets(self) -> List[Any]:
        return []

    def open_renewal(self) -> bool:
        return False

    def margin(self, ms: int) -> float:
        return 0.0


@pytest.fixture
def slow() -> _Slow:
    return _Slow()


@pytest.fixture
def wd(slow: _Slow) -> Iterator[Watchdog]:
    distlock.configure(lease=3.0, renew_interval=0.5)
    made = Watchdog(lambda: slow, "loop", lambda hold, cause: None)
    try:
        yield made
    finally:
        made.holds.clear()
        made.close(join=True)
        reset_settings()


def test_one_round_at_a_time_and_no_spin_while_it_runs(wd: Watchdog, slow: _Slow,
                                                       monkeypatch: Any) -> None:
    looks = [0]
    real = wd._expire_due

    def counted() -> None:
        looks[0] += 1
        real()

    monkeypatch.setattr(wd, "_expire_due", counted)
    hold = Hold(None, "k", "owner", token=1, count=1, watchdog=True, lease_ms=3000,
                sent_at=time.monotonic(), renew=lambda batch, hold, ms: None)
    wd.add(hold)
    time.sleep(RUN)
    rounds = slow.rounds
    # a round every ROUND + renew_interval at most (a round back to back with the last one
    # would make it every ROUND); a look every TICK (0.1 s) and at each round's end at most
    assert 1 <= rounds <= RUN / (ROUND + 0.5) + 1, rounds
    assert looks[0] <= RUN / 0.1 + 2 * rounds + 5, looks[0]
    assert not hold.lost
