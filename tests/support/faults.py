"""Fault-injection infrastructure for tests/faults/test_faults.py, test_bad_input.py and test_security.py.

- ``PRIMITIVES``: the parametrization table. Every exclusive primitive that exists gets one
  entry, which says how to build a lock-like object (acquire/release/token/on_lost) of it.
  Adding a primitive to the fault suite is adding one entry here.
- ``FaultProxy``: ``distlock.testing.proxy``'s, a loopback TCP proxy between clients and a
  redis-server that tests drive: delay, blackhole (accept, never answer; both ways or replies
  only), reset every connection, drop the traffic of pub/sub connections.
- ``Holder``: a holder process (spawn context), driven through queues; start, SIGKILL, SIGSTOP,
  SIGCONT, always cleaned up by the ``holders`` fixture.
- ``FencedResource``: a resource that remembers the highest fencing token it accepted and
  rejects lower ones. It lives in files under flock, so it works across processes and outlives
  a restart of Redis (it is the world outside Redis, not part of it).
- ``restart_server``, ``kill_pubsub``, ``keyspace``: small Redis helpers.

Everything here talks only to 127.0.0.1, and every loop is bounded in count and time.
"""

from __future__ import annotations

import contextlib
import fcntl
import multiprocessing
import os
import queue
import signal
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

import redis

import distlock
from distlock._redis.urls import client_from_url
from distlock.testing.proxy import FaultProxy  # noqa: F401 - the fault tests import it from here

# --- the parametrization table --------------------------------------------------------------


@dataclass(frozen=True)
class Primitive:
    """How the fault suite builds one exclusive primitive.

    ``make(name, client, lease)`` returns an object with ``acquire(blocking, timeout)``,
    ``release()``, ``token``, ``owned()`` and ``on_lost(cb)``, exclusive across processes and
    across threads of one process (for thread-owned primitives a waiter must be another
    thread). ``reentrant`` tells whether the holding thread may acquire it again.
    """

    name: str
    make: Callable[[str, Any, Optional[float]], Any]
    reentrant: bool = False
    #: whether two holders exclude each other (a read lock's holders do not)
    exclusive: bool = True
    #: what contends with a holder of ``make`` (default: another ``make``); a read lock's is
    #: the write lock of the same name
    contender: Optional[Callable[[str, Any, Optional[float]], Any]] = None

    def rival(self, name: str, client: Any, lease: Optional[float]) -> Any:
        return (self.contender or self.make)(name, client, lease)


def _make_lock(name: str, client: Any, lease: Optional[float]) -> Any:
    return distlock.DistLock(name, client=client, lease=lease)


def _make_rlock(name: str, client: Any, lease: Optional[float]) -> Any:
    return distlock.DistRLock(name, client=client, lease=lease)


def _make_fair_lock(name: str, client: Any, lease: Optional[float]) -> Any:
    return distlock.DistLock(name, client=client, lease=lease, fair=True)


def _make_fair_rlock(name: str, client: Any, lease: Optional[float]) -> Any:
    return distlock.DistRLock(name, client=client, lease=lease, fair=True)


def _make_write_lock(name: str, client: Any, lease: Optional[float]) -> Any:
    return distlock.DistReadWriteLock(name, client=client, lease=lease).write_lock()  # type: ignore[attr-defined]


def _make_read_lock(name: str, client: Any, lease: Optional[float]) -> Any:
    return distlock.DistReadWriteLock(name, client=client, lease=lease).read_lock()  # type: ignore[attr-defined]


class _ConditionAsLock:
    """A DistCondition seen as a lock: acquire/release through the condition (they are its
    lock's, as in threading), token/owned/on_lost from its lock. ``cond`` is the condition."""

    def __init__(self, cond: Any, lock: Any) -> None:
        self.cond = cond
        self.lock = lock
        self.acquire = cond.acquire
        self.release = cond.release

    @property
    def token(self) -> Optional[int]:
        return self.lock.token  # type: ignore[no-any-return]

    def owned(self) -> bool:
        return bool(self.lock.owned())

    def on_lost(self, callback: Callable[[Any], Any]) -> None:
        self.lock.on_lost(callback)


