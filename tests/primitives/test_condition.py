"""DistCondition: threading.Condition's contract, and what must hold across processes.

Timing is never asserted except as loose upper bounds (a hang fails, a slow machine does not):
every check is an ordering or a count. Where the contract is "as threading does", the same call
runs on a real ``threading.Condition`` and the outcomes are compared.
"""

from __future__ import annotations

import math
import multiprocessing
import os
import queue
import random
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from typing import Any, Callable, Dict, Iterator, List, Optional, Set, Tuple

import _cond_workers
import pytest
from _support import scan_keys
from redis.crc import key_slot

import distlock
from distlock import DistCondition, DistLock, DistRLock, LockLostError
from distlock._core.checks import check_wait_timeout
from distlock._core.keys import CondKeys
from distlock._primitives.condition import notify_count
from distlock._session.session import session_for, wake_idents

SPAWN = multiprocessing.get_context("spawn")

#: The loosest upper bound on anything that should be quick: only a hang fails it.
BOUND = 20.0


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def _join(threads: List[threading.Thread]) -> None:
    for thread in threads:
        thread.join(BOUND)
    assert not [t for t in threads if t.is_alive()], "threads did not finish"


def _keys(client: Any) -> Set[bytes]:
    return set(scan_keys(client, "distlock:*"))


# --- a crowd of waiters, in threads or processes ----------------------------------------------

class Crowd:
    """Waiters (``_cond_workers.waiter``) in threads or spawned processes, each on a pipe."""

    def __init__(self, mode: str, client: Any, url: Optional[str], cond_name: str,
                 settings: Optional[Dict[str, float]] = None) -> None:
        self.mode = mode
        self.client = client
        self.url = url
        self.cond_name = cond_name
        self.settings = settings
        self.conns: Dict[str, Any] = {}
        self.runners: Dict[str, Any] = {}
        self.pids: Dict[str, int] = {}
        self.unread: Dict[str, Any] = {}

    def spawn(self, label: str) -> None:
        parent, child = SPAWN.Pipe()
        if self.mode == "process":
            runner: Any = SPAWN.Process(target=_cond_workers.waiter,
                                        args=(self.url, self.cond_name, label, child, self.settings),
                                        daemon=True)
        else:
            runner = threading.Thread(target=_cond_workers.waiter,
                                      args=(self.client, self.cond_name, label, child, None),
                                      daemon=True)
        runner.start()
        self.conns[label] = parent
        self.runners[label] = runner

    def ready(self, label: str) -> None:
        kind, got, pid = self.recv(label, 60.0)
        assert (kind, got) == ("ready", label)
        self.pids[label] = pid

    def go(self, label: str, waits: int, timeout: float = 60.0) -> None:
        self.conns[label].send(("go", waits, timeout))

    def recv(self, label: str, timeout: float = BOUND) -> Any:
        if label in self.unread:
            return self.unread.pop(label)
        conn = self.conns[label]
        assert conn.poll(timeout), f"{label} sent nothing within {timeout} s"
        return conn.recv()

    def pending(self, label: str) -> bool:
        """True when ``label`` has sent a message not read yet (a closed pipe is not one)."""
        conn = self.conns[label]
        if not conn.poll(0):
            return False
        try:
            self.unread[label] = conn.recv()
        except EOFError:
            return False
        return True

    def close(self) -> None:
        for conn in self.conns.values():
            conn.close()
        for runner in self.runners.values():
            runner.join(10.0)
        for runner in self.runners.values():
            if isinstance(runner, threading.Thread):
                continue
            if runner.is_alive():
                runner.kill()
                runner.join(10.0)


@pytest.fixture
def crowd_factory(client: Any, backend: Any) -> Iterator[Callable[..., Crowd]]:
    made: List[Crowd] = []

    def make(mode: str, cond_name: str, settings: Optional[Dict[str, float]] = None) -> Crowd:
        if mode == "process" and backend.url is None:
            pytest.skip("needs a real redis-server: other processes cannot reach fakeredis")
        crowd = Crowd(mode, client, backend.url, cond_name, settings)
        made.append(crowd)
        return crowd

    try:
        yield make
    finally:
        for crowd in made:
            crowd.close()


