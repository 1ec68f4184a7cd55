"""Edge cases of DistSemaphore, DistBoundedSemaphore, DistEvent, DistBarrier (and DistCondition
for fork): out of memory, lost barrier state, pre-fork, and counts at the edge of what Redis
keeps exactly.

- **Out of memory** (maxmemory reached under noeviction, on a private server): Redis refuses a
  script whose *first* write may use memory, and allows the writes after it. What must go on
  working then: renewals of what is held or waited on (a barrier party's and an action runner's
  lease), and everything that gives back or ends (a trip, a break by timeout or ``abort()``,
  ``reset()``, an event's ``clear()``). What needs new memory (a party that joins, ``set()``
  of an event) fails with Redis' own ``OutOfMemoryError`` and changes nothing. The memory is
  made "full" by lowering maxmemory below what the server uses: a fill that stops at the first
  refused SET leaves it a few bytes from the limit, where a small reply may bring it back under.
- **A barrier whose state was lost is not a trip**: a restart that lost the data, or a party
  stopped past its lease (the waiting state runs out with it), raises BrokenBarrierError in the
  parties that waited, never an index as if their generation had tripped; a party that missed
  a real trip's hint still finds it, also after the next generation began.
- **Pre-fork**: a child forked while the parent holds a permit, waits on an event, a barrier or
  a condition starts with a fresh session (another id, no holds, no subscriptions), does not
  act as the parent's holder, and can take its own. Every child reports through a pipe and is
  killed if it does not exit within its bound.
- **Counts**: a semaphore's count is kept as Lua numbers and Redis scores (doubles), exact up
  to 2**53. The value and ``n`` are checked by the constructor and ``release()``; a count
  raised by releases is checked by ``sem_release`` before it changes anything.
"""

from __future__ import annotations

import os
import pickle
import select
import signal
import threading
import time
import traceback
import warnings
from typing import Any, Callable, Iterator, List, Tuple

import faults
import pytest
import redis
from _support import distlock_keys, outcome, start, until

import distlock
from distlock import DistBarrier, DistBoundedSemaphore, DistEvent, DistSemaphore
from distlock._primitives.semaphore import MAX_PERMITS
from distlock._session.session import reset_sessions, session_for
from distlock.testing.server import RedisServer

Broken = threading.BrokenBarrierError
OOM = redis.exceptions.OutOfMemoryError

#: lease 1 s renewed every 0.3 s, waiters look every 0.5 s: several leases fit in a few seconds.
FAST = {"lease": 1.0, "renew_interval": 0.3, "wait_cap": 0.5}
#: FAST with 2.7 s of slack for the renewals of a forked child, whose watchdog starts afresh:
#: under the load of several suites at once, a child's barrier party outlived 0.7 s of slack
#: unrenewed, and the barrier never saw its second party
FORKED = {**FAST, "lease": 3.0}


# --- out of memory --------------------------------------------------------------------------

class Tight:
    """A private redis-server under ``noeviction`` whose memory can be made full and freed."""

    def __init__(self, client: Any) -> None:
        self.client = client

    def full(self) -> None:
        # Far below what any server uses, so no freed buffer can bring it back under the limit
        # (a limit a few KB below the usage made some runs flaky).
        self.client.config_set("maxmemory", 1)
        with pytest.raises(OOM):
            self.client.set("distlock-test:probe", "x")

    def free(self) -> None:
        self.client.config_set("maxmemory", 0)


@pytest.fixture
def tight(client: Any) -> Iterator[Tight]:
    """(Needs ``client`` for its clean-up: settings reset, distlock threads gone.)"""
    with RedisServer(extra_args=["--maxmemory-policy", "noeviction"]) as server:
        full = redis.Redis.from_url(server.url)
        try:
            yield Tight(full)
        finally:
            reset_sessions()
            full.close()


def _party(client: Any, name: str, parties: int, timeout: float,
           action: Any = None) -> Callable[[], Any]:
    def wait() -> Any:
        try:
            return DistBarrier(name, parties, action, client=client).wait(timeout)
        except Broken:
            return "broken"
    return wait


def _renewal_failures(caplog: pytest.LogCaptureFixture) -> List[str]:
    return [r.getMessage() for r in caplog.records if "renew" in r.getMessage()]