def _make_condition(name: str, client: Any, lease: Optional[float]) -> Any:
    lock = distlock.DistRLock(name, client=client, lease=lease)
    return _ConditionAsLock(distlock.DistCondition(name, lock, client=client), lock)  # type: ignore[attr-defined]


def _table() -> Dict[str, Primitive]:
    table = {
        "DistLock": Primitive("DistLock", _make_lock),
        "DistRLock": Primitive("DistRLock", _make_rlock, reentrant=True),
        "DistLock.fair": Primitive("DistLock.fair", _make_fair_lock),
        "DistRLock.fair": Primitive("DistRLock.fair", _make_fair_rlock, reentrant=True),
    }
    # Primitives that landed later join the same suite by one entry each.
    if hasattr(distlock, "DistReadWriteLock"):
        table["DistReadWriteLock.write"] = Primitive("DistReadWriteLock.write", _make_write_lock,
                                                     reentrant=True)
        table["DistReadWriteLock.read"] = Primitive("DistReadWriteLock.read", _make_read_lock,
                                                    reentrant=True, exclusive=False,
                                                    contender=_make_write_lock)
    if hasattr(distlock, "DistCondition"):
        table["DistCondition"] = Primitive("DistCondition", _make_condition, reentrant=True)
    return table


PRIMITIVES: Dict[str, Primitive] = _table()


def primitive(name: str) -> Primitive:
    return PRIMITIVES[name]


#: The counting primitives (permits with leases, no fencing tokens): not in ``PRIMITIVES``,
#: whose scenarios need a token. tests/faults/test_faults_sem_event_barrier.py runs the scenarios that apply.
SEMAPHORES = [k for k in ("DistSemaphore", "DistBoundedSemaphore") if hasattr(distlock, k)]


class _PermitAsLock:
    """A semaphore seen by a holder process as a lock: acquire takes one permit, release gives
    one back, ``owned()`` tells whether this process still holds one it took, ``token`` is
    always None (a semaphore has no fencing token)."""

    token = None

    def __init__(self, sem: Any) -> None:
        self.sem = sem
        self.acquire = sem.acquire
        self.release = sem.release
        self.on_lost = sem.on_lost

    def owned(self) -> bool:
        holds = self.sem._session().holds
        return any(key == self.sem._keys.sem and not hold.lost
                   for (key, _owner), hold in list(holds.items()))


def make_holdable(kind: str, name: str, client: Any, lease: Optional[float],
                  value: int = 1) -> Any:
    """A lock-like object of ``kind``: an entry of ``PRIMITIVES`` or of ``SEMAPHORES``."""
    if kind in SEMAPHORES:
        return _PermitAsLock(getattr(distlock, kind)(name, value, client=client, lease=lease))
    return PRIMITIVES[kind].make(name, client, lease)


# --- Redis helpers --------------------------------------------------------------------------


def restart_server(backend: Any) -> None:
    """Kill the fixture's redis-server and start it again, empty, on the same port."""
    server = backend.server
    assert server is not None, "restart_server needs the fixture's own redis-server"
    server.restart()


def kill_pubsub(client: redis.Redis[Any]) -> int:
    """CLIENT KILL TYPE pubsub; return how many connections the server closed."""
    return int(client.execute_command("CLIENT", "KILL", "TYPE", "pubsub"))


def keyspace(client: redis.Redis[Any]) -> Dict[bytes, Tuple[bytes, Any, bool]]:
    """Every key with its type, value and whether it has a TTL: to prove nothing was written."""
    snapshot: Dict[bytes, Tuple[bytes, Any, bool]] = {}
    for key in client.scan_iter(count=1000):
        kind = client.type(key)
        if kind == b"string":
            value: Any = client.get(key)
        elif kind == b"hash":
            value = sorted(client.hgetall(key).items())
        elif kind == b"list":
            value = client.lrange(key, 0, -1)
        elif kind == b"set":
            value = sorted(client.smembers(key))
        elif kind == b"zset":
            value = client.zrange(key, 0, -1, withscores=True)
        else:
            value = None
        snapshot[key] = (kind, value, client.pttl(key) >= 0)
    return snapshot