# --- the threading contract -------------------------------------------------------------------

def _conditions(client: Any) -> Dict[str, Callable[[], Any]]:
    return {
        "threading.Condition": threading.Condition,
        "DistCondition": lambda: DistCondition(_name("contract"), client=client),
        "DistCondition(DistLock)": lambda: DistCondition(
            _name("contract"), DistLock(_name("lock"), client=client)),
        "DistCondition(threading.Lock)": lambda: DistCondition(
            _name("contract"), threading.Lock(), client=client),
    }


CONDITION_IDS = ["threading.Condition", "DistCondition", "DistCondition(DistLock)",
                 "DistCondition(threading.Lock)"]


@pytest.mark.cluster_too
@pytest.mark.sentinel_too
@pytest.mark.parametrize("kind", CONDITION_IDS)
def test_misuse_wording(client: Any, kind: str) -> None:
    cond = _conditions(client)[kind]()
    with pytest.raises(RuntimeError, match=r"^cannot wait on un-acquired lock$"):
        cond.wait()
    with pytest.raises(RuntimeError, match=r"^cannot wait on un-acquired lock$"):
        cond.wait(0)
    with pytest.raises(RuntimeError, match=r"^cannot notify on un-acquired lock$"):
        cond.notify()
    with pytest.raises(RuntimeError, match=r"^cannot notify on un-acquired lock$"):
        cond.notify_all()
    with pytest.raises(RuntimeError, match=r"^cannot wait on un-acquired lock$"):
        cond.wait_for(lambda: False)


@pytest.mark.cluster_too
@pytest.mark.sentinel_too
@pytest.mark.parametrize("kind", CONDITION_IDS)
def test_misuse_from_another_thread(client: Any, kind: str) -> None:
    """Held by one thread, a reentrant lock is not another thread's (a plain Lock is anyone's)."""
    cond = _conditions(client)[kind]()
    errors: List[str] = []
    with cond:
        def other() -> None:
            try:
                cond.notify()
                errors.append("notify passed")
            except RuntimeError as exc:
                errors.append(str(exc))
        thread = threading.Thread(target=other)
        thread.start()
        _join([thread])
    if kind in ("threading.Condition", "DistCondition"):  # RLock-based: owned by one thread
        assert errors == ["cannot notify on un-acquired lock"]
    else:  # threading.Condition(Lock()) accepts any thread while the lock is held; so do we
        assert errors == ["notify passed"]


def _outcome(fn: Callable[[], Any]) -> Tuple[str, str]:
    try:
        return "value", repr(fn())
    except Exception as exc:  # noqa: BLE001 - compared with threading's
        return type(exc).__name__, str(exc)


@pytest.mark.parametrize("timeout", [0, 0.0, -1, -0.5, math.nan, -math.inf, False,
                                     "1", b"1", [], math.inf, 1e300, 10 ** 30])
def test_wait_timeout_arguments_match_threading(client: Any, timeout: Any) -> None:
    twin = threading.Condition()
    cond = DistCondition(_name("timeout-args"), client=client)
    with twin:
        expected = _outcome(lambda: twin.wait(timeout))
    with cond:
        got = _outcome(lambda: cond.wait(timeout))
        assert cond._lock._recursion_count() == 1
    assert got == expected
    assert _keys(client) <= {f"distlock:{{{cond.name}}}:fence".encode()}


def test_wait_timeout_logic() -> None:
    assert check_wait_timeout(None) is None
    assert check_wait_timeout(0.25) == 0.25
    assert check_wait_timeout(True) == 1.0
    for value in (0, -3, math.nan, -math.inf):
        assert check_wait_timeout(value) == 0.0
    with pytest.raises(OverflowError):
        check_wait_timeout(math.inf)
    with pytest.raises(TypeError):
        check_wait_timeout("1")