@pytest.mark.real_redis
@pytest.mark.parametrize("end", ["abort", "timeout", "reset"])
def test_barrier_out_of_memory_parties_keep_waiting_and_the_generation_can_end(
        tight: Tight, caplog: pytest.LogCaptureFixture, end: str) -> None:
    """Two of four parties wait when the memory fills up. Their leases are renewed through
    several leases (a renewal that failed would let the waiting state run out, and the parties
    would take that for a trip); a party that would join now fails with OutOfMemoryError and
    changes nothing; and the generation still ends, out of memory: by ``abort()``, by a
    party's timeout, or by ``reset()``, with BrokenBarrierError in every waiter."""
    distlock.configure(**FAST)
    name = f"oom-bar-{end}"
    full = tight.client
    timeouts = [3.5, 30.0] if end == "timeout" else [30.0, 30.0]
    waiting = [start(_party(full, name, 4, t), f"party-{i}") for i, t in enumerate(timeouts)]
    barrier = DistBarrier(name, 4, client=full)
    until(lambda: barrier.n_waiting == 2)
    tight.full()
    started = time.monotonic()
    time.sleep(FAST["lease"] * 2.5)  # renewals, and looks, out of memory
    assert not any(p.ended_at for p in waiting), [(p.result, p.error) for p in waiting]
    assert (barrier.broken, barrier.n_waiting) == (False, 2)
    assert _renewal_failures(caplog) == []
    with pytest.raises(OOM):  # joining needs memory: refused, nothing changed
        DistBarrier(name, 4, client=full).wait(timeout=5)
    assert (barrier.broken, barrier.n_waiting) == (False, 2)

    if end == "abort":
        barrier.abort()
    elif end == "reset":
        barrier.reset()
    for party in waiting:
        party.finish(30)
        assert party.error is None, repr(party.error)
        assert party.result == "broken"
    if end == "timeout":
        assert waiting[0].ended_at - started >= 3.5 - 2 * FAST["lease"]
    assert barrier.broken is (end != "reset")
    barrier.reset()  # out of memory too
    assert (barrier.broken, barrier.n_waiting) == (False, 0)
    tight.free()  # and the barrier works as before
    again = [start(_party(full, name, 4, 10.0), f"again-{i}") for i in range(4)]
    assert sorted(p.finish(30).result for p in again) == [0, 1, 2, 3]


@pytest.mark.real_redis
def test_barrier_out_of_memory_last_party_runs_the_action_and_trips(
        tight: Tight, caplog: pytest.LogCaptureFixture) -> None:
    """The last party arrives out of memory: it runs the action (longer than its lease: the
    runner's renewals go through) and the generation trips; the action ran exactly once."""
    distlock.configure(**FAST)
    name = "oom-bar-action"
    full = tight.client
    ran: List[float] = []

    def action() -> None:
        ran.append(time.monotonic())
        time.sleep(FAST["lease"] * 2.5)

    waiting = [start(_party(full, name, 3, 30.0, action), f"party-{i}") for i in range(2)]
    barrier = DistBarrier(name, 3, action, client=full)
    until(lambda: barrier.n_waiting == 2)
    tight.full()
    last = barrier.wait(timeout=30)
    for party in waiting:
        party.finish(30)
        assert party.error is None, repr(party.error)
    assert sorted([last, *(p.result for p in waiting)]) == [0, 1, 2]
    assert len(ran) == 1
    assert _renewal_failures(caplog) == []
    assert barrier.broken is False


