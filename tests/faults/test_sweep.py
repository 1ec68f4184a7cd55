"""The failpoint sweep: every operation of every primitive, in both shells, on one server, on
the cluster and through Redlock, with each of its round trips failed in each of the three ways
(``distlock.testing.failpoints``: not sent, reply lost, reply too late).

Systematic, not sampled: a scenario is run once with the failpoints counting (no rule), which
lists its round trips (script, n-th call); then once per round trip and way of failing, on a
fresh name. After each step of each run, and at its end, four things are checked:

1. **belief equals Redis**: while the caller believes it holds (``owned()``, a permit's
   ``valid_for()``), a rival on another client cannot get it; once it does not, the rival can
   (a give-back still in flight is waited for, within ``SETTLE``);
2. **nothing is left**: after the releases, the name has no keys but those documented to
   stay (``ALLOWED``);
3. **no state change is sent twice**: a script whose reply was lost or late is not sent again
   with the same keys and arguments (its outcome is read, never redone);
4. **every waiter is woken within its bound**: a rival that waits for the lock from another
   thread and client while the run holds it gets it once the run has let go.

Each test runs every case of one scenario and reports all that failed at once. The steps run
with a small ``wait_cap``, and a late reply is simulated (the seam reads the reply, then
raises TimeoutError), so the sweep does not wait out real timeouts.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

import pytest
import redis
from _aio import AioRunner, SyncView

import distlock
import distlock.asyncio as aio
from distlock._redis import failpoints as seam
from distlock._session.session import all_sessions
from distlock.testing.failpoints import KINDS, LATE, LOST, FailPoints, arm

pytestmark = pytest.mark.real_redis

#: how long a give-back, a clean-up or a waiter may take to show (an upper bound, never a
#: figure a test waits out when things go right)
SETTLE = 5.0
WAITER_BOUND = 15.0
#: what a step that meets a failpoint may raise (connection errors raise, never a False)
STEP_ERRORS = (redis.RedisError, distlock.DistLockError)
#: and what a barrier's wait raises once a failed reset or abort left it broken
BROKEN = (threading.BrokenBarrierError,) + tuple(
    e for e in [getattr(asyncio, "BrokenBarrierError", None)] if e is not None)
#: what a released primitive may leave (docs/how-it-works.rst, "The keys"): a lock's
#: fencing-token counter; a barrier's record of a trip (until a lease runs out) and of
#: broken generations (until it runs out)
ALLOWED = {":fence", ":bar", ":bar:x"}


class Env:
    """One topology and one shell: makes primitives on the run's client (``make``) and on a
    rival client (``rival``), arms and activates the failpoints, lists a name's keys."""

    def __init__(self, shell: str, clients: Callable[[], Any], look: List[Any],
                 runner: Optional[AioRunner] = None, aclients: Optional[Callable[[], Any]] = None) -> None:
        self.shell = shell
        self.look = look  # blocking clients that see every key (one per Redlock master)
        self._runner = runner
        self._made: List[Any] = []
        if shell == "async":
            assert runner is not None and aclients is not None
            self.client, self.other = aclients(), aclients()
        else:
            self.client, self.other = clients(), clients()
            self._made += [self.client, self.other]

    def close(self) -> None:
        for made in self._made:
            for c in made if isinstance(made, list) else [made]:  # a list: one per Redlock master
                c.close()

    def _new(self, cls: str, name: str, client: Any, **kwargs: Any) -> Any:
        if self.shell == "sync":
            return getattr(distlock, cls)(name, client=client, **kwargs)
        runner = self._runner
        assert runner is not None
        return SyncView(runner.call(lambda: getattr(aio, cls)(name, client=client, **kwargs)), runner)

    def make(self, cls: str, name: str, **kwargs: Any) -> Any:
        return self._new(cls, name, self.client, **kwargs)

    def rival(self, cls: str, name: str, **kwargs: Any) -> Any:
        return self._new(cls, name, self.other, **kwargs)

    def view(self, obj: Any) -> Any:
        """A part of a primitive (a read/write lock's side) as the test calls it."""
        return obj if self.shell == "sync" else SyncView(obj.prim if isinstance(obj, SyncView) else obj,
                                                          self._runner)

    def arm(self, prim: Any, points: FailPoints) -> None:
        if self.shell == "sync":
            arm(prim, points)
        else:
            runner = self._runner
            assert runner is not None
            runner.call(lambda: arm(prim.prim, points))

    def activate(self, points: Optional[FailPoints]) -> None:
        """Count (and fail) the calls of the steps: the test thread's (blocking shell), or its
        actor task's (asyncio shell), which ``seam._ACTIVE`` is set in for the next calls."""
        if self.shell == "sync":
            seam._ACTIVE.set(points)
        else:
            runner = self._runner
            assert runner is not None
            runner.call(lambda: seam._ACTIVE.set(points))

    def keys(self, name: str) -> List[str]:
        found = set()
        for c in self.look:
            found.update(k.decode() if isinstance(k, bytes) else k for k in c.keys(f"distlock:{{{name}}}*"))
        return sorted(found)