def wait_until(predicate: Callable[[], Any], timeout: float, interval: float = 0.02) -> bool:
    """Poll ``predicate`` until it is true or ``timeout`` seconds passed; return its last truth."""
    deadline = time.monotonic() + timeout
    while True:
        if predicate():
            return True
        if time.monotonic() >= deadline:
            return bool(predicate())
        time.sleep(interval)


# --- the fenced resource --------------------------------------------------------------------


@dataclass(frozen=True)
class Write:
    at: float  # time.monotonic() (system-wide on Linux) when the resource decided
    token: int
    accepted: bool
    writer: str


class FencedResource:
    """A storage that accepts a write only with a token at least as high as any it accepted.

    State lives in two files under ``directory``, guarded by flock: the highest accepted token
    and a log of every decision. Picklable (it is just a path), so holder processes use it too.
    """

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self._state = os.path.join(directory, "fenced.highest")
        self._log = os.path.join(directory, "fenced.log")
        self._lockfile = os.path.join(directory, "fenced.lock")

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        with open(self._lockfile, "a") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)

    def highest(self) -> int:
        try:
            with open(self._state) as fh:
                return int(fh.read() or "0")
        except FileNotFoundError:
            return 0

    def write(self, token: Optional[int], writer: str = "") -> bool:
        """Accept (True) or reject (False) a write fenced by ``token``; None is always rejected."""
        with self._locked():
            highest = self.highest()
            accepted = token is not None and token >= highest
            if accepted:
                with open(self._state, "w") as fh:
                    fh.write(str(token))
            with open(self._log, "a") as fh:
                fh.write(f"{time.monotonic():.6f} {token or 0} {int(accepted)} {writer}\n")
        return accepted

    def log(self) -> List[Write]:
        try:
            with open(self._log) as fh:
                lines = fh.read().splitlines()
        except FileNotFoundError:
            return []
        result = []
        for line in lines:
            at, token, accepted, writer = (line.split(" ", 3) + [""])[:4]
            result.append(Write(float(at), int(token), accepted == "1", writer))
        return result


# --- holder processes -----------------------------------------------------------------------


def _holder_main(url: str, kind: str, name: str, lease: Optional[float],
                 settings: Dict[str, float], commands: Any, events: Any, value: int = 1) -> None:
    """A holder process: acquire, report, then obey commands until told to exit (or 60 s).
    ``value`` is a semaphore's (``kind`` in ``SEMAPHORES``)."""
    if settings:
        distlock.configure(**settings)  # type: ignore[arg-type]
    client = client_from_url(url)
    lock = make_holdable(kind, name, client, lease, value)
    lock.on_lost(lambda _lock: events.put(("on_lost", time.monotonic())))
    acquired = lock.acquire(timeout=30)
    events.put(("acquired", lock.token if acquired else None, time.monotonic(), os.getpid(),
                bool(acquired)))
    for _ in range(1000):
        try:
            command = commands.get(timeout=60)
        except queue.Empty:
            return
        op = command[0]
        if op == "exit":
            return
        if op == "write":
            resource: FencedResource = command[1]
            token = command[2] if len(command) > 2 else lock.token
            events.put(("write", resource.write(token, f"pid{os.getpid()}")))
        elif op == "release":
            try:
                lock.release()
                events.put(("release", "ok"))
            except BaseException as exc:  # noqa: BLE001 - reported to the test
                events.put(("release", type(exc).__name__))
        elif op == "owned":
            events.put(("owned", lock.owned(), lock.token))