@pytest.mark.real_redis
def test_event_out_of_memory_wait_and_clear(tight: Tight) -> None:
    """Out of memory: ``clear()``, ``is_set()``, ``wait()`` on a set event and ``wait(0)``
    work; ``set()`` and a new waiter's entry need memory and fail with OutOfMemoryError,
    changing nothing. A waiter that waited when
    the memory filled up either goes on waiting (and a later ``set()`` wakes it) or raises
    OutOfMemoryError, leaving no entry behind: never a wrong True or False."""
    distlock.configure(**FAST)
    full = tight.client
    ready, idle = DistEvent("oom-ev-set", client=full), DistEvent("oom-ev-unset", client=full)
    ready.set()

    def wait() -> Any:
        try:
            return idle.wait(30)
        except OOM:
            return "OutOfMemoryError"

    waiter = start(wait, "event-waiter")
    until(lambda: full.zcard(idle._keys.waiters) == 1)
    tight.full()
    assert ready.wait(5) is True and ready.is_set() is True
    ready.clear()
    assert ready.is_set() is False and full.exists(ready._keys.flag) == 0
    assert ready.wait(0) is False  # a look
    with pytest.raises(OOM):  # a new waiter's entry needs memory
        ready.wait(0.2)
    assert full.zcard(ready._keys.waiters) == 0
    with pytest.raises(OOM):
        idle.set()
    assert full.exists(idle._keys.flag) == 0
    time.sleep(FAST["wait_cap"] * 4)  # several looks of the waiter, out of memory
    if waiter.ended_at:
        assert waiter.error is None and waiter.result == "OutOfMemoryError", \
            (waiter.result, waiter.error)
        assert full.zcard(idle._keys.waiters) == 0, "a failed waiter left its entry behind"
    tight.free()
    idle.set()
    waiter.finish(30)
    assert waiter.error is None, repr(waiter.error)
    assert waiter.result in (True, "OutOfMemoryError")
    idle.clear()
    until(lambda: distlock_keys(full) == [])


# --- a barrier whose state was lost is not a trip -------------------------------------------

@pytest.mark.real_redis
def test_barrier_restart_while_parties_wait_is_not_a_trip(backend: Any, client: Any) -> None:
    """Two of three parties wait; the server restarts and loses the data. Nothing shows that
    their generation tripped (it did not), so none of them returns an index: each raises
    BrokenBarrierError (or ConnectionError, if it looked while the server was down)."""
    distlock.configure(**FAST)
    name = "restart-bar"

    def party() -> Any:
        try:
            return DistBarrier(name, 3, client=client).wait(timeout=8.0)
        except Broken:
            return "broken"
        except redis.exceptions.ConnectionError:
            return "ConnectionError"

    waiting = [start(party, f"party-{i}") for i in range(2)]
    barrier = DistBarrier(name, 3, client=client)
    until(lambda: barrier.n_waiting == 2)
    faults.restart_server(backend)
    for p in waiting:
        p.finish(30)
        assert p.error is None, repr(p.error)
        assert p.result in ("broken", "ConnectionError"), f"a lost state was taken for a trip: {p.result}"
    # (both may have looked while the server was down: a slow restart on a loaded machine)


@pytest.mark.real_redis
@pytest.mark.parametrize("then", ["nothing", "next-generation"])
def test_barrier_party_stopped_past_its_lease_is_not_released(
        client: Any, url: str, children: Any, then: str) -> None:
    """The only waiting party's process is stopped (SIGSTOP) past its lease: the waiting state
    runs out with it. When it continues, nothing shows that its generation tripped (it did
    not): it raises BrokenBarrierError, also when a new generation began meanwhile."""
    import _sem_event_barrier_workers
    from _procs import recv

    name = f"stopped-bar-{then}"
    settings = {"lease": 1.0, "renew_interval": 0.25, "wait_cap": 0.5}
    distlock.configure(**settings)
    conn = children.start(_sem_event_barrier_workers.barrier_party, url, name, 2, 1, None, 30.0, settings)
    kind, pid = recv(conn)
    assert kind == "ready"
    barrier = DistBarrier(name, 2, client=client)
    conn.send("go")
    assert recv(conn) == ("arriving",)
    until(lambda: barrier.n_waiting == 1)
    os.kill(pid, signal.SIGSTOP)
    try:
        until(lambda: distlock_keys(client) == [], 10.0)  # its lease, and the state, ran out
        newcomer = None
        if then == "next-generation":
            newcomer = start(_party(client, name, 2, 30.0), "newcomer")
            until(lambda: barrier.n_waiting == 1)
    finally:
        os.kill(pid, signal.SIGCONT)
    assert recv(conn, 20.0) == ("broken", [])
    if newcomer is not None:
        assert newcomer.ended_at == 0.0  # still waiting for a second party of its own
        barrier.abort()
        assert newcomer.finish(20).result == "broken"
        barrier.reset()