# --- the scenarios: each runs its steps through ``run.step`` and says what is believed ---------


class Run:
    """One run of a scenario: its steps, the checks after each, and what went wrong."""

    def __init__(self, env: Env, name: str, points: FailPoints) -> None:
        self.env = env
        self.name = name
        self.points = points
        self.problems: List[str] = []
        self.spans: List[Tuple[int, int]] = []  # each step's calls: counted()[first:end]
        self._belief: Optional[Callable[[], Tuple[bool, Callable[[], bool]]]] = None

    def believes(self, check: Callable[[], Tuple[bool, Callable[[], bool]]]) -> None:
        """``check()``: (whether the caller believes it holds, a rival's try: True if it got it
        and let go again)."""
        self._belief = check

    def step(self, what: str, fn: Callable[[], Any]) -> Any:
        first = len(self.points.counted())
        try:
            result = fn()
        except STEP_ERRORS as exc:
            result = exc
        self.spans.append((first, len(self.points.counted())))
        self.check_belief(what)
        return result

    def check_belief(self, what: str) -> None:
        """1: believed held, a rival cannot get it; not believed held, a rival can, once the
        holds a failed connection suspended are confirmed or found gone (``confirmed``)."""
        if self._belief is None:
            return
        self.env.activate(None)
        try:
            confirmed()
            deadline = time.monotonic() + SETTLE
            while True:
                held, rival_try = self._belief()
                if held:  # (a confirmation may come late on a loaded machine: looked at again)
                    if rival_try():
                        self.problems.append(f"after {what}: believed held, and a rival got it")
                    break
                if rival_try():
                    break
                if time.monotonic() > deadline:
                    self.problems.append(f"after {what}: not believed held, yet nobody else "
                                         "can get it (a leaked hold)")
                    break
                time.sleep(0.02)
        finally:
            self.env.activate(self.points)


def confirmed() -> None:
    """Wait (within SETTLE) until no hold is suspended: a connection error (as a failpoint
    raises) suspends belief in its session's holds until a renewal round, started at once,
    confirms each or finds it gone (docs/safety.rst)."""
    deadline = time.monotonic() + SETTLE
    while time.monotonic() < deadline:
        if not any(h.suspended and not h.lost for s in all_sessions()
                   for h in list(s.watchdog.holds.values())):
            return
        time.sleep(0.01)



def _tries(rival: Any) -> Callable[[], bool]:
    """A rival's single try: True when it got it (and let go again at once)."""
    def rival_try() -> bool:
        try:
            got = rival.acquire(blocking=False)
        except STEP_ERRORS:
            return False
        if got:
            rival.release()
        return bool(got)
    return rival_try


def _lock_belief(lock: Any, rival: Any) -> Callable[[], Tuple[bool, Callable[[], bool]]]:
    rival_try = _tries(rival)
    return lambda: (bool(lock.owned()), rival_try)


def _waiter(env: Env, cls: str, name: str, local: bool = False,
            **kwargs: Any) -> Tuple[threading.Thread, List[Any]]:
    """A rival waiting for lock ``name`` in a thread of its own; releases it once it got it.
    ``local``: on the run's own client (its session, its asyncio port), so that a release
    hands the lock to it in the process (lock_release's in-process hand-off)."""
    rival = (env.make if local else env.rival)(cls, name, **kwargs)
    outcome: List[Any] = []

    def wait() -> None:
        started = time.monotonic()
        try:
            got = rival.acquire(timeout=WAITER_BOUND)
        except STEP_ERRORS as exc:
            got = exc
        outcome.append(got)
        outcome.append(time.monotonic() - started)
        if got is True:
            rival.release()
    thread = threading.Thread(target=wait, name="sweep-waiter")
    return thread, outcome