class Holder:
    """A holder process of one primitive; driven by the test, always cleaned up."""

    def __init__(self, url: str, kind: str, name: str, lease: Optional[float] = None,
                 settings: Optional[Dict[str, float]] = None, value: int = 1) -> None:
        ctx = multiprocessing.get_context("spawn")
        self.commands = ctx.Queue()
        self.events = ctx.Queue()
        self.pending: List[Tuple[Any, ...]] = []
        self.process = ctx.Process(
            target=_holder_main, name=f"holder-{kind}-{name}",
            args=(url, kind, name, lease, dict(settings or {}), self.commands, self.events,
                  value),
            daemon=True)
        self.process.start()
        self.stopped = False

    @property
    def pid(self) -> int:
        assert self.process.pid is not None
        return self.process.pid

    def event(self, kind: str, timeout: float = 30.0) -> Tuple[Any, ...]:
        """The next event of ``kind`` (others are kept for later); AssertionError after timeout."""
        for i, ev in enumerate(self.pending):
            if ev[0] == kind:
                return self.pending.pop(i)
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"holder {self.pid}: no {kind!r} event in {timeout}s "
                                     f"(alive={self.process.is_alive()}, seen={self.pending})")
            try:
                ev = self.events.get(timeout=min(left, 1.0))
            except queue.Empty:
                continue
            if ev[0] == kind:
                return tuple(ev)
            self.pending.append(tuple(ev))

    def has_event(self, kind: str) -> bool:
        for _ in range(100):
            try:
                self.pending.append(tuple(self.events.get_nowait()))
            except queue.Empty:
                break
        return any(ev[0] == kind for ev in self.pending)

    def send(self, *command: Any) -> None:
        self.commands.put(command)

    def stop(self) -> None:
        os.kill(self.pid, signal.SIGSTOP)
        self.stopped = True

    def cont(self) -> None:
        os.kill(self.pid, signal.SIGCONT)
        self.stopped = False

    def kill(self) -> None:
        if self.process.is_alive():
            os.kill(self.pid, signal.SIGKILL)
        self.process.join(timeout=10)

    def cleanup(self) -> None:
        """Whatever state it is in: continue, kill, reap; close the queues."""
        if self.process.pid is not None and self.process.is_alive():
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGCONT)
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)
        self.process.join(timeout=10)
        for q in (self.commands, self.events):
            q.close()
            q.cancel_join_thread()


# --- the mutual-exclusion checker (scenario 9) ----------------------------------------------


def _checker_main(url: str, kind: str, name: str, holds: int, lease: Optional[float],
                  settings: Dict[str, float], resource: Optional[FencedResource], seed: int,
                  out_path: str, start_at: float, min_seconds: float, give_up_after: float) -> None:
    """One contender (``make_holdable``: a lock, or a semaphore of value 1): ``holds`` short
    holds with random sleeps, and more until ``min_seconds`` have passed since the start (so
    that a test has time to disturb the run, however fast the lock is), for at most
    ``give_up_after`` seconds; intervals go to ``out_path``.

    Each line: start end token outcome, where start is taken after acquire() returned, end
    before release() is called (both time.monotonic(), which is system-wide on Linux), token is
    0 for a semaphore (it has none), and outcome is "ok" or the name of the exception release()
    raised. With a ``resource``, the holder writes to it twice between them: once at once, once
    after a random sleep (a SIGSTOP may fall there).
    """
    import random

    if settings:
        distlock.configure(**settings)  # type: ignore[arg-type]
    rng = random.Random(seed)
    client = client_from_url(url)
    lock = make_holdable(kind, name, client, lease)
    while time.monotonic() < start_at:
        time.sleep(0.005)
    deadline = time.monotonic() + give_up_after
    busy_until = start_at + min_seconds
    with open(out_path, "w") as out:
        done = 0
        while done < holds or time.monotonic() < busy_until:
            done += 1
            if time.monotonic() > deadline:
                break
            if not lock.acquire(timeout=60):
                out.write("0 0 0 timeout\n")
                continue
            start = time.monotonic()
            token = lock.token or 0
            if resource is not None:
                resource.write(token, f"pid{os.getpid()}")
            time.sleep(rng.random() * 0.002)
            if resource is not None:
                resource.write(token, f"pid{os.getpid()}")
            end = time.monotonic()
            try:
                lock.release()
                outcome = "ok"
            except distlock.LockLostError:
                outcome = "LockLostError"
            out.write(f"{start:.6f} {end:.6f} {token} {outcome}\n")
            out.flush()
            time.sleep(rng.random() * 0.002)