def test_barrier_party_that_missed_the_hint_finds_the_trip_after_the_next_began(
        client: Any) -> None:
    """The trip's hint does not reach a waiting party, and the next generation begins before
    it looks: it still finds its own generation tripped and returns its index."""
    distlock.configure(wait_cap=2.0)  # its look comes late
    barrier = DistBarrier("missed-hint-bar", 2, client=client)
    waiter = start(_party(client, barrier.name, 2, 30.0), "waiter")
    until(lambda: barrier.n_waiting == 1)
    keys = barrier._keys
    run = session_for(client).run
    muted = (keys.state, keys.waiters, keys.broken, keys.channel + ":nowhere")
    assert run("bar_wait", muted, ("last", 30000, 2, "0", 60000))[:2] == [1, 1]
    assert run("bar_wait", muted, ("next", 30000, 2, "0", 60000))[:2] == [0, 0]
    assert waiter.finish(20).result == 0
    barrier.reset()  # the "next" party, which no process runs, goes
    assert barrier.n_waiting == 0 and barrier.broken is False


# --- pre-fork ---------------------------------------------------------------------------------

def _fork(child: Callable[[], Any]) -> Tuple[int, int]:
    """Fork; the child runs ``child()`` and sends back ("ok", result) or ("error", traceback),
    pickled, then exits without returning into pytest. Return (pid, read end of its pipe)."""
    read_fd, write_fd = os.pipe()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # fork() with threads running
        pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            os.close(read_fd)
            try:
                report = ("ok", child())
            except BaseException:  # noqa: BLE001 - reported to the parent
                report = ("error", traceback.format_exc())
            data = pickle.dumps(report)
            while data:
                data = data[os.write(write_fd, data):]
        finally:
            os._exit(0)
    os.close(write_fd)
    return pid, read_fd


def _collect(pid: int, read_fd: int, bound: float = 20.0) -> Any:
    """What the child sent, once it exited; it is killed (and the test fails) after ``bound``."""
    deadline = time.monotonic() + bound
    data = b""
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([read_fd], [], [], left)[0]:
                break
            chunk = os.read(read_fd, 65536)
            if not chunk:
                break
            data += chunk
        done, status = os.waitpid(pid, os.WNOHANG)
        while not done and time.monotonic() < deadline:
            time.sleep(0.02)
            done, status = os.waitpid(pid, os.WNOHANG)
        if not done:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            pytest.fail(f"the forked child did not finish within {bound} s")
    finally:
        os.close(read_fd)
    assert os.waitstatus_to_exitcode(status) == 0
    kind, result = pickle.loads(data)
    assert kind == "ok", result
    return result


def _fresh(client: Any, parent_id: str) -> Tuple[bool, int, List[str]]:
    """In a child: (its session is not the parent's, its holds, its subscriptions)."""
    session = session_for(client)
    return session.id != parent_id, len(session.holds), session.subscribed_channels()


@pytest.mark.real_redis
@pytest.mark.parametrize("cls", [DistSemaphore, DistBoundedSemaphore],
                         ids=["DistSemaphore", "DistBoundedSemaphore"])
