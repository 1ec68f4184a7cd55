"""DistBarrier: threading.Barrier's contract, and what must hold across processes.

``BarrierContract`` runs against ``threading.Barrier`` itself (which proves the tests) and
against DistBarrier; "as threading does" is checked by running the same call on a threading
twin in the same state. Timing is asserted only as generous bounds; every thread and process
is joined (or killed) with a bound.
"""

from __future__ import annotations

import math
import os
import re
import signal
import sys
import threading
import time
import uuid
from typing import Any, Callable, Dict, List, Optional, Tuple

import _sem_event_barrier_workers
import pytest
from _procs import Children, recv
from _support import BOUND, client_for, outcome
from _support import distlock_keys as _keys
from _support import until as _until

import distlock
from distlock import DistBarrier
from distlock._session.session import session_for

Broken = threading.BrokenBarrierError


def _name(prefix: str = "bar") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "type_id" in metafunc.fixturenames and metafunc.cls is not None:
        metafunc.parametrize("type_id", metafunc.cls.barriertypes)


class Parties:
    """Threads each calling ``barrier.wait(timeout)`` ``generations`` times; per thread, the
    indices returned, ending with the exception type that stopped it, if any."""

    def __init__(self, barrier: Any, count: int, generations: int = 1,
                 timeout: Optional[float] = BOUND) -> None:
        self.results: List[List[Any]] = [[] for _ in range(count)]
        self.threads = [threading.Thread(target=self._run, args=(barrier, i, generations, timeout),
                                         daemon=True) for i in range(count)]
        for t in self.threads:
            t.start()

    def _run(self, barrier: Any, i: int, generations: int, timeout: Optional[float]) -> None:
        for _ in range(generations):
            try:
                self.results[i].append(barrier.wait(timeout))
            except Exception as exc:  # noqa: BLE001 - what stopped it is the result
                self.results[i].append(type(exc))
                return

    def join(self) -> List[List[Any]]:
        for t in self.threads:
            t.join(BOUND * 2)
        assert not any(t.is_alive() for t in self.threads), "parties still waiting"
        return self.results


def _n_waiting(barrier: Any, n: int) -> Callable[[], bool]:
    return lambda: barrier.n_waiting == n