def start_checkers(url: str, kind: str, name: str, processes: int, holds: int,
                   lease: Optional[float], settings: Dict[str, float],
                   resource: Optional[FencedResource], out_dir: str, min_seconds: float = 0.0,
                   give_up_after: float = 240.0) -> List[Any]:
    """``processes`` spawned ``_checker_main`` contenders on ``name``, starting together."""
    ctx = multiprocessing.get_context("spawn")
    start_at = time.monotonic() + 3.0  # let every process import and connect first
    procs = []
    for i in range(processes):
        proc = ctx.Process(
            target=_checker_main, name=f"checker-{i}",
            args=(url, kind, name, holds, lease, settings, resource, 1000 + i,
                  os.path.join(out_dir, f"intervals-{i}.txt"), start_at, min_seconds,
                  give_up_after),
            daemon=True)
        proc.start()
        procs.append(proc)
    return procs


def read_intervals(out_dir: str, processes: int) -> List[Tuple[float, float, int, str, int]]:
    """Every recorded hold: (start, end, token, outcome, process index)."""
    result = []
    for i in range(processes):
        path = os.path.join(out_dir, f"intervals-{i}.txt")
        with open(path) as fh:
            for line in fh:
                start, end, token, outcome = line.split()
                result.append((float(start), float(end), int(token), outcome, i))
    return result


def check_exclusion(intervals: List[Tuple[float, float, int, str, int]],
                    resource: FencedResource) -> None:
    """What a run of ``_checker_main`` contenders must show, however the machine treated them:
    the holds that ended well ("ok") never overlap; every token a holder believed was its own;
    the fenced resource accepted tokens in order only, and refused only stale ones.

    A holder stalled past its lease (a SIGSTOP, or a machine so loaded that its process does
    not run for a lease: one run of seven suites at once on 2 cores did that to 1 hold in 40)
    stops believing at its deadline (docs/safety.rst): it may read no token right after
    ``acquire()`` returned (it records 0, and its write is refused), and its ``release()``
    raises LockLostError. That is the lock telling the truth, not a failure of exclusion; a
    hold reported lost is left out of the overlap check, since its belief ended before the
    end it recorded."""
    good = [iv for iv in intervals if iv[3] == "ok"]
    assert good, "no hold ended well"
    assert overlaps(good) == []
    tokens = [iv[2] for iv in intervals if iv[2] != 0]
    assert len(set(tokens)) == len(tokens), "two grants shared a token"
    assert all(iv[3] == "LockLostError" for iv in intervals if iv[2] == 0 and iv[3] != "timeout")
    log = resource.log()
    accepted = [w.token for w in log if w.accepted]
    assert accepted == sorted(accepted), "the fenced resource accepted a stale token"
    refused = [w for w in log if not w.accepted]
    assert all(not accepted or w.token < max(accepted) for w in refused), "a current token was refused"


def overlaps(intervals: List[Tuple[float, float, int, str, int]]) -> List[Tuple[Any, Any]]:
    """Pairs of intervals that overlap (after sorting by start)."""
    ordered = sorted(intervals)
    bad = []
    latest_end: Optional[Tuple[float, float, int, str, int]] = None
    for iv in ordered:
        if latest_end is not None and iv[0] < latest_end[1]:
            bad.append((latest_end, iv))
        if latest_end is None or iv[1] > latest_end[1]:
            latest_end = iv
    return bad