def test_fork_semaphore_child_owns_nothing_and_takes_its_own(client: Any, cls: Any) -> None:
    """The parent holds one of two permits and forks.

    The child starts with a fresh session and holds nothing; it takes the free permit, its own,
    and its first ``release()`` gives back that one. Its second ``release()`` is a release by a
    process that holds no permit, which the contract defines: a DistSemaphore's permits are not
    owned by threads (any thread anywhere may release, as in ``threading``), so it gives back
    the permit held elsewhere whose lease runs out first, here the parent's, *on its owner's
    behalf* (recorded as handed). The parent is not told it lost it: nothing was lost, its
    watchdog just stops renewing it. The parent's own ``release()`` afterwards then does what
    threading's twin does after the same calls (two acquires, three releases): it raises the
    count, or, bounded, raises "Semaphore released too many times".

    What the child cannot do is release the parent's permit *as its own* (it does not inherit
    the parent's holds): the parent would then find its permit gone without a hand-over, a lost
    lease (``on_lost``, LockLostError on release)."""
    # A lease of 5 s, not FAST's 1 s: the child's second release gives back the parent's permit,
    # so that permit must still be live then. On a loaded machine a 1 s lease ran out between
    # two of the parent's renewals while the child started, and the bounded child's release
    # found nothing to give back ("released too many times").
    distlock.configure(**{**FAST, "lease": 5.0})
    sem = cls(f"fork-{cls.__name__}", 2, client=client)
    keys = sem._keys
    lost: List[Any] = []
    sem.on_lost(lost.append)
    assert sem.acquire(blocking=False)
    parent = session_for(client)
    (theirs,) = [owner for (key, owner) in parent.holds if key == keys.sem]

    def child() -> Any:
        fresh = _fresh(client, parent.id)
        took = sem.acquire(timeout=10)
        (own,) = [owner for (key, owner) in session_for(client).holds if key == keys.sem]
        sem.release()
        after_own = (client.zscore(keys.sem, own), client.zscore(keys.sem, theirs) is not None)
        sem.release()
        after_stranger = (client.zscore(keys.sem, theirs), client.zscore(keys.handed, theirs) is not None)
        return fresh, took, after_own, after_stranger

    assert _collect(*_fork(child)) == ((True, 0, []), True, (None, True), (None, True))
    # the parent's watchdog finds it handed over at a renewal, and drops it without a loss
    until(lambda: [owner for (key, owner) in parent.holds if key == keys.sem] == [], 15.0,
          "the parent dropping its handed permit")
    assert lost == []

    twin = (threading.BoundedSemaphore if cls is DistBoundedSemaphore else threading.Semaphore)(2)
    for call in (twin.acquire, twin.acquire, twin.release, twin.release):
        call()
    assert outcome(sem.release) == outcome(twin.release)
    free = sum(sem.acquire(blocking=False) for _ in range(4))
    assert free == sum(twin.acquire(blocking=False) for _ in range(4))
    sem.release(free)


@pytest.mark.real_redis
def test_fork_while_another_thread_picks_permits_to_release(client: Any) -> None:
    """A fork while another thread of the parent is choosing which permits to give back (under
    the module's lock) leaves the child a lock of its own, not one that stays held for ever."""
    from distlock._primitives import semaphore as _semaphore

    sem = DistSemaphore("fork-claims", 1, client=client)
    parent_id = session_for(client).id

    def child() -> Any:
        fresh = _fresh(client, parent_id)
        took = sem.acquire(timeout=10)
        sem.release()
        return fresh, took

    with _semaphore._claims:  # as another thread of the parent holds it, now and then
        forked = _fork(child)
    assert _collect(*forked, bound=15.0) == ((True, 0, []), True)
    assert sem.acquire(blocking=False) is True
    sem.release()


@pytest.mark.real_redis
def test_fork_event_child_waits_and_sets_on_its_own(client: Any) -> None:
    """A thread of the parent waits on an event when the parent forks: the child starts with a
    fresh session (not subscribed to anything), its own ``wait()`` works (and times out: the
    event is not set), and its ``set()`` wakes the parent's waiter."""
    distlock.configure(wait_cap=0.5)
    event = DistEvent("fork-event", client=client)
    waiter = start(lambda: event.wait(20), "event-waiter")
    until(lambda: client.zcard(event._keys.waiters) == 1)
    parent_id = session_for(client).id

    def child() -> Any:
        fresh = _fresh(client, parent_id)
        alone = event.wait(0.3)
        event.set()
        return fresh, alone

    assert _collect(*_fork(child)) == ((True, 0, []), False)
    assert waiter.finish(20).result is True
    event.clear()
    until(lambda: distlock_keys(client) == [])


@pytest.mark.real_redis
def test_fork_barrier_child_is_a_party_of_its_own(client: Any) -> None:
    """A thread of the parent waits on a barrier of three when the parent forks: the child does
    not inherit that party (no holds); its own ``wait()`` is the second party, and the parent's
    main thread the third: three distinct indices."""
    distlock.configure(**FORKED)
    name = "fork-barrier"
    barrier = DistBarrier(name, 3, client=client)
    waiting = start(_party(client, name, 3, 20.0), "party")
    until(lambda: barrier.n_waiting == 1)
    parent_id = session_for(client).id

    def child() -> Any:
        return _fresh(client, parent_id), barrier.wait(timeout=20)

    forked = _fork(child)
    until(lambda: barrier.n_waiting == 2)
    last = barrier.wait(timeout=20)
    fresh, index = _collect(*forked)
    assert fresh == (True, 0, [])
    assert sorted([last, index, waiting.finish(20).result]) == [0, 1, 2]