def test_notify_count_logic() -> None:
    assert notify_count(1) == 1
    assert notify_count(3) == 3
    assert notify_count(1.5) == 2
    assert notify_count(True) == 1
    for value in (0, -1, math.nan, -math.inf, 0.0, False):
        assert notify_count(value) == 0
    assert notify_count(math.inf) is None
    assert notify_count(10 ** 40) is None
    with pytest.raises(TypeError):
        notify_count("2")


def _start_waiters(cond: Any, count: int, timeout: float, results: queue.Queue[Any],
                   label: str = "w") -> List[threading.Thread]:
    """Start ``count`` waiting threads, one after the other: each has joined the queue (the
    lock could be taken after its wait began) before the next starts."""
    threads = []
    for i in range(count):
        started = threading.Event()

        def run(i: int = i, started: threading.Event = started) -> None:
            with cond:
                started.set()
                results.put((f"{label}{i}", cond.wait(timeout)))

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        assert started.wait(BOUND)
        with cond:  # only free once that waiter is inside wait(), queued
            pass
        threads.append(thread)
    return threads


def _collect(results: queue.Queue[Any], count: int) -> List[Any]:
    return [results.get(timeout=BOUND) for _ in range(count)]


@pytest.mark.cluster_too
@pytest.mark.sentinel_too
@pytest.mark.parametrize("kind", CONDITION_IDS)
@pytest.mark.parametrize("n,woken", [(1, 1), (2, 2), (1.5, 2), (0, 0), (-1, 0), (math.nan, 0),
                                     (7, 3), (math.inf, 3)])
def test_notify_n_wakes_oldest(client: Any, kind: str, n: Any, woken: int) -> None:
    cond = _conditions(client)[kind]()
    results: queue.Queue[Any] = queue.Queue()
    threads = _start_waiters(cond, 3, 60.0, results)
    try:
        with cond:
            cond.notify(n)
        got = _collect(results, woken)
        # oldest first; which of the woken returns first is up to the lock
        assert sorted(got) == [(f"w{i}", True) for i in range(woken)]
        with cond:
            assert results.empty()
    finally:
        with cond:
            cond.notify_all()
        _join(threads)
    assert sorted(_collect(results, 3 - woken)) == [(f"w{i}", True) for i in range(woken, 3)]


@pytest.mark.cluster_too
@pytest.mark.sentinel_too
@pytest.mark.parametrize("kind", CONDITION_IDS)
def test_notify_bad_type_with_waiters(client: Any, kind: str) -> None:
    cond = _conditions(client)[kind]()
    results: queue.Queue[Any] = queue.Queue()
    threads = _start_waiters(cond, 1, 60.0, results)
    try:
        with cond:
            with pytest.raises(TypeError):
                cond.notify("1")
    finally:
        with cond:
            cond.notify_all()
        _join(threads)


@pytest.mark.cluster_too
@pytest.mark.sentinel_too
@pytest.mark.parametrize("kind", CONDITION_IDS)
def test_wait_returns_false_on_timeout(client: Any, kind: str) -> None:
    cond = _conditions(client)[kind]()
    with cond:
        t0 = time.monotonic()
        assert cond.wait(0.2) is False
        assert time.monotonic() - t0 >= 0.2
        assert cond.wait(0) is False
        assert cond.wait(-1) is False
        assert cond.wait_for(lambda: 0, timeout=0.1) == 0
        assert cond.wait_for(lambda: "yes", timeout=0.1) == "yes"
        assert cond.wait_for(lambda: [], 0) == []


def test_notify_all_deprecated_alias(client: Any) -> None:
    cond = DistCondition(_name("alias"), client=client)
    with cond:
        with pytest.warns(DeprecationWarning, match="notifyAll"):
            cond.notifyAll()


def test_repr_like_threading(client: Any) -> None:
    cond = DistCondition(_name("repr"), client=client)
    assert re.fullmatch(r"<DistCondition\(<unlocked distlock\.DistRLock object name='repr-\w+' "
                        r"owner=0 count=0 at 0x[0-9a-f]+>, 0\)>", repr(cond)), repr(cond)
    assert re.fullmatch(r"<Condition\(<unlocked _thread\.RLock object owner=0 count=0 at 0x[0-9a-f]+>, 0\)>",
                        repr(threading.Condition()))
    results: queue.Queue[Any] = queue.Queue()
    threads = _start_waiters(cond, 2, 60.0, results)
    try:
        assert repr(cond).endswith(", 2)>")
    finally:
        with cond:
            cond.notify_all()
        _join(threads)
    assert repr(cond).endswith(", 0)>")