def _release_all(lock: Any) -> None:
    confirmed()
    while lock.owned():
        lock.release()


def lock_scenario(cls: str, depth: int, local: bool = False, **kwargs: Any) -> Callable[[Run], None]:
    def scenario(run: Run) -> None:
        env, name = run.env, run.name
        lock = env.make(cls, name, **kwargs)
        env.arm(lock, run.points)
        run.believes(_lock_belief(lock, env.rival(cls, name, **kwargs)))
        thread, outcome = _waiter(env, cls, name, local, **kwargs)
        started = False
        try:
            for level in range(depth):
                if run.step(f"acquire #{level + 1}", lambda: lock.acquire(timeout=2.0)) is not True:
                    break
            run.step("locked()", lock.locked)
            if lock.owned():
                thread.start()
                started = True
                time.sleep(0.05)  # the waiter waits by now, or finds the lock free later: either way
            for level in range(depth):
                if lock.owned():
                    run.step(f"release #{level + 1}", lock.release)
        finally:
            env.activate(None)
            _release_all(lock)
            if started:
                thread.join(WAITER_BOUND + SETTLE)
                if outcome[:1] != [True]:
                    run.problems.append(f"the waiter was not woken within its bound: {outcome}")
    return scenario


def rw_scenario(run: Run) -> None:
    env, name = run.env, run.name
    rw = env.make("DistReadWriteLock", name)
    env.arm(rw, run.points)
    read, write = env.view(rw.read_lock()), env.view(rw.write_lock())
    probe = env.view(env.rival("DistReadWriteLock", name).write_lock())
    belief = _lock_belief(write, probe)
    run.believes(lambda: (bool(read.owned() or write.owned()), belief()[1]))
    try:
        if run.step("read acquire", lambda: read.acquire(timeout=2.0)) is True:
            run.step("read release", read.release)
        if run.step("write acquire", lambda: write.acquire(timeout=2.0)) is True:
            run.step("write re-entry", lambda: write.acquire(timeout=2.0))
            while write.owned():
                if isinstance(run.step("write release", write.release), Exception):
                    break
    finally:
        env.activate(None)
        _release_all(read)
        _release_all(write)


def semaphore_scenario(cls: str) -> Callable[[Run], None]:
    def scenario(run: Run) -> None:
        env, name = run.env, run.name
        sem = env.make(cls, name, value=1)
        env.arm(sem, run.points)
        rival_try = _tries(env.rival(cls, name, value=1))
        run.believes(lambda: (sem.valid_for() > 0, rival_try))
        try:
            if run.step("acquire", lambda: sem.acquire(timeout=2.0)) is True:
                run.step("release", sem.release)
        finally:
            env.activate(None)
            confirmed()
            if sem.valid_for() > 0:
                sem.release()
    return scenario


def condition_scenario(run: Run) -> None:
    env, name = run.env, run.name
    lock = env.make("DistLock", name + ":lock")
    cond = env.make("DistCondition", name, lock=lock.prim if isinstance(lock, SyncView) else lock)
    env.arm(lock, run.points)
    run.believes(_lock_belief(lock, env.rival("DistLock", name + ":lock")))
    try:
        if run.step("acquire", lambda: cond.acquire(timeout=2.0)) is True:
            run.step("wait", lambda: cond.wait(timeout=0.05))
            if lock.owned():
                run.step("notify_all", cond.notify_all)
                run.step("release", cond.release)
    finally:
        env.activate(None)
        _release_all(lock)


