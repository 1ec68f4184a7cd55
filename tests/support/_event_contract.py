"""threading.Event's contract, as a suite keyed by ``eventtypes``, for the Dist events of either
shell and ``threading.Event`` itself (tests/primitives/test_event.py,
tests/aio/test_aio_primitives.py)."""

from __future__ import annotations

import math
import re
import sys
import threading
import time
import uuid
from typing import Any, Callable, List

import pytest
from _support import BOUND, client_for, outcome
from _support import until as _until

from distlock import DistEvent


def _name(prefix: str = "ev") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


class Waiters:
    """Threads each calling ``event.wait(timeout)``; their results, in order of return."""

    def __init__(self, event: Any, count: int, timeout: float = BOUND) -> None:
        self.results: List[bool] = []
        self.lock = threading.Lock()
        self.started = threading.Barrier(count + 1, timeout=BOUND)
        self.threads = [threading.Thread(target=self._run, args=(event, timeout), daemon=True)
                        for _ in range(count)]
        for t in self.threads:
            t.start()
        self.started.wait()

    def _run(self, event: Any, timeout: float) -> None:
        self.started.wait()
        ok = event.wait(timeout)
        with self.lock:
            self.results.append(ok)

    def join(self) -> List[bool]:
        for t in self.threads:
            t.join(BOUND)
        assert not any(t.is_alive() for t in self.threads)
        return self.results


def _registered(event: Any, count: int) -> Callable[[], bool]:
    """For a DistEvent (or a blocking view of an asyncio one): True once ``count`` waiters
    joined in Redis. For threading: a short pause stands in (its waiters block at once)."""
    if isinstance(getattr(event, "prim", event), DistEvent):
        client = event._session().client
        return lambda: client.zcard(event._keys.waiters) >= count
    started = time.monotonic()
    return lambda: time.monotonic() - started > 0.2


class EventContract:
    __test__ = True
    eventtypes = ("threading.Event", "DistEvent", "DistEvent@cluster", "DistEvent@sentinel")

    @pytest.fixture
    def make(self, type_id: str, request: pytest.FixtureRequest) -> Callable[[], Any]:
        if type_id == "threading.Event":
            return threading.Event
        client = client_for(type_id, request)
        return lambda: DistEvent(_name(), client=client)

    def test_repr(self, make: Callable[[], Any]) -> None:
        event = make()
        module = "distlock" if isinstance(event, DistEvent) else "threading"
        cls = type(event).__qualname__
        if module == "threading" and sys.version_info < (3, 11):
            return  # threading.Event describes itself from Python 3.11 on (before, object's repr)
        assert re.match(rf"^<{module}\.{cls} at 0x[0-9a-f]+: unset\b", repr(event)), repr(event)
        event.set()
        assert re.match(rf"^<{module}\.{cls} at 0x[0-9a-f]+: set\b", repr(event)), repr(event)
        event.clear()
        assert ": unset" in repr(event)

    def test_set_clear_is_set(self, make: Callable[[], Any]) -> None:
        event = make()
        assert event.is_set() is False
        assert event.set() is None
        assert event.is_set() is True
        event.set()  # twice: still set
        assert event.is_set() is True
        assert event.clear() is None
        assert event.is_set() is False
        event.clear()
        assert event.is_set() is False

    def test_wait_return_values(self, make: Callable[[], Any]) -> None:
        event = make()
        assert event.wait(0) is False
        assert event.wait(-1) is False
        assert event.wait(math.nan) is False  # threading: no wait
        started = time.monotonic()
        assert event.wait(0.2) is False
        assert 0.18 <= time.monotonic() - started <= BOUND
        event.set()
        for timeout in (None, 0, -1, 0.5, threading.TIMEOUT_MAX):
            assert event.wait(timeout) is True
        event.clear()

    @pytest.mark.parametrize("timeout", ["1", 1j, [1], math.inf, 1e100, threading.TIMEOUT_MAX * 2],
                             ids=["str", "complex", "list", "inf", "huge", "above-max"])
    def test_wait_argument_checks_match_threading(self, make: Callable[[], Any],
                                                  timeout: Any) -> None:
        """In the state where threading checks them (unset: it has to wait)."""
        expected = outcome(lambda: threading.Event().wait(timeout))
        assert expected[0] != "ok"
        event = make()
        assert outcome(lambda: event.wait(timeout)) == expected

    def test_isSet_is_deprecated(self, make: Callable[[], Any]) -> None:  # noqa: N802
        event = make()
        if type(event).__module__ == "threading" and sys.version_info < (3, 10):
            assert event.isSet() is False  # threading warns from Python 3.10 on; distlock always
            return
        with pytest.warns(DeprecationWarning, match="is_set"):
            assert event.isSet() is False

    def test_set_wakes_every_waiter(self, make: Callable[[], Any]) -> None:
        event = make()
        waiters = Waiters(event, 4)
        _until(_registered(event, 4))
        assert waiters.results == []
        event.set()
        assert waiters.join() == [True] * 4
        event.clear()

    def test_set_then_clear_still_wakes_waiters(self, make: Callable[[], Any]) -> None:
        event = make()
        waiters = Waiters(event, 3)
        _until(_registered(event, 3))
        event.set()
        event.clear()
        assert waiters.join() == [True] * 3
        assert event.is_set() is False

    def test_timed_out_waiters_return_false(self, make: Callable[[], Any]) -> None:
        event = make()
        waiters = Waiters(event, 3, timeout=0.2)
        assert waiters.join() == [False] * 3
        event.set()  # after they left: nothing to wake
        assert event.wait(0) is True
        event.clear()

    def test_wait_after_set_does_not_block(self, make: Callable[[], Any]) -> None:
        event = make()
        event.set()
        started = time.monotonic()
        assert Waiters(event, 2, timeout=BOUND).join() == [True, True]
        assert time.monotonic() - started < BOUND
        event.clear()