def test_constructor(client: Any) -> None:
    cond = DistCondition("ctor", client=client)
    assert cond.name == "ctor"
    assert isinstance(cond._lock, DistRLock) and cond._lock.name == "ctor"
    assert cond.acquire == cond._lock.acquire and cond.release == cond._lock.release
    with pytest.raises(TypeError):
        DistCondition(42)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        DistCondition("")
    with pytest.raises(TypeError):
        DistCondition("ctor", client=3.5)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        DistCondition("ctor", None, client)  # type: ignore[misc]  # client is keyword-only
    assert "DistCondition" in distlock.__all__ and distlock.DistCondition is DistCondition
    with cond as entered:
        assert entered is True
        assert cond._is_owned()
    assert not cond._is_owned()


# --- locks ------------------------------------------------------------------------------------

def _lock_factories(client: Any) -> Dict[str, Callable[[str], Any]]:
    factories: Dict[str, Callable[[str], Any]] = {
        "DistRLock": lambda name: DistRLock(name, client=client),
        "DistLock": lambda name: DistLock(name, client=client),
        "threading.Lock": lambda name: threading.Lock(),
        "threading.RLock": lambda name: threading.RLock(),
    }
    rw = getattr(distlock, "DistReadWriteLock", None)
    if rw is not None:
        factories["DistReadWriteLock.write_lock"] = lambda name: rw(name, client=client).write_lock()
    return factories


LOCK_IDS = ["DistRLock", "DistLock", "threading.Lock", "threading.RLock",
            "DistReadWriteLock.write_lock"]


@pytest.mark.parametrize("lock_id", LOCK_IDS)
def test_wait_notify_with_lock_type(client: Any, lock_id: str) -> None:
    factories = _lock_factories(client)
    if lock_id not in factories:
        pytest.skip(f"{lock_id} is not in this build")
    lock = factories[lock_id](_name("lock"))
    # a Dist lock lends the condition its client; a threading lock needs one given
    dist = not lock_id.startswith("threading")
    cond = DistCondition(_name("cond"), lock) if dist else DistCondition(_name("cond"), lock, client=client)
    results: queue.Queue[Any] = queue.Queue()
    threads = _start_waiters(cond, 2, 60.0, results)
    if dist:
        assert {key_slot(k) for k in _keys(client) if b":cond:" in k} == {key_slot(lock._keys.lock.encode())}
    with cond:
        cond.notify()
    assert _collect(results, 1) == [("w0", True)]
    with cond:
        cond.notify()
    assert _collect(results, 1) == [("w1", True)]
    _join(threads)
    with cond:
        assert cond.wait(0.05) is False
        assert cond._is_owned()
    leftover = {k for k in _keys(client) if b":cond:" in k}
    assert leftover == set()


@pytest.mark.parametrize("lock_id", ["DistRLock", "threading.RLock", "DistReadWriteLock.write_lock"])
def test_wait_releases_every_level_and_restores_it(client: Any, lock_id: str) -> None:
    factories = _lock_factories(client)
    if lock_id not in factories:
        pytest.skip(f"{lock_id} is not in this build")
    lock = factories[lock_id](_name("deep"))
    cond = DistCondition(_name("deep"), lock, client=client)
    entered = threading.Event()
    got_in: List[bool] = []
    results: List[bool] = []

    def other() -> None:
        assert entered.wait(BOUND)
        got_in.append(lock.acquire(timeout=BOUND))  # the waiter released all three levels
        cond.notify()
        lock.release()

    thread = threading.Thread(target=other)
    thread.start()
    try:
        for _ in range(3):
            lock.acquire()
        entered.set()
        results.append(cond.wait(BOUND))
        if hasattr(lock, "_recursion_count"):
            assert lock._recursion_count() == 3
        for _ in range(3):
            lock.release()
        with pytest.raises(RuntimeError):
            lock.release()
    finally:
        _join([thread])
    assert got_in == [True] and results == [True]