def event_scenario(run: Run) -> None:
    env, name = run.env, run.name
    event = env.make("DistEvent", name)
    env.arm(event, run.points)
    rival = env.rival("DistEvent", name)
    outcome: List[Any] = []
    thread = threading.Thread(target=lambda: outcome.append(rival.wait(timeout=WAITER_BOUND)),
                              name="sweep-event-waiter")
    thread.start()
    try:
        run.step("set", event.set)
        run.step("is_set", event.is_set)
        run.step("wait", lambda: event.wait(timeout=0.05))
        set_now = bool(rival.is_set())
        if not set_now:
            event.set()  # the waiter is woken either way; the set itself is what was tried
        thread.join(WAITER_BOUND + SETTLE)
        if outcome != [True]:
            run.problems.append(f"the event's waiter was not woken within its bound: {outcome}")
        run.step("clear", event.clear)
        run.step("wait (cleared)", lambda: event.wait(timeout=0.05))
    finally:
        env.activate(None)
        thread.join(WAITER_BOUND + SETTLE)
        event.clear()


def barrier_scenario(run: Run) -> None:
    env, name = run.env, run.name
    barrier = env.make("DistBarrier", name, parties=1)
    env.arm(barrier, run.points)
    try:
        run.step("wait", lambda: _broken_is_an_outcome(barrier.wait, 2.0))
        run.step("abort", barrier.abort)
        run.step("reset", barrier.reset)
        run.step("wait again", lambda: _broken_is_an_outcome(barrier.wait, 2.0))
    finally:
        env.activate(None)
        barrier.reset()


def _broken_is_an_outcome(fn: Callable[..., Any], *args: Any) -> Any:
    try:
        return fn(*args)
    except BROKEN as exc:  # a failed reset left it broken, as threading's would stay
        return exc


SCENARIOS: Dict[str, Callable[[Run], None]] = {
    "DistLock": lock_scenario("DistLock", 1),
    "DistRLock": lock_scenario("DistRLock", 2),
    # the waiter in the run's own process and session: the release hands the lock to it
    "DistLock.local": lock_scenario("DistLock", 1, local=True),
    "DistRLock.local": lock_scenario("DistRLock", 2, local=True),
    "DistLock.fair": lock_scenario("DistLock", 1, fair=True),
    "DistRLock.fair": lock_scenario("DistRLock", 2, fair=True),
    "DistReadWriteLock": rw_scenario,
    "DistSemaphore": semaphore_scenario("DistSemaphore"),
    "DistBoundedSemaphore": semaphore_scenario("DistBoundedSemaphore"),
    "DistCondition": condition_scenario,
    "DistEvent": event_scenario,
    "DistBarrier": barrier_scenario,
}


def undo_scenario(run: Run) -> None:
    """Redlock only: someone else holds masters 1 to 3, so a try grants on 0 and 4 only, fails,
    and is undone there (``lock_undo``). Whatever fails, the undo leaves nothing on 0 and 4, and
    the other holder keeps its three."""
    env, name = run.env, run.name
    key = f"distlock:{{{name}}}"
    masters = env.look
    for admin in masters[1:4]:
        admin.hset(key, mapping={"someone:else": 1, ":t": 7})
        admin.pexpire(key, 60_000)
    lock = env.make("DistLock", name)
    env.arm(lock, run.points)
    try:
        if run.step("acquire without a quorum", lambda: lock.acquire(blocking=False)) is True:
            run.problems.append("granted without a quorum")
        env.activate(None)
        for i in (0, 4):
            deadline = time.monotonic() + SETTLE
            while masters[i].exists(key) and time.monotonic() < deadline:
                time.sleep(0.02)
            if masters[i].exists(key):
                run.problems.append(f"the failed try's grant stayed on master {i}")
        if [m.hget(key, "someone:else") for m in masters[1:4]] != [b"1"] * 3:
            run.problems.append("the other holder's hold was touched")
    finally:
        env.activate(None)
        for admin in masters[1:4]:
            admin.delete(key)


#: what takes a list of masters (docs/guides/redlock.rst), and what only a quorum does
REDLOCK = ("DistLock", "DistRLock", "DistLock.undo")
SCENARIOS_REDLOCK = {**SCENARIOS, "DistLock.undo": undo_scenario}


# --- the sweep ---------------------------------------------------------------------------------