class BarrierContract:
    __test__ = True
    barriertypes = ("threading.Barrier", "DistBarrier", "DistBarrier@cluster", "DistBarrier@sentinel")

    @pytest.fixture
    def make(self, type_id: str, request: pytest.FixtureRequest) -> Callable[..., Any]:
        if type_id == "threading.Barrier":
            return threading.Barrier
        client = client_for(type_id, request)
        return lambda *args, **kwargs: DistBarrier(_name(), *args, client=client, **kwargs)

    def test_repr_and_properties(self, make: Callable[..., Any]) -> None:
        barrier = make(3)
        module = "distlock" if isinstance(barrier, DistBarrier) else "threading"
        cls = type(barrier).__qualname__
        # threading.Barrier has this repr from Python 3.11 on (before, object's): compare
        # with what this interpreter's threading offers; distlock's has it everywhere
        described = module == "distlock" or sys.version_info >= (3, 11)
        if described:
            assert re.match(rf"^<{module}\.{cls} at 0x[0-9a-f]+: waiters=0/3\b", repr(barrier))
        assert (barrier.parties, barrier.n_waiting, barrier.broken) == (3, 0, False)
        barrier.abort()
        assert barrier.broken is True and barrier.n_waiting == 0
        if described:
            assert re.match(rf"^<{module}\.{cls} at 0x[0-9a-f]+: broken\b", repr(barrier))
        barrier.reset()
        assert barrier.broken is False

    def test_indices_per_generation(self, make: Callable[..., Any]) -> None:
        barrier = make(3)
        results = Parties(barrier, 3, generations=3).join()
        for gen in range(3):
            assert sorted(r[gen] for r in results) == [0, 1, 2]
        assert barrier.n_waiting == 0 and barrier.broken is False

    def test_single_party(self, make: Callable[..., Any]) -> None:
        barrier = make(1)
        assert [barrier.wait(), barrier.wait(0), barrier.wait(-1)] == [0, 0, 0]

    def test_action_runs_once_per_generation_before_release(self, make: Callable[..., Any]) -> None:
        runs: List[str] = []
        seen: List[Tuple[int, int]] = []
        lock = threading.Lock()

        def action() -> None:
            with lock:
                runs.append(threading.current_thread().name)

        barrier = make(3, action)

        class Recording(Parties):
            def _run(self, barrier: Any, i: int, generations: int, timeout: Optional[float]) -> None:
                for gen in range(generations):
                    barrier.wait(timeout)
                    with lock:
                        seen.append((gen, len(runs)))

        Recording(barrier, 3, generations=3).join()
        assert len(runs) == 3
        assert all(count == gen + 1 for gen, count in seen), seen  # the action ran first
        assert len(seen) == 9

    def test_action_that_raises_breaks(self, make: Callable[..., Any]) -> None:
        def action() -> None:
            raise ZeroDivisionError("boom")

        barrier = make(3, action)
        results = Parties(barrier, 3).join()
        assert sorted(r[0].__name__ for r in results) == ["BrokenBarrierError", "BrokenBarrierError",
                                                          "ZeroDivisionError"]
        assert barrier.broken is True
        with pytest.raises(Broken):
            barrier.wait(0.1)
        barrier.reset()
        assert barrier.broken is False

    def test_timeout_breaks(self, make: Callable[..., Any]) -> None:
        barrier = make(3)
        started = time.monotonic()
        results = Parties(barrier, 2, timeout=0.3).join()
        assert results == [[Broken], [Broken]]
        assert 0.25 <= time.monotonic() - started <= BOUND * 2
        assert barrier.broken is True
        barrier.reset()
        assert sorted(r[0] for r in Parties(barrier, 3).join()) == [0, 1, 2]

    def test_default_timeout(self, make: Callable[..., Any]) -> None:
        barrier = make(3, None, 0.3)
        assert Parties(barrier, 2, timeout=None).join() == [[Broken], [Broken]]
        assert barrier.broken is True
        barrier.reset()

    def test_zero_timeout_breaks_at_once_unless_last(self, make: Callable[..., Any]) -> None:
        barrier = make(2)
        with pytest.raises(Broken):
            barrier.wait(0)
        assert barrier.broken is True
        barrier.reset()
        parties = Parties(barrier, 1)
        _until(_n_waiting(barrier, 1))
        assert barrier.wait(0) == 1  # the last party does not wait
        assert parties.join() == [[0]]

    def test_abort_breaks_waiters_and_later_waits(self, make: Callable[..., Any]) -> None:
        barrier = make(3)
        parties = Parties(barrier, 2)
        _until(_n_waiting(barrier, 2))
        barrier.abort()
        assert parties.join() == [[Broken], [Broken]]
        with pytest.raises(Broken):
            barrier.wait()
        assert barrier.broken is True and barrier.n_waiting == 0
        barrier.reset()
        assert sorted(r[0] for r in Parties(barrier, 3).join()) == [0, 1, 2]

    def test_reset_breaks_waiters_but_not_the_barrier(self, make: Callable[..., Any]) -> None:
        barrier = make(3)
        parties = Parties(barrier, 2)
        _until(_n_waiting(barrier, 2))
        barrier.reset()
        assert parties.join() == [[Broken], [Broken]]
        assert barrier.broken is False
        assert sorted(r[0] for r in Parties(barrier, 3).join()) == [0, 1, 2]

    @pytest.mark.parametrize("timeout", ["1", 1j, [1], math.inf, 1e100],
                             ids=["str", "complex", "list", "inf", "huge"])
    def test_wait_argument_checks_match_threading(self, make: Callable[..., Any],
                                                  timeout: Any) -> None:
        """In the state where threading checks them (not the last party: it has to wait)."""
        twin = threading.Barrier(2)
        expected = outcome(lambda: twin.wait(timeout))
        assert expected[0] != "ok" and not twin.broken
        barrier = make(2)
        assert outcome(lambda: barrier.wait(timeout)) == expected
        assert barrier.broken is False and barrier.n_waiting == 0

    def test_broken_barrier_error_is_threadings(self, make: Callable[..., Any]) -> None:
        barrier = make(2)
        barrier.abort()
        with pytest.raises(threading.BrokenBarrierError) as info:
            barrier.wait()
        assert type(info.value) is threading.BrokenBarrierError
        assert isinstance(info.value, RuntimeError)
        barrier.reset()


# --- what only DistBarrier does --------------------------------------------------------------------