def test_keys_share_the_locks_slot_and_go_away(client: Any) -> None:
    lock = DistRLock(_name("slot-lock"), client=client)
    cond = DistCondition(_name("slot-cond"), lock)
    results: queue.Queue[Any] = queue.Queue()
    threads = _start_waiters(cond, 1, 60.0, results)
    try:
        keys = _keys(client)
        cond_keys = {k for k in keys if b":cond:" in k}
        assert len(cond_keys) == 2  # the queue and the leases
        tag = f"distlock:{{{lock.name}}}:cond:".encode()
        assert all(k.startswith(tag) for k in cond_keys)
        slots = {key_slot(k) for k in keys} | {key_slot(cond._keys.channel.encode())}
        assert len(slots) == 1
        assert all(client.pttl(k) > 0 for k in cond_keys)  # nothing is left for ever
    finally:
        with cond:
            cond.notify()
        _join(threads)
    assert _collect(results, 1) == [("w0", True)]
    assert _keys(client) == {f"distlock:{{{lock.name}}}:fence".encode()}


def test_cond_keys_are_distinct() -> None:
    base = distlock._core.keys.Keys("distlock:", "n")
    a = CondKeys.of(base, "x")
    b = CondKeys.of(base, "x:q")
    names = [*a.state, a.channel, *b.state, b.channel, base.lock, base.fence, base.channel]
    assert len(set(names)) == len(names)


def test_wait_with_a_lost_lock_raises_and_joins_nothing(client: Any) -> None:
    lock = DistRLock(_name("short"), client=client, lease=0.5)
    cond = DistCondition(_name("short"), lock)
    lock.acquire()
    deadline = time.monotonic() + BOUND
    while lock.locked() and time.monotonic() < deadline:  # the explicit lease runs out
        time.sleep(0.05)
    with pytest.raises(LockLostError):
        cond.wait(1.0)
    assert not lock.owned()
    assert {k for k in _keys(client) if b":cond:" in k} == set()


def test_wake_idents_payload() -> None:
    assert wake_idents("=a:1,b:2") == {"a:1", "b:2"}
    assert wake_idents("1") is None and wake_idents("*") is None and wake_idents(None) is None


# --- the exact-count scenario, across threads and processes ------------------------------------

def _await_woken(crowd: Crowd, expected: Dict[str, int], rewaits: Set[str]) -> None:
    """Each label in ``expected`` reports that wait number ``expected[label]`` returned True;
    those in ``rewaits`` then report their next wait."""
    for label, k in expected.items():
        assert crowd.recv(label) == ("woke", label, k, True)
        if label in rewaits:
            assert crowd.recv(label) == ("waiting", label, k + 1)
        else:
            assert crowd.recv(label) == ("done", label)


@pytest.mark.parametrize("mode", [
    "thread", pytest.param("process", marks=[pytest.mark.real_redis, pytest.mark.slow])])