def _one(env: Env, scenario: Callable[[Run], None], points: FailPoints) -> Tuple[Run, List[str]]:
    """One run on a fresh name; what it left behind beyond the ``ALLOWED`` suffixes."""
    name = f"sweep-{uuid.uuid4().hex[:10]}"
    run = Run(env, name, points)
    env.activate(points)
    try:
        scenario(run)
    finally:
        env.activate(None)
    # 2: nothing left once everything is released (clean-ups handed to the watchdog's worker
    # are waited for)
    prefix = f"distlock:{{{name}}}"

    def extra() -> List[str]:
        return [k for k in env.keys(name) if k[len(prefix):] not in ALLOWED]
    deadline = time.monotonic() + SETTLE
    left = extra()
    while left and time.monotonic() < deadline:
        time.sleep(0.02)
        left = extra()
    return run, left


def _sent_twice(points: FailPoints, spans: List[Tuple[int, int]]) -> List[str]:
    """3: a call whose reply was lost or late, sent again as it was by the step that made it
    (a later step may make the same call on purpose: a re-entrant lock's second release)."""
    calls = points.counted()
    found = []
    for i, call in enumerate(calls):
        if call.kind not in (LOST, LATE):
            continue
        end = next((e for b, e in spans if b <= i < e), len(calls))
        for later in calls[i + 1:end]:
            if (later.name, later.keys, later.args) == (call.name, call.keys, call.args):
                found.append(f"{call.name} sent again after its reply was {call.kind}")
                break
    return found


def sweep(env: Env, scenario: Callable[[Run], None]) -> Tuple[int, List[str]]:
    """Run ``scenario`` clean, then once per (round trip, way of failing); return how many
    failpoints fired and every problem found."""
    clean = FailPoints()
    run, left = _one(env, scenario, clean)
    assert not run.problems, run.problems
    assert not left, f"a clean run leaves {left}"
    trips: List[Tuple[str, int]] = []
    seen: Dict[str, int] = {}
    for call in clean.counted():
        seen[call.name] = seen.get(call.name, 0) + 1
        trips.append((call.name, seen[call.name]))
    assert trips, "the scenario made no round trip"
    problems: List[str] = []
    fired = 0
    for script, nth in trips:
        for kind in KINDS:
            points = FailPoints()
            rule = points.fail(script, nth, kind)
            run, left = _one(env, scenario, points)
            if not rule.fired:
                continue  # a retry path took another turn this time: nothing was failed
            fired += 1
            where = f"{script} #{nth} {kind}"
            problems += [f"{where}: {p}" for p in run.problems]
            if left:
                problems.append(f"{where}: left behind {left}")
            problems += [f"{where}: {p}" for p in _sent_twice(points, run.spans)]
    return fired, problems


@pytest.fixture(params=["sync", "async"])
def shell(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def runner(shell: str) -> Iterator[Optional[AioRunner]]:
    if shell == "sync":
        yield None
        return
    made = AioRunner()
    try:
        yield made
    finally:
        made.close()


def _check(env: Env, which: str) -> None:
    try:
        fired, problems = sweep(env, SCENARIOS_REDLOCK[which])
    finally:
        env.close()
    assert fired, "no failpoint fired"
    assert not problems, "\n".join(problems)


@pytest.fixture(autouse=True)
def _small_wait_cap() -> Iterator[None]:
    distlock.configure(wait_cap=0.05)
    yield


@pytest.mark.parametrize("which", sorted(SCENARIOS))
def test_sweep_on_one_server(backend: Any, client: Any, url: str, shell: str,
                             runner: Optional[AioRunner], which: str) -> None:
    made = iter(range(1_000_000))
    env = Env(shell, lambda: backend.client(client_name=f"sweep-{next(made)}"), [client], runner,
              lambda: runner.client(url) if runner is not None else None)
    _check(env, which)


@pytest.mark.parametrize("which", sorted(SCENARIOS))
def test_sweep_on_the_cluster(cluster: Any, cluster_client: Any, shell: str,
                              runner: Optional[AioRunner], which: str) -> None:
    env = Env(shell, cluster.client, [cluster_client], runner,
              lambda: runner.client(cluster.url) if runner is not None else None)
    _check(env, which)


@pytest.mark.parametrize("which", REDLOCK)
def test_sweep_through_redlock(redlock: Any, redlock_clients: list, shell: str,
                               runner: Optional[AioRunner], which: str) -> None:
    env = Env(shell, lambda: redlock.clients(socket_timeout=5), redlock_clients, runner,
              lambda: [runner.client(u) for u in redlock.urls] if runner is not None else None)
    _check(env, which)