def test_constructor_checks(client: Any) -> None:
    for bad, error in ((0, ValueError), (-1, ValueError), (1.5, TypeError), ("3", TypeError),
                       (None, TypeError)):
        with pytest.raises(error):
            DistBarrier("x", bad, client=client)
    with pytest.raises(TypeError):
        DistBarrier("x", 2, action=42, client=client)
    with pytest.raises(TypeError):
        DistBarrier("x", 2, timeout="1", client=client)
    with pytest.raises(OverflowError):
        DistBarrier("x", 2, timeout=math.inf, client=client)
    with pytest.raises(ValueError):
        DistBarrier("x", 2, timeout=math.nan, client=client)
    with pytest.raises(TypeError):
        DistBarrier(1, 2, client=client)
    with pytest.raises(TypeError):
        DistBarrier("x", 2, None, None, client)
    assert DistBarrier("x", 2, client=client).parties == 2


def test_parties_mismatch_names_the_recorded_number(client: Any) -> None:
    name = _name()
    barrier = DistBarrier(name, 3, client=client)
    parties = Parties(barrier, 1)
    _until(_n_waiting(barrier, 1))
    with pytest.raises(ValueError, match=r"created with parties=3, not 4"):
        DistBarrier(name, 4, client=client).wait()
    barrier.abort()
    assert parties.join() == [[Broken]]
    barrier.reset()
    assert _keys(client) == [barrier._keys.broken]


def _trip_record_only(client: Any, barrier: Any) -> List[str]:
    """The keys of ``barrier`` at rest, leaving out the record of its latest trip: the state,
    holding only the generation numbers and until when the parties that trip released may
    look, which runs out with their leases (no parties number: that is forgotten at rest)."""
    state = barrier._keys.state
    left = _keys(client)
    if state in left:
        assert set(client.hkeys(state)) <= {b"g", b"o", b"k"}, client.hgetall(state)
        assert 0 < client.pttl(state) <= distlock.configure().lease * 1000
        left.remove(state)
    return left


def test_keys_at_rest_broken_and_reset(client: Any) -> None:
    barrier = DistBarrier(_name(), 2, client=client)
    assert sorted(r[0] for r in Parties(barrier, 2).join()) == [0, 1]
    # At rest: only the record of the trip, until the released parties' leases run out.
    assert _keys(client) == [barrier._keys.state]
    assert _trip_record_only(client, barrier) == []
    barrier.abort()
    assert _keys(client) == sorted([barrier._keys.broken, barrier._keys.state])
    assert client.ttl(barrier._keys.state) == -1  # broken stays broken, for good
    assert DistBarrier(barrier.name, 2, client=client).broken is True
    barrier.reset()
    # the record of the broken generation...
    assert _trip_record_only(client, barrier) == [barrier._keys.broken]
    assert client.ttl(barrier._keys.broken) > 0  # ...goes by itself


def test_keys_at_rest_go_when_the_released_leases_run_out(client: Any) -> None:
    distlock.configure(lease=1.0, renew_interval=0.3)
    barrier = DistBarrier(_name(), 3, client=client)
    assert sorted(r[0] for r in Parties(barrier, 3).join()) == [0, 1, 2]
    assert _keys(client) == [barrier._keys.state]
    _until(lambda: _keys(client) == [], 5.0)
    # A barrier at rest may then be used with another number of parties.
    assert sorted(r[0] for r in Parties(DistBarrier(barrier.name, 2, client=client), 2).join()) \
        == [0, 1]


def test_trip_whose_hint_is_lost_still_releases(client: Any) -> None:
    distlock.configure(wait_cap=0.3)
    barrier = DistBarrier(_name(), 3, client=client)
    parties = Parties(barrier, 2)
    _until(_n_waiting(barrier, 2))
    keys = barrier._keys
    reply = session_for(client).run(
        "bar_wait", (keys.state, keys.waiters, keys.broken, keys.channel + ":nowhere"),
        ("last", 30000, 3, "0", 60000))
    assert reply[:2] == [1, 2]
    assert sorted(r[0] for r in parties.join()) == [0, 1]
    assert _trip_record_only(client, barrier) == []