def test_notify_n_phases(client: Any, crowd_factory: Callable[..., Crowd], mode: str) -> None:
    """notify(3) of 5; then notify(5) with some in their second wait; then notify_all; then a
    late waiter is not woken. Every phase checks who woke, and who did not."""
    name = _name("phases")
    cond = DistCondition(name, client=client)
    crowd = crowd_factory(mode, name)
    plan = {"A": 2, "B": 2, "C": 1, "D": 2, "E": 1, "F": 1}
    for label in plan:
        crowd.spawn(label)
    for label in plan:
        crowd.ready(label)

    def queued() -> int:
        return int(client.zcard(cond._keys.queue))

    # Five waiters join one after the other: A is the oldest.
    for label in "ABCDE":
        crowd.go(label, plan[label])
        assert crowd.recv(label) == ("waiting", label, 0)
        with cond:  # taken only once that waiter has released it inside wait()
            pass
    assert queued() == 5

    # Phase 1: notify(3) wakes A, B and C, not D or E. A and B wait again.
    with cond:
        cond.notify(3)
    _await_woken(crowd, {"A": 0, "B": 0, "C": 0}, rewaits={"A", "B"})
    with cond:  # A and B are queued again (each sent "waiting" while holding the lock)
        assert not crowd.pending("D") and not crowd.pending("E")
        assert queued() == 4

    # Phase 2: notify(5) wakes the 4 waiting: D and E (first wait), A and B (second wait).
    with cond:
        cond.notify(5)
    _await_woken(crowd, {"D": 0, "E": 0, "A": 1, "B": 1}, rewaits={"D"})
    crowd.go("F", plan["F"])
    assert crowd.recv("F") == ("waiting", "F", 0)
    with cond:
        assert queued() == 2  # D (second wait) and F

    # Phase 3: notify_all wakes exactly those two; a waiter that starts afterwards stays.
    with cond:
        cond.notify_all()
        late: queue.Queue[Any] = queue.Queue()
        late_thread = threading.Thread(target=lambda: late.put(_late_wait(cond)))
        late_thread.start()
    _await_woken(crowd, {"D": 1, "F": 0}, rewaits=set())
    _join([late_thread])
    assert late.get_nowait() is False
    for label in plan:
        assert not crowd.pending(label)
    assert {k for k in _keys(client) if b":cond:" in k} == set()


def _late_wait(cond: DistCondition) -> bool:
    with cond:
        return cond.wait(0.5)


# --- wait_for over shared Redis state, across processes ----------------------------------------

@pytest.mark.real_redis
@pytest.mark.slow
def test_wait_for_shared_state_across_processes(url: str, client: Any) -> None:
    name = _name("shared")
    counter = f"test:{name}:counter"
    cond = DistCondition(name, client=client)
    with SPAWN.Pool(3) as pool:
        pending = pool.starmap_async(_cond_workers.producer, [(url, name, counter, 4, 0.02)] * 3)
        with cond:
            seen: List[int] = []

            def enough() -> Any:
                value = int(client.get(counter) or 0)
                seen.append(value)
                return value if value >= 12 else 0

            assert cond.wait_for(enough, timeout=60) == 12
            assert cond.wait_for(lambda: int(client.get(counter) or 0) > 12, timeout=0.3) is False
        assert pending.get(timeout=60) == [4, 4, 4]
    assert seen == sorted(seen)  # the predicate saw the counter grow, under the lock
    client.delete(counter)


def test_wait_for_timeout_counts_the_whole_wait(client: Any) -> None:
    cond = DistCondition(_name("wait-for"), client=client)
    calls: List[float] = []
    stop = threading.Event()

    def pester() -> None:  # notifies (needlessly) every 50 ms: wait_for must still time out
        while not stop.is_set():
            with cond:
                cond.notify_all()
            stop.wait(0.05)

    thread = threading.Thread(target=pester)
    thread.start()
    try:
        with cond:
            t0 = time.monotonic()
            assert cond.wait_for(lambda: calls.append(time.monotonic()), timeout=0.5) is None
            assert time.monotonic() - t0 >= 0.5
    finally:
        stop.set()
        _join([thread])
    assert len(calls) >= 2


# --- timeout against notify, many times --------------------------------------------------------

def test_timeout_vs_notify_race(client: Any) -> None:
    """A waiter times out just as a notifier picks it. Either the notify picked it and wait()
    returns True (the notification is used), or the notify found nobody and wait() returns
    False: never a picked waiter that reports a timeout, never a notification left over."""
    cond = DistCondition(_name("race"), client=client)
    rng = random.Random(4)
    outcomes = {True: 0, False: 0}
    for _ in range(120):
        timeout = rng.uniform(0.001, 0.006)
        delay = rng.uniform(0.0, 0.008)
        result: List[bool] = []
        entered = threading.Event()

        def wait_once(entered: threading.Event = entered, result: List[bool] = result,
                      timeout: float = timeout) -> None:
            with cond:
                entered.set()
                result.append(cond.wait(timeout))

        thread = threading.Thread(target=wait_once)
        thread.start()
        assert entered.wait(BOUND)
        time.sleep(delay)
        with cond:
            picked = cond._notify(1)
        _join([thread])
        assert result == [picked == 1], (timeout, delay, picked, result)
        outcomes[result[0]] += 1
        assert {k for k in _keys(client) if b":cond:" in k} == set()
    assert sum(outcomes.values()) == 120


