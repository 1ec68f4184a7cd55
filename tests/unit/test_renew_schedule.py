"""When the watchdog's next renewal round is due (``Watchdog._times`` and ``_renew_at``): a pure
function of the holds' deadlines and the last round, tested with no thread and no server."""

from __future__ import annotations

from typing import Iterator

import pytest

import distlock
from distlock._core.settings import reset_settings
from distlock._session.hold import Hold
from distlock._session.watchdog import Watchdog


@pytest.fixture
def wd() -> Iterator[Watchdog]:
    distlock.configure(lease=2.0, renew_interval=0.5)
    made = Watchdog(lambda: None, "schedule", lambda hold, cause: None)
    try:
        yield made
    finally:
        reset_settings()


def _due(wd: Watchdog, last_round: float, interval: float) -> float:
    return wd._renew_at(last_round, interval, wd._times()[1])


def _hold(wd: Watchdog, name: str, sent_at: float, *, lease: float = 2.0, watchdog: bool = True) -> Hold:
    hold = Hold(None, name, "owner", token=1, count=1, watchdog=watchdog,
                lease_ms=int(lease * 1000), sent_at=sent_at, renew=lambda *a: None)
    wd.holds[(name, "owner")] = hold
    return hold


def test_with_no_holds_the_round_comes_one_interval_after_the_last(wd: Watchdog) -> None:
    assert _due(wd, 100.0, 0.5) == pytest.approx(100.5)


def test_a_hold_with_its_lease_ahead_keeps_the_regular_round(wd: Watchdog) -> None:
    _hold(wd, "k", sent_at=100.0)  # deadline 102.0
    assert _due(wd, 100.0, 0.5) == pytest.approx(100.5)


def test_a_grant_with_little_left_is_renewed_one_interval_before_its_deadline(wd: Watchdog) -> None:
    """A Redlock grant that waited out a stopped master: valid for 0.9 s of its 2 s lease. The
    regular round, 0.5 s after a round that ended late, would come after its deadline."""
    hold = _hold(wd, "k", sent_at=99.0)
    hold.expires_at = 100.9
    assert _due(wd, 100.2, 0.9) == pytest.approx(100.4)


def test_never_sooner_than_a_quarter_interval_after_the_last_round(wd: Watchdog) -> None:
    """A hold that a failing server never renews is past its renewal point: it is asked again
    at a quarter interval, not back to back."""
    hold = _hold(wd, "k", sent_at=98.0)
    hold.expires_at = 100.3
    assert _due(wd, 100.0, 1.0) == pytest.approx(100.125)


def test_fixed_leases_and_lost_holds_do_not_move_the_round(wd: Watchdog) -> None:
    fixed = _hold(wd, "fixed", sent_at=99.0, watchdog=False)
    fixed.expires_at = 100.1
    lost = _hold(wd, "lost", sent_at=99.0)
    lost.expires_at = 100.1
    lost.lost = True
    assert _due(wd, 100.0, 0.5) == pytest.approx(100.5)
    # the fixed lease still has its deadline kept (the thread wakes for it); the lost one not
    assert wd._times()[0] == pytest.approx(100.1)