def test_runner_that_dies_in_its_action_breaks(client: Any) -> None:
    """The last party took the action and stopped renewing (its process died): when its lease
    runs out, the waiters raise BrokenBarrierError, and arrivals meanwhile were held back."""
    distlock.configure(wait_cap=0.3)
    barrier = DistBarrier(_name(), 3, client=client)
    parties = Parties(barrier, 2)
    _until(_n_waiting(barrier, 2))
    keys = barrier._keys
    reply = session_for(client).run("bar_wait", keys.all, ("runner", 600, 3, "1", 60000))
    assert reply[:2] == [2, 2]
    assert parties.join() == [[Broken], [Broken]]
    assert barrier.broken is True
    barrier.reset()


def test_interrupted_waiter_breaks_the_barrier(client: Any) -> None:
    barrier = DistBarrier(_name(), 3, client=client)
    parties = Parties(barrier, 1)
    _until(_n_waiting(barrier, 1))
    interrupted: Dict[str, Any] = {}

    def wait_then_interrupt() -> None:
        session = barrier._session()
        original = session.sleep
        me = threading.get_ident()

        def sleep(*args: Any, **kwargs: Any) -> Any:
            # only this thread is interrupted: the session is the other party's too, and its
            # sleep may end and begin again meanwhile (a loaded machine, the valkey pass of CI)
            if threading.get_ident() == me:
                raise KeyboardInterrupt
            return original(*args, **kwargs)

        session.sleep = sleep  # type: ignore[method-assign]
        try:
            barrier.wait()
        except KeyboardInterrupt:
            interrupted["ok"] = True
        finally:
            session.sleep = original  # type: ignore[method-assign]

    # Run it in this thread: the other party's sleep is already under way.
    wait_then_interrupt()
    assert interrupted == {"ok": True}
    assert parties.join() == [[Broken]]
    assert barrier.broken is True
    barrier.reset()


# --- across processes ---------------------------------------------------------------------------

@pytest.mark.real_redis
@pytest.mark.slow
def test_four_processes_many_generations(client: Any, url: str, children: Children) -> None:
    name, counter = _name(), _name("actions")
    conns = [children.start(_sem_event_barrier_workers.barrier_party, url, name, 4, 5, counter, 60.0, None)
             for _ in range(4)]
    pids = [recv(conn)[1] for conn in conns]
    for conn in conns:
        conn.send("go")
    for conn in conns:
        assert recv(conn) == ("arriving",)
    results = [recv(conn, 120.0) for conn in conns]
    assert all(kind == "indices" for kind, _ in results), results
    for gen in range(5):
        assert sorted(indices[gen] for _, indices in results) == [0, 1, 2, 3]
    runners = [int(x) for x in client.lrange(counter, 0, -1)]
    assert len(runners) == 5 and set(runners) <= set(pids)  # once per generation, in a party
    client.delete(counter)
    assert _trip_record_only(client, DistBarrier(name, 4, client=client)) == []


@pytest.mark.real_redis
@pytest.mark.slow
def test_sigkilled_party_breaks_the_barrier(client: Any, url: str, children: Children) -> None:
    """A party killed while it waits: when its lease runs out the barrier breaks, and the
    parties in the other processes raise BrokenBarrierError instead of hanging (no timeout
    set, or one far longer than the test)."""
    name = _name()
    settings = {"lease": 1.0, "renew_interval": 0.25, "wait_cap": 0.5}
    victim = children.start(_sem_event_barrier_workers.barrier_party, url, name, 4, 1, None, None, settings)
    others = [children.start(_sem_event_barrier_workers.barrier_party, url, name, 4, 1, None, 600.0, settings)
              for _ in range(2)]
    kind, pid = recv(victim)
    assert kind == "ready"
    for conn in others:
        assert recv(conn)[0] == "ready"
    barrier = DistBarrier(name, 4, client=client)
    victim.send("go")
    assert recv(victim) == ("arriving",)
    _until(_n_waiting(barrier, 1))
    for conn in others:
        conn.send("go")
        assert recv(conn) == ("arriving",)
    _until(_n_waiting(barrier, 3))
    time.sleep(1.5)  # longer than the lease: the watchdogs keep every party alive meanwhile
    assert barrier.broken is False and barrier.n_waiting == 3
    os.kill(pid, signal.SIGKILL)
    children.procs[0].join(10.0)
    assert [recv(conn, BOUND) for conn in others] == [("broken", [])] * 2
    assert barrier.broken is True
    barrier.reset()