@pytest.mark.real_redis
def test_fork_condition_child_owns_nothing_and_notifies_with_its_own_lock(client: Any) -> None:
    """A thread of the parent waits on a condition when the parent forks: in the child the lock
    is not owned (``notify()`` and ``release()`` raise RuntimeError, as threading's), its own
    ``wait()`` works, and once it takes the lock its ``notify()`` wakes the parent's waiter."""
    distlock.configure(**FORKED)
    cond = distlock.DistCondition("fork-cond", client=client)

    def wait() -> Any:
        with cond:
            return cond.wait(20)

    waiter = start(wait, "cond-waiter")
    until(lambda: client.zcard(cond._keys.queue) == 1)
    parent_id = session_for(client).id

    def child() -> Any:
        fresh = _fresh(client, parent_id)
        refused = [outcome(cond.notify)[0], outcome(cond.release)[0]]
        with cond:
            alone = cond.wait(0.3)  # its own wait: nobody notifies it
            cond.notify()  # the parent's waiter, the only one left
        return fresh, refused, alone

    assert _collect(*_fork(child)) == ((True, 0, []), ["RuntimeError", "LockNotOwnedError"], False)
    assert waiter.finish(20).result is True
    # Only the lock's fencing counter stays, for good.
    until(lambda: distlock_keys(client) == [cond._lock._keys.fence])


# --- counts at the edge of what Redis keeps exactly ------------------------------------------

@pytest.mark.parametrize("value", [MAX_PERMITS, 0, 1, 12345])
def test_semaphore_count_is_exact_up_to_2_53_minus_1_and_refused_above(client: Any,
                                                                       value: int) -> None:
    """threading.Semaphore counts without a limit; a DistSemaphore's count lives in doubles,
    exact up to 2**53 - 1. Raised there (by its value, or by releases without acquires), it is
    kept exactly; a release that would take it higher raises OverflowError and changes
    nothing, also when ``n`` alone is within bounds; a release within bounds still works."""
    sem = DistSemaphore(f"edge-{value}", value, client=client, lease=30.0)
    if value < MAX_PERMITS:
        before = faults.keyspace(client)
        with pytest.raises(OverflowError, match=r"2\*\*53 - 1"):  # (n itself, for value 0)
            sem.release(MAX_PERMITS - value + 1)
        assert faults.keyspace(client) == before
        sem.release(MAX_PERMITS - value)
    assert sem.acquire(blocking=False) is True
    assert sem._seen == MAX_PERMITS - 1  # exact: one less
    sem.release()
    assert sem._seen == MAX_PERMITS
    before = faults.keyspace(client)
    for n in (1, 2, MAX_PERMITS):
        with pytest.raises(OverflowError, match=r"^semaphore count would go above 2\*\*53 - 1"):
            sem.release(n)
        assert faults.keyspace(client) == before
    assert sem.acquire(blocking=False) is True  # one held: giving it back is within bounds,
    with pytest.raises(OverflowError):  # one more is not
        sem.release(2)
    sem.release()
    assert sem._seen == MAX_PERMITS
    assert faults.keyspace(client) == before


def test_bounded_semaphore_at_2_53_minus_1(client: Any) -> None:
    """A bounded semaphore never goes above its value: at the largest value, a release too
    many is threading's ValueError, not an OverflowError."""
    sem = DistBoundedSemaphore("edge-bounded", MAX_PERMITS, client=client, lease=30.0)
    assert sem.acquire(blocking=False) is True and sem._seen == MAX_PERMITS - 1
    sem.release()
    assert sem._seen == MAX_PERMITS
    with pytest.raises(ValueError, match="^Semaphore released too many times$"):
        sem.release()
    assert distlock_keys(client) == []