def test_notification_found_at_the_timeout_is_used(client: Any) -> None:
    """The notify reaches Redis but its hint never arrives, so the waiter sleeps until its
    timeout; leaving the queue then finds the notification, and wait() returns True."""
    cond = DistCondition(_name("at-timeout"), client=client)
    results: queue.Queue[Any] = queue.Queue()
    threads = _start_waiters(cond, 1, 1.0, results)  # 1 s < wait_cap: no look before then
    session = session_for(client)
    keys = cond._keys
    try:
        with cond:
            assert session.run("cond_notify", (*keys.state, keys.channel + ":nowhere"), (1,)) == 1
        assert _collect(results, 1) == [("w0", True)]
    finally:
        _join(threads)
    assert {k for k in _keys(client) if b":cond:" in k} == set()


# --- failures: a killed waiter, lost hints, a dropped pub/sub connection ------------------------

@pytest.mark.real_redis
@pytest.mark.slow
def test_sigkilled_waiter_cannot_swallow_a_notification(
        client: Any, crowd_factory: Callable[..., Crowd]) -> None:
    distlock.configure(lease=1.0, renew_interval=0.25)
    name = _name("killed")
    cond = DistCondition(name, client=client)
    crowd = crowd_factory("process", name, {"lease": 1.0, "renew_interval": 0.25})
    crowd.spawn("victim")
    crowd.ready("victim")
    crowd.go("victim", 1)
    assert crowd.recv("victim", 60.0) == ("waiting", "victim", 0)
    results: queue.Queue[Any] = queue.Queue()
    threads = _start_waiters(cond, 1, 60.0, results, label="live")
    try:
        (victim_id, first_deadline), (live_id, _) = client.zrange(
            cond._keys.leases, 0, -1, withscores=True)
        assert client.zscore(cond._keys.queue, victim_id) < client.zscore(cond._keys.queue, live_id)
        # The victim's lease is renewed while it lives...
        _until(lambda: client.zscore(cond._keys.leases, victim_id) > first_deadline)
        os.kill(crowd.pids["victim"], signal.SIGKILL)
        crowd.runners["victim"].join(10.0)
        # ...and runs out after it died (server clock).
        deadline = client.zscore(cond._keys.leases, victim_id)
        _until(lambda: _server_ms(client) > deadline)
        with cond:
            assert cond._notify(1) == 1
        assert _collect(results, 1) == [("live0", True)]
        assert client.zscore(cond._keys.leases, victim_id) is None
    finally:
        with cond:
            cond.notify_all()
        _join(threads)
    assert {k for k in _keys(client) if b":cond:" in k} == set()


def _server_ms(client: Any) -> float:
    seconds, micros = client.time()
    return seconds * 1000.0 + micros / 1000.0


def _until(check: Callable[[], Any], bound: float = BOUND) -> None:
    deadline = time.monotonic() + bound
    while not check():
        assert time.monotonic() < deadline, "condition not reached within the bound"
        time.sleep(0.05)


def test_live_waiter_leases_are_renewed(client: Any) -> None:
    """With a 1 s lease, three waiters still waiting after 2.5 s are all still notifiable: the
    watchdog renews them (in one script per renewal)."""
    distlock.configure(lease=1.0, renew_interval=0.25)
    cond = DistCondition(_name("renewed"), client=client)
    results: queue.Queue[Any] = queue.Queue()
    threads = _start_waiters(cond, 3, 60.0, results)
    try:
        first = max(score for _wid, score in client.zrange(cond._keys.leases, 0, -1, withscores=True))
        _until(lambda: _server_ms(client) > first + 1500)
        with cond:
            assert cond._notify(None) == 3
    finally:
        with cond:
            cond.notify_all()
        _join(threads)
    assert sorted(_collect(results, 3)) == [("w0", True), ("w1", True), ("w2", True)]
    assert {k for k in _keys(client) if b":cond:" in k} == set()


@pytest.mark.parametrize("waiters", [1, 3])
def test_lost_hint_costs_a_bounded_delay(client: Any, waiters: int) -> None:
    """A notify whose pub/sub hint never arrives still wakes its waiter: each waiter looks at
    Redis again within a bounded time."""
    distlock.configure(wait_cap=0.1)
    cond = DistCondition(_name("lost-hint"), client=client)
    results: queue.Queue[Any] = queue.Queue()
    threads = _start_waiters(cond, waiters, 60.0, results)
    session = session_for(client)
    keys = cond._keys
    try:
        with cond:  # the notify script, with its hint sent to a channel nobody listens to
            picked = session.run("cond_notify", (*keys.state, keys.channel + ":nowhere"), (-1,))
        assert picked == waiters
        assert sorted(_collect(results, waiters)) == [(f"w{i}", True) for i in range(waiters)]
    finally:
        with cond:
            cond.notify_all()
        _join(threads)


@pytest.mark.real_redis
def test_dropped_pubsub_connection_delays_but_does_not_lose(url: str, client: Any) -> None:
    distlock.configure(wait_cap=0.2)
    cond = DistCondition(_name("dropped"), client=client)
    results: queue.Queue[Any] = queue.Queue()
    threads = _start_waiters(cond, 2, 60.0, results)
    session = session_for(client)
    try:
        before = session.pubsub_reconnects
        with cond:
            client.client_kill_filter(_type="pubsub")
            cond.notify(2)
        assert sorted(_collect(results, 2)) == [("w0", True), ("w1", True)]
        _until(lambda: session.pubsub_reconnects > before)
    finally:
        with cond:
            cond.notify_all()
        _join(threads)


# --- many threads, several processes, many rounds ------------------------------------------------

@pytest.mark.real_redis
@pytest.mark.slow
def test_every_notify_wakes_exactly_one_across_processes(
        client: Any, crowd_factory: Callable[..., Crowd]) -> None:
    """Three processes, two waits each; six notify(1): six wake-ups, one per notify."""
    name = _name("one-each")
    cond = DistCondition(name, client=client)
    crowd = crowd_factory("process", name)
    labels = ["P", "Q", "R"]
    for label in labels:
        crowd.spawn(label)
    for label in labels:
        crowd.ready(label)
        crowd.go(label, 2)
        assert crowd.recv(label, 60.0) == ("waiting", label, 0)
    with cond:
        pass
    order: List[Tuple[str, int]] = []
    for _ in range(6):
        with cond:
            assert cond._notify(1) == 1
        order.append(_next_woken(crowd, labels, cond))
    # FIFO across processes: each woken waiter queues again behind the others
    assert order == [("P", 0), ("Q", 0), ("R", 0), ("P", 1), ("Q", 1), ("R", 1)]
    for label in labels:
        assert not crowd.pending(label)


def _next_woken(crowd: Crowd, labels: List[str], cond: DistCondition) -> Tuple[str, int]:
    """The one waiter that reports a wake-up; after its next message (queued again, or done)
    the lock is taken once, so its re-wait is in the queue before the next notify."""
    deadline = time.monotonic() + BOUND
    while time.monotonic() < deadline:
        for label in labels:
            if crowd.pending(label):
                kind, got, k, ok = crowd.recv(label)
                assert (kind, got, ok) == ("woke", label, True)
                assert crowd.recv(label) in (("waiting", label, k + 1), ("done", label))
                with cond:
                    pass
                return label, k
        time.sleep(0.005)
    raise AssertionError("nobody woke")


# --- the example -------------------------------------------------------------------------------

@pytest.mark.real_redis
@pytest.mark.slow
def test_bounded_queue_example(url: str) -> None:
    example = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                           "docs", "examples", "bounded_queue.py")
    proc = subprocess.run([sys.executable, example, "--url", url, "--items", "15", "--capacity", "3"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "every item was consumed exactly once (45 of 45)" in proc.stdout
