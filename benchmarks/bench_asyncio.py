#!/usr/bin/env python
"""distlock.asyncio's DistLock and DistRLock side by side with redis-py's asyncio Lock and
pottery's AIORedlock.

Every figure in one run, against one freshly started private redis-server on 127.0.0.1, each
as a ratio to a floor measured in the same run (medians, with the IQR of per-round ratios;
the candidates interleaved round-robin, so that a slow spell of the machine hits all alike):

- floor: two ``await client.evalsha(sha, 0)`` of ``return 1`` through ``redis.asyncio``
  (µs per pair);
- uncontended: ``await acquire()`` + ``await release()``, µs/op, as a ratio to the floor
  measured in the same rounds (target <= 1.15x); and the client process' CPU time per op;
- handoff: from the start of the holder's ``release()`` in this process to the return of a
  waiting task's ``acquire()`` in another process (median and p99), next to its floor: an
  EVALSHA of a script that PUBLISHes here, the message delivered to a task subscribed through
  ``redis.asyncio`` pub/sub in another process, which then makes one EVALSHA (targets: the
  default lock <= 1.10x, ``fair=True`` <= 1.0x); and between two tasks of one loop (target
  <= 1.0x the same floor);
  the candidates alternate in rounds, each round a fresh waiter process;
- contended: 4 processes x 50 tasks doing a GET/SET of a counter under the lock for a fixed
  time: ops/s (target >= redis-py's asyncio Lock) and lost updates (target 0);
- waiting: one process has 10, then 1,000 tasks waiting on one name held here: its Redis
  connections (CLIENT LIST, by client name; target: flat, <= 8) and the server's commands/s
  while they wait (INFO commandstats, after they settle; target <= 5/s).

Usage::

    python benchmarks/bench_asyncio.py [--quick] [--json out.json] [figure ...]

Figures: floor, uncontended, handoff, contended, waiting (default: all). The table goes to
stdout, progress to stderr. ``--quick`` is a short smoke run whose numbers mean little.

The cross-process harnesses of ``_common`` are written for blocking locks; here each process
runs one event loop, and an async lock is handed to them behind a blocking facade
(``Blocking``: each call runs the coroutine on that loop) or, where many tasks must wait or
contend in one process, with an asyncio worker in place of the threaded one (``_async_worker``).
To add a primitive (DistSemaphore...), write an async factory and add an ``Impl`` line.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import sys
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any, Awaitable, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

if __package__ in (None, ""):  # run as a script: make ``benchmarks`` and ``distlock`` importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import redis.asyncio as aredis  # noqa: E402

from benchmarks import _common as C  # noqa: E402
from benchmarks.bench_locks import _waiter_note  # noqa: E402
from distlock.asyncio import DistLock, DistRLock

try:
    from pottery import AIORedlock
    POTTERY_PROBLEM: Optional[str] = None
except Exception as exc:  # noqa: BLE001 - pragma: no cover - reported in its rows instead
    AIORedlock = None
    POTTERY_PROBLEM = f"pottery's AIORedlock not importable: {exc!r}"

FIGURES = ("floor", "uncontended", "handoff", "contended", "waiting")
REDIS_PY = "redis-py asyncio Lock"
#: the uncontended figure's DistLock on a client made with redis-py's defaults
DEFAULTS = "DistLock, default client"
FLOOR = "floor"
#: the floor on that client: its two EVALSHA pay redis-py's asyncio.wait_for per write
FLOOR_DEFAULTS = "floor, default client"


# --- one event loop and one redis.asyncio client per process ------------------------------------

_loop: Optional[asyncio.AbstractEventLoop] = None
_aclients: Dict[Tuple[Any, ...], Any] = {}
_defaults: List[Any] = []  # default_aclient's


def loop() -> asyncio.AbstractEventLoop:
    """This process' event loop: every async client and lock of the process lives in it."""
    global _loop
    if _loop is None or _loop.is_closed():
        _loop = asyncio.new_event_loop()
        # the current loop too: on Python 3.9 what is built outside it (a client's pool and
        # its asyncio.Lock) binds the current loop, which would otherwise be another one
        asyncio.set_event_loop(_loop)
    return _loop


def run(make: Callable[[], Awaitable[Any]]) -> Any:
    """``await make()`` on this process' loop, from outside it. ``make`` is called inside the
    loop: an asyncio primitive's ``release()`` starts its work at once and needs a running loop."""
    async def go() -> Any:
        return await make()

    return loop().run_until_complete(go())


#: The async clients' pool limit. redis-py 8's asyncio pool holds at most 100 connections by
#: default and raises MaxConnectionsError beyond: 900 of 1,000 tasks waiting on its Lock (one
#: connection each while they poll at once) would fail at once instead of waiting. distlock
#: bounds its own use and is not affected.
MAX_CONNECTIONS = 5000


def aclient_for(client: Any) -> Any:
    """The ``redis.asyncio`` client of this process for the server (and CLIENT SETNAME) of a
    blocking client; one per process, shared by every lock, as an application would."""
    kw = client.connection_pool.connection_kwargs
    key = (kw.get("host"), kw.get("port"), kw.get("db", 0), kw.get("client_name"))
    found = _aclients.get(key)
    if found is None:
        loop()  # made, and current, first: Python 3.9 binds the pool's lock to it
        found = _aclients[key] = aredis.Redis(host=key[0], port=key[1], db=key[2],
                                              client_name=key[3], socket_timeout=None,
                                              max_connections=MAX_CONNECTIONS)
    return found


def default_aclient(client: Any) -> Any:
    """A ``redis.asyncio`` client of the same server with redis-py's defaults (its socket
    timeout included), closed by ``shutdown``."""
    kw = client.connection_pool.connection_kwargs
    loop()
    made = aredis.Redis(host=kw.get("host"), port=kw.get("port"), db=kw.get("db", 0),
                        client_name=kw.get("client_name"))
    _defaults.append(made)
    return made


def shutdown() -> None:
    """Close this process' async clients and loop (what is left running is cancelled)."""
    global _loop
    lp = _loop
    if lp is None or lp.is_closed():
        return
    try:
        for client in [*_aclients.values(), *_defaults]:
            with contextlib.suppress(Exception):
                lp.run_until_complete(client.aclose())
        tasks = [t for t in asyncio.all_tasks(lp) if not t.done()]
        for task in tasks:
            task.cancel()
        if tasks:
            with contextlib.suppress(Exception):
                lp.run_until_complete(asyncio.wait(tasks, timeout=5.0))
    finally:
        _aclients.clear()
        _defaults.clear()
        lp.close()
        _loop = None


# --- the locks under test: async handles, and the blocking facade the harnesses take -------------

class ALock:
    """An async lock of any library behind one small interface: ``acquire(timeout)`` and
    ``release()`` and ``acquire_default()`` (the library's own ``acquire()`` with its defaults)
    return awaitables; ``obj`` is the library's lock object."""

    __slots__ = ("acquire", "release", "acquire_default", "obj")

    def __init__(self, acquire: Callable[[float], Awaitable[Any]], release: Callable[[], Awaitable[Any]],
                 acquire_default: Callable[[], Awaitable[Any]], obj: object = None) -> None:
        self.acquire = acquire
        self.release = release
        self.acquire_default = acquire_default
        self.obj = obj


AFactory = Callable[[Any, str], ALock]


class Blocking:
    """A ``_common.LockFactory`` over an async factory: ``Blocking(afactory)(client, name)``
    makes the async lock on this process' async client and returns a ``LockHandle`` whose calls
    run its coroutines on this process' loop, each call in a task of its own (so not for a
    task-owned lock such as DistRLock, whose release must come from the acquiring task); the
    handle's ``obj`` is the ``ALock``, for code that awaits. Picklable (``afactory`` is
    module-level), so spawned workers can take it."""

    def __init__(self, afactory: AFactory) -> None:
        self.afactory = afactory

    def __call__(self, client: Any, name: str) -> C.LockHandle:
        lock = self.afactory(aclient_for(client), name)

        async def acquire(timeout: float) -> bool:
            ok = bool(await lock.acquire(timeout))
            # what a task that awaits acquire() sees: the hand-off figure's stamp is this one,
            # not the loop's stop after it (which first runs whatever else is ready)
            handle.acquired_at = time.monotonic()
            return ok

        handle = C.LockHandle(lambda t: bool(run(lambda: acquire(t))), lambda: run(lock.release),
                              lambda: run(lock.acquire_default), lock)
        return handle


def a_distlock(aclient: Any, name: str) -> ALock:
    lock = DistLock(name, client=aclient)
    return ALock(lambda t: lock.acquire(timeout=t), lock.release, lock.acquire, lock)


def a_distlock_fair(aclient: Any, name: str) -> ALock:
    lock = DistLock(name, client=aclient, fair=True)
    return ALock(lambda t: lock.acquire(timeout=t), lock.release, lock.acquire, lock)


def a_distrlock(aclient: Any, name: str) -> ALock:
    lock = DistRLock(name, client=aclient)
    return ALock(lambda t: lock.acquire(timeout=t), lock.release, lock.acquire, lock)


def a_redis_py(aclient: Any, name: str) -> ALock:
    lock = aclient.lock(name)  # redis.asyncio.lock.Lock, its defaults: no expiry, polls every 0.1 s
    return ALock(lambda t: lock.acquire(blocking_timeout=t), lock.release, lock.acquire, lock)


def a_pottery(aclient: Any, name: str) -> ALock:
    # a 60 s lease (its default is 10 s): the waiting figure holds the lock for several seconds
    lock = AIORedlock(key=name, masters={aclient}, auto_release_time=60.0)
    return ALock(lambda t: lock.acquire(timeout=t), lock.release, lock.acquire, lock)


@dataclass(frozen=True)
class Impl:
    key: str
    label: str
    afactory: AFactory
    figures: Tuple[str, ...]
    ours: bool = False  # distlock's: the targets apply
    problem: Optional[str] = None  # why it cannot run

    @property
    def factory(self) -> Blocking:
        return Blocking(self.afactory)


IMPLS = [
    Impl("distlock", "DistLock", a_distlock, ("uncontended", "handoff", "contended", "waiting"), True),
    Impl("distlock_fair", "DistLock fair", a_distlock_fair, ("handoff",), True),
    Impl("distrlock", "DistRLock", a_distrlock, ("uncontended",), True),
    Impl("redis_py", REDIS_PY, a_redis_py, ("uncontended", "handoff", "contended", "waiting")),
    Impl("pottery", "pottery AIORedlock", a_pottery, ("uncontended", "handoff", "contended", "waiting"),
         problem=POTTERY_PROBLEM),
]


def impls(figure: str) -> List[Impl]:
    return [i for i in IMPLS if figure in i.figures]


def not_run(figure: str, impl: Impl, why: str, unit: str) -> C.Row:
    return C.Row(figure, impl.label, None, unit, note=f"not run: {why}")


def check(impl: Impl, client: Any) -> Optional[str]:
    """Why ``impl`` cannot run here (it is tried once: acquire, release), or None."""
    if impl.problem:
        return impl.problem
    lock = impl.afactory(aclient_for(client), f"bench:async:check:{impl.key}")

    async def once() -> Optional[str]:  # in one task: a task-owned lock is released by its taker
        if not await lock.acquire(5.0):
            return "could not take a free lock within 5 s"
        await lock.release()
        return None

    try:
        return run(once)  # type: ignore[no-any-return]
    except Exception as exc:  # noqa: BLE001 - reported in its row
        return f"{type(exc).__name__}: {exc}"


# --- knobs --------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Knobs:
    rounds: int = 40
    ops: int = 200
    uncontended_max_s: float = 150.0
    handoff_rounds: int = 8
    handoff_samples: int = 25  # per round, the floor and distlock
    handoff_slow_samples: int = 8  # per round, the polling peers
    handoff_round_max_s: float = 8.0
    contended_procs: int = 4
    contended_tasks: int = 50
    contended_s: float = 2.0
    contended_rounds: int = 5
    wait_few: int = 10
    wait_many: int = 1000
    wait_settle_s: float = 3.0
    wait_window_s: float = 5.0


FULL = Knobs()
QUICK = Knobs(rounds=3, ops=20, uncontended_max_s=5.0, handoff_rounds=1, handoff_samples=5,
              handoff_slow_samples=3, handoff_round_max_s=2.0, contended_procs=2, contended_s=1.0,
              contended_rounds=1, wait_many=50, wait_settle_s=0.5, wait_window_s=1.0)


@dataclass
class Ctx:
    client: Any
    url: str
    knobs: Knobs


def _iqr(values: Sequence[float]) -> str:
    return f"{C.percentile(values, 25):.2f}-{C.percentile(values, 75):.2f}"


def _verdict(ok: bool) -> str:
    return "met" if ok else "MISSED"


def _fill_vs_redis_py(rows: List[C.Row], figure: str) -> None:
    """bench_locks' ``_fill_vs_redis_py``, with this file's reference label."""
    ref = next((r.value for r in rows if r.figure == figure and r.impl == REDIS_PY), None)
    for r in rows:
        if r.figure == figure and ref and r.value is not None:
            r.vs_redis_py = r.value / ref


# --- uncontended ------------------------------------------------------------------------------------

def uncontended(ctx: Ctx, with_locks: bool) -> List[C.Row]:
    """``_common.interleaved``, each timed call one batch of ``ops`` awaited in the loop (one
    ``run_until_complete`` per batch, so the loop's start and stop add < 1 µs per op)."""
    k = ctx.knobs
    aclient = aclient_for(ctx.client)
    sha = run(lambda: aclient.script_load("return 1"))

    def floor_on(on: Any) -> Callable[[], None]:
        """The floor's batch on client ``on``: two ``EVALSHA`` of ``return 1`` per op."""
        async def batch() -> None:
            for _ in range(k.ops):
                await on.evalsha(sha, 0)
                await on.evalsha(sha, 0)

        return lambda: run(batch)

    def batch_of(lock: ALock) -> Callable[[], None]:
        async def go() -> None:
            for _ in range(k.ops):
                await lock.acquire_default()
                await lock.release()

        return lambda: run(go)

    ops: Dict[str, Callable[[], object]] = {FLOOR: floor_on(aclient)}
    rows: List[C.Row] = []
    ours: List[str] = []
    if with_locks:
        for impl in impls("uncontended"):
            problem = check(impl, ctx.client)
            if problem:
                rows.append(not_run("uncontended acquire+release", impl, problem, "µs/op"))
                continue
            ops[impl.label] = batch_of(impl.afactory(aclient, f"bench:async:uncontended:{impl.key}"))
            if impl.ours:
                ours.append(impl.label)
        # and on a client made with redis-py's defaults, as most users' are: redis-py 8's has a
        # 5 s socket timeout, which its own commands (the floor's) pay for with asyncio.wait_for
        defaults = default_aclient(ctx.client)
        ops[FLOOR_DEFAULTS] = floor_on(defaults)
        ops[DEFAULTS] = batch_of(a_distlock(defaults, "bench:async:uncontended:defaults"))
        ours.append(DEFAULTS)
    C.eprint(f"uncontended: {k.rounds} rounds x {k.ops} ops x {len(ops)} candidates, round-robin")
    cpu: Dict[str, List[float]] = {}
    with C.pinned(ctx.client) as pin:
        batches = C.interleaved(ops, rounds=k.rounds, per_round=1, warmup_ops=1,
                                max_seconds=k.uncontended_max_s, cpu=cpu)
    calls = {name: _calls_per_op(ctx.client, fn, k.ops) for name, fn in ops.items()}
    per_round = {name: [v / k.ops for v in values] for name, values in batches.items()}
    cpu = {name: [v / k.ops for v in values] for name, values in cpu.items()}
    vs_floor = C.per_round_ratios(per_round, FLOOR)
    cpu_vs_floor = C.per_round_ratios(cpu, FLOOR)
    vs_redis = C.per_round_ratios(per_round, REDIS_PY) if REDIS_PY in per_round else {}
    floor = per_round[FLOOR]
    out = [C.Row("floor", "2 x EVALSHA 'return 1' (redis.asyncio)", C.median(floor), "µs/pair", 1.0,
                 note=f"median of {len(floor)} rounds x {k.ops}; min {min(floor):.0f}; {pin}; "
                      f"{calls[FLOOR].replace('per op', 'per pair')}",
                 data={"per_round_us": floor})]
    if FLOOR_DEFAULTS in per_round:
        out.append(C.Row("floor", "2 x EVALSHA, default client", C.median(per_round[FLOOR_DEFAULTS]),
                         "µs/pair", C.median(vs_floor[FLOOR_DEFAULTS]),
                         note=f"the same on a client with redis-py's defaults (a socket timeout); "
                              f"ratio IQR {_iqr(vs_floor[FLOOR_DEFAULTS])}",
                         data={"per_round_us": per_round[FLOOR_DEFAULTS]}))
    for label, values in per_round.items():
        if label in (FLOOR, FLOOR_DEFAULTS):
            continue
        ratio = C.median(vs_floor[label])
        note = f"ratio IQR {_iqr(vs_floor[label])}; {calls[label]}"
        if label == DEFAULTS and FLOOR_DEFAULTS in per_round:
            same = C.median(C.per_round_ratios(per_round, FLOOR_DEFAULTS)[label])
            note = f"{same:.2f}x the floor on the same client; " + note
        if label in ours:
            note = f"target <= 1.15x floor: {_verdict(ratio <= 1.15)}; " + note
        out.append(C.Row("uncontended acquire+release", label, C.median(values), "µs/op", ratio,
                         C.median(vs_redis[label]) if vs_redis else None, note,
                         {"per_round_us": values, "per_round_vs_floor": vs_floor[label]}))
    out += rows
    for label, values in cpu.items():
        out.append(C.Row("client CPU per acquire+release", label, C.median(values), "µs/op",
                         C.median(cpu_vs_floor[label]),
                         note=f"time.process_time(), ratio to the floor's per round; IQR "
                              f"{_iqr(cpu_vs_floor[label])}",
                         data={"per_round_cpu_us": values,
                               "per_round_cpu_vs_floor": cpu_vs_floor[label]}))
    return out


def _calls_per_op(client: Any, batch: Callable[[], object], ops: int) -> str:
    """What one op of ``batch`` (``ops`` ops) runs on the server, from INFO commandstats (the
    commands a script runs count too)."""
    before = C.command_calls(client)
    batch()
    calls = C.calls_delta(before, C.command_calls(client))
    scripts = calls.get("evalsha", 0) + calls.get("eval", 0)
    return f"{scripts / ops:.1f} EVALSHA, {sum(calls.values()) / ops:.1f} commands per op"


# --- handoff --------------------------------------------------------------------------------------

PUBLISH = "return redis.call('PUBLISH', KEYS[1], ARGV[1])"


def a_floor_holder(aclient: Any, name: str) -> ALock:
    """The holder's side of the handoff floor: ``release()`` is one EVALSHA of a script that
    PUBLISHes (as a lock's release script would), through ``redis.asyncio``."""
    script = aclient.register_script(PUBLISH)

    async def taken(timeout: float) -> bool:
        return True

    return ALock(taken, lambda: script(keys=[f"{name}:floor"], args=["1"]), lambda: taken(0), script)


def a_floor_waiter(aclient: Any, name: str) -> ALock:
    """The waiter's side of the handoff floor: a task subscribed through ``redis.asyncio``
    pub/sub; ``acquire()`` awaits the message, then makes one EVALSHA, and returns. Made outside
    the loop (the handoff harness' waiter calls the factory before it reports ready), so the
    subscription is confirmed here."""
    pubsub = aclient.pubsub()
    script = aclient.register_script("return 1")

    async def subscribe() -> None:
        await pubsub.subscribe(f"{name}:floor")
        confirmed = await pubsub.get_message(timeout=10.0)
        if (confirmed or {}).get("type") != "subscribe":
            raise RuntimeError("handoff floor: subscription not confirmed")
        await script()  # loads the script: the samples' EVALSHA finds it

    async def acquire(timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            if await pubsub.get_message(ignore_subscribe_messages=True, timeout=left) is not None:
                await script()
                return True
        return False

    async def nothing() -> None:
        return None

    run(subscribe)
    return ALock(acquire, nothing, lambda: acquire(60.0), pubsub)


FLOOR_HOLDER, FLOOR_WAITER = Blocking(a_floor_holder), Blocking(a_floor_waiter)
HANDOFF_FLOOR = "floor: async pub/sub hop + 1 EVALSHA"


def handoff(ctx: Ctx) -> List[C.Row]:
    """``_common.handoff_latency`` per candidate per round, the candidates round-robin; each
    call starts a fresh waiter process (its first 3 samples are dropped)."""
    k = ctx.knobs
    rows: List[C.Row] = []
    # label -> (holder factory, waiter factory, samples per round)
    cands: Dict[str, Tuple[Any, Any, int]] = {HANDOFF_FLOOR: (FLOOR_HOLDER, FLOOR_WAITER, k.handoff_samples)}
    keys = {HANDOFF_FLOOR: "floor"}
    ours: List[str] = []
    for impl in impls("handoff"):
        problem = check(impl, ctx.client)
        if problem:
            rows.append(not_run("handoff median", impl, problem, "ms"))
            continue
        slow = not impl.ours  # the peers poll: ~50 ms a sample
        cands[impl.label] = (impl.factory, impl.factory,
                             k.handoff_slow_samples if slow else k.handoff_samples)
        keys[impl.label] = impl.key
        if impl.ours:
            ours.append(impl.label)
    labels = list(cands)
    lat: Dict[str, List[float]] = {label: [] for label in labels}
    round_medians: Dict[str, List[float]] = {label: [] for label in labels}
    failures: Dict[str, int] = {label: 0 for label in labels}
    for rnd in range(k.handoff_rounds):
        C.eprint(f"handoff: round {rnd + 1}/{k.handoff_rounds}, {len(labels)} candidates")
        for label in C.round_robin(labels, rnd):
            holder, waiter, samples = cands[label]
            res = C.handoff_latency(ctx.client, ctx.url, holder, f"bench:async:handoff:{keys[label]}",
                                    samples=samples, max_seconds=k.handoff_round_max_s,
                                    waiter_factory=waiter, seed=rnd + 1)
            ms = [x * 1000.0 for x in res["latencies"]]
            lat[label] += ms
            round_medians[label].append(C.median(ms))
            failures[label] += res["failures"]
    vs_floor = C.per_round_ratios(round_medians, HANDOFF_FLOOR)
    floor_med, floor_p99 = C.median(lat[HANDOFF_FLOOR]), C.percentile(lat[HANDOFF_FLOOR], 99)
    redis_med = C.median(lat[REDIS_PY]) if REDIS_PY in lat else None
    redis_p99 = C.percentile(lat[REDIS_PY], 99) if REDIS_PY in lat else None
    medians: List[C.Row] = []
    p99s: List[C.Row] = []
    for label in labels:
        values = lat[label]
        med, p99 = C.median(values), C.percentile(values, 99)
        n = f"n={len(values)} in {len(round_medians[label])} rounds"
        if failures[label]:
            n += f", {failures[label]} acquire timeouts"
        data = {"latencies_ms": values, "round_medians_ms": round_medians[label],
                "round_vs_floor": vs_floor[label]}
        if label == HANDOFF_FLOOR:
            note = ("no lock: EVALSHA of a PUBLISH script here -> the subscribed task in the "
                    f"waiter process wakes, makes one EVALSHA; {n}")
            medians.append(C.Row("handoff median", label, med, "ms", 1.0, note=note, data=data))
            p99s.append(C.Row("handoff p99", label, p99, "ms", 1.0))
            continue
        ratio = C.median(vs_floor[label])
        note = (f"ratio of round medians: IQR {_iqr(vs_floor[label])}; pooled "
                f"{med / floor_med:.2f}x; {n}")
        if label in ours:  # the blocking shell's targets (bench_locks.py), against the async floor
            target = HANDOFF_TARGETS.get(label, 1.10)
            note = f"target <= {target:.2f}x floor: {_verdict(ratio <= target)}; " + note
        medians.append(C.Row("handoff median", label, med, "ms", ratio,
                             med / redis_med if redis_med else None, note, data))
        p99s.append(C.Row("handoff p99", label, p99, "ms", p99 / floor_p99 if floor_p99 else None,
                          p99 / redis_p99 if redis_p99 else None, note="pooled samples"))
    local = handoff_local(ctx, floor_med)
    return medians + rows + p99s + local


#: hand-off to a task in another process, as a ratio to the async hop floor: a default lock's
#: waiter within 1.10 x, a fair one's within 1.0 x (its release hands the lock straight over)
HANDOFF_TARGETS = {"DistLock": 1.10, "DistLock fair": 1.0}

LOCAL_MEDIAN, LOCAL_P99 = "in-process handoff median", "in-process handoff p99"


def handoff_local(ctx: Ctx, floor_med: float) -> List[C.Row]:
    """The hand-off between two tasks of one event loop, on one client: from the start of the
    holder task's ``release()`` to the return of the waiting task's ``acquire()``; as a ratio
    to the cross-process floor of the same run (``handoff``). Each sample: the holder takes
    the lock, starts the waiter task, sleeps 30 to 130 ms, stamps the clock and releases."""
    k = ctx.knobs
    rows: List[C.Row] = []
    medians: Dict[str, float] = {}
    for impl in [i for i in IMPLS if i.key in ("distlock", "distlock_fair", "distrlock", "redis_py")]:
        problem = check(impl, ctx.client)
        if problem:
            rows.append(not_run(LOCAL_MEDIAN, impl, problem, "ms"))
            continue
        slow = not impl.ours
        samples = (k.handoff_slow_samples if slow else k.handoff_samples) * k.handoff_rounds
        C.eprint(f"handoff in-process: {impl.label} (up to {samples} samples)")
        lat, failures = run(lambda impl=impl, samples=samples: _local_samples(  # type: ignore[misc]
            impl.afactory, aclient_for(ctx.client), f"bench:async:handoff-local:{impl.key}",
            samples, k.handoff_round_max_s * k.handoff_rounds))
        ms = [x * 1000.0 for x in lat]
        med, p99 = C.median(ms), C.percentile(ms, 99)
        medians[impl.label] = med
        n = f"n={len(ms)}" + (f", {failures} acquire timeouts" if failures else "")
        verdict = ""
        if impl.ours and floor_med:
            verdict = f"target <= 1.00x floor: {_verdict(med / floor_med <= 1.0)}; "
        rows.append(C.Row(LOCAL_MEDIAN, impl.label, med, "ms", med / floor_med if floor_med else None,
                          note=verdict + n, data={"latencies_ms": ms}))
        rows.append(C.Row(LOCAL_P99, impl.label, p99, "ms", note=n))
    ref = medians.get(REDIS_PY)
    for r in rows:
        if r.figure == LOCAL_MEDIAN and ref and r.value is not None:
            r.vs_redis_py = r.value / ref
    return rows


async def _local_samples(afactory: AFactory, aclient: Any, name: str, samples: int,
                         max_seconds: float, warmup: int = 3) -> Tuple[List[float], int]:
    rng = random.Random(1)
    holder, waiter = afactory(aclient, name), afactory(aclient, name)

    async def wait() -> Tuple[bool, float]:
        ok = bool(await waiter.acquire(10.0))
        t1 = time.monotonic()
        if ok:
            await waiter.release()
        return ok, t1

    lat: List[float] = []
    failures = 0
    started = time.monotonic()
    attempt = 0
    while len(lat) < samples and attempt < samples + warmup + 20:
        if time.monotonic() - started > max_seconds:
            break
        if not await holder.acquire(10.0):
            raise RuntimeError(f"holder could not take {name!r} in 10 s")
        task = asyncio.ensure_future(wait())
        await asyncio.sleep(rng.uniform(0.03, 0.13))
        t0 = time.monotonic()
        await holder.release()
        ok, t1 = await task
        attempt += 1
        if not ok:
            failures += 1
        elif attempt > warmup:
            lat.append(t1 - t0)
    return lat, failures


# --- asyncio workers, in place of _common's threaded ones -----------------------------------------

@contextlib.contextmanager
def _async_worker(name: str, replacement: Callable[..., None]) -> Iterator[None]:
    """Run ``_common``'s harness with ``replacement`` as its worker ``_common.<name>``: same
    arguments, same messages, tasks in one loop instead of threads.

    TODO(_common): give ``contended_throughput`` and ``hold_and_wait`` a ``worker=`` argument
    and pass these workers to it instead. Spawned workers unpickle their target by its own
    module and name, so only the parent (this process, single-threaded here) sees the swap."""
    original = getattr(C, name)  # AttributeError at once if _common renames it
    setattr(C, name, replacement)
    try:
        yield
    finally:
        setattr(C, name, original)


def _async_contended_worker(url: str, spec: Tuple[Blocking, int], name: str, counter_key: str,
                            acquire_timeout: float, conn: Connection) -> None:
    """``_common._contended_worker`` with ``spec = (factory, tasks)``: per window, ``tasks``
    tasks (each with its own lock object, on the process' one client) loop ``acquire; GET;
    SET + 1; release`` until the window ends. A waiting acquire gives up at the end of the
    window (not counted as a timeout): otherwise every task still queued then would take its
    turn after it, and that tail, not the window, would make the figure. An operation that has
    the lock finishes. An acquire that raises counts as a timeout, and ends its task."""
    factory, tasks = spec
    client = C.connect(url)
    locks: List[ALock] = [factory(client, name).obj for _ in range(tasks)]
    aclient = aclient_for(client)

    async def window(start_at: float, end_at: float) -> Dict[str, Any]:
        counts = {"increments": 0, "timeouts": 0, "release_errors": 0}

        async def task(lock: ALock) -> None:
            while (left := end_at - time.monotonic()) > 0:
                try:
                    ok = await lock.acquire(min(acquire_timeout, left))
                except Exception:  # noqa: BLE001 - counted, see above
                    counts["timeouts"] += 1
                    return
                if not ok:
                    counts["timeouts"] += left > acquire_timeout  # not the end of the window
                    continue
                try:
                    value = await aclient.get(counter_key)
                    await aclient.set(counter_key, int(value or 0) + 1)
                    counts["increments"] += 1
                finally:
                    try:
                        await lock.release()
                    except Exception:  # noqa: BLE001 - a lost lease is counted, not fatal
                        counts["release_errors"] += 1

        await asyncio.sleep(max(0.0, start_at - time.monotonic()))
        await asyncio.gather(*(task(lock) for lock in locks))
        return {**counts, "finished": time.monotonic()}

    try:
        conn.send("ready")
        while True:
            command = C._next_command(conn)
            if command is None:
                return
            start_at, end_at = command
            conn.send(run(lambda s=start_at, e=end_at: window(s, e)))
    except (EOFError, BrokenPipeError, ConnectionResetError, KeyboardInterrupt):
        return
    finally:
        shutdown()


def _async_waiters_worker(url: str, factory: Blocking, names: List[str], threads: int,
                          wait_timeout: float, client_name: str, stagger: float,
                          conn: Connection) -> None:
    """``_common._waiters_worker`` with tasks: ``threads`` tasks of one loop, task i waiting on
    ``names[i % len(names)]`` through the process' one client, named ``client_name``."""
    client = C.connect(url, client_name=client_name)
    locks: List[ALock] = [factory(client, names[i % len(names)]).obj for i in range(threads)]

    async def wait_all() -> Dict[str, Any]:
        results: List[Optional[Tuple[bool, float]]] = [None] * threads
        errors: List[str] = []

        async def wait(i: int) -> None:
            if stagger:
                await asyncio.sleep(stagger * i)
            try:
                ok = await locks[i].acquire(wait_timeout)
                at = time.monotonic()
                if ok:
                    await locks[i].release()
            except Exception as exc:  # noqa: BLE001 - reported to the parent, not printed here
                errors.append(f"{type(exc).__name__}: {exc}"[:120])
                return
            results[i] = (ok, at)

        tasks = [asyncio.ensure_future(wait(i)) for i in range(threads)]
        await asyncio.sleep(0)  # every task has started, up to its first await
        conn.send("started")
        _, pending = await asyncio.wait(tasks, timeout=wait_timeout + 30.0)
        for task in pending:
            task.cancel()
        done = [r for r in results if r is not None]
        return {"acquired": sum(1 for ok, _ in done if ok),
                "timed_out": sum(1 for ok, _ in done if not ok),
                "unfinished": threads - len(done) - len(errors), "errors": errors,
                "drained": len(done) == threads, "acquired_at": [at for ok, at in done if ok]}

    try:
        conn.send("ready")
        if C._next_command(conn) != "go":
            return
        conn.send(run(wait_all))
    except (EOFError, BrokenPipeError, ConnectionResetError, KeyboardInterrupt):
        return
    finally:
        shutdown()


# --- contended --------------------------------------------------------------------------------------

def contended(ctx: Ctx) -> List[C.Row]:
    k = ctx.knobs
    figure = f"contended ops/s, {k.contended_procs} procs x {k.contended_tasks} tasks"
    rows: List[C.Row] = []
    chosen: List[Impl] = []
    for impl in impls("contended"):
        problem = check(impl, ctx.client)
        if problem:
            rows.append(not_run(figure, impl, problem, "ops/s"))
        else:
            chosen.append(impl)
    C.eprint(f"contended: {len(chosen)} candidates x {k.contended_rounds} rounds x "
             f"{k.contended_procs} processes x {k.contended_tasks} tasks x {k.contended_s:g} s")
    with _async_worker("_contended_worker", _async_contended_worker):
        results = C.contended_throughput(
            ctx.client, ctx.url,
            {impl.label: ((impl.factory, k.contended_tasks), f"bench:async:contended:{impl.key}",
                          f"bench:async:counter:{impl.key}") for impl in chosen},
            procs=k.contended_procs, seconds=k.contended_s, rounds=k.contended_rounds)
    out, lost = C.contended_rows(results, [impl.label for impl in chosen],
                                 [impl.label for impl in chosen if impl.ours], figure, REDIS_PY)
    return out + rows + lost


# --- waiting --------------------------------------------------------------------------------------

#: How long the waiting tasks have, after the measurement, to take the lock in turn; those
#: not served by then time out (reported). DistLock's 1,000 take about a second; the pollers'
#: tasks, which all started at one instant, poll in step, and one gets the lock per 0.1 s poll.
WAIT_DRAIN_S = 15.0


def waiting(ctx: Ctx) -> List[C.Row]:
    """``_common.hold_and_wait`` (with tasks), once for ``wait_few`` and once for ``wait_many``
    waiting tasks per candidate: connections of the waiting process and the server's commands/s
    while they wait."""
    k, client = ctx.knobs, ctx.client
    rows: List[C.Row] = []
    counts = (k.wait_few, k.wait_many) if k.wait_many != k.wait_few else (k.wait_few,)
    figs = {n: (f"waiting {n:,} tasks: connections", f"waiting {n:,} tasks: commands/s") for n in counts}
    by_impl: Dict[str, Dict[int, int]] = {}
    for impl in impls("waiting"):
        problem = check(impl, client)
        if problem:
            rows += [not_run(fig, impl, problem, "") for n in counts for fig in figs[n]]
            continue
        by_impl[impl.label] = {}
        for n in counts:
            C.eprint(f"waiting: {impl.label}, {n} tasks (settle {k.wait_settle_s:g} s, "
                     f"window {k.wait_window_s:g} s)")
            tag = f"bench-async-wait-{impl.key}-{n}"
            baseline = int(client.info("clients")["connected_clients"])

            def measure(tag: str = tag) -> Dict[str, Any]:
                looks = [C.connections_named(client, tag)]
                total = int(client.info("clients")["connected_clients"])
                rate = C.command_rate(client, k.wait_window_s)
                looks.append(C.connections_named(client, tag))
                return {"looks": looks, "connected_clients": total, "rate": rate}

            try:
                with _async_worker("_waiters_worker", _async_waiters_worker):
                    seen, report = C.hold_and_wait(
                        client, ctx.url, impl.factory, [f"bench:async:wait:{impl.key}:{n}"], measure,
                        threads=n, settle=k.wait_settle_s, client_name=tag,
                        wait_timeout=k.wait_settle_s + k.wait_window_s + WAIT_DRAIN_S,
                        drain_timeout=WAIT_DRAIN_S + 30.0)
            except Exception as exc:  # noqa: BLE001 - a peer that fails is reported, not fatal
                rows += [C.Row(fig, impl.label, None, "", note=f"failed: {exc!r}") for fig in figs[n]]
                continue
            conns = max(seen["looks"])
            by_impl[impl.label][n] = conns
            rate = seen["rate"]
            waiters = _waiter_note(report, n)
            note = (f"CLIENT LIST by name, looks {seen['looks']}; server total "
                    f"{seen['connected_clients'] - baseline:+d} from before (with the holder's)")
            if impl.ours and n == counts[-1]:
                few = by_impl[impl.label].get(counts[0], conns)
                note = (f"target flat and <= 8: {_verdict(conns <= 8 and conns == few)} "
                        f"({few} for {counts[0]} tasks); " + note)
            rows.append(C.Row(figs[n][0], impl.label, float(conns), "conns", note=note + waiters,
                              data={"measure": seen, "waiters": report}))
            top = ", ".join(f"{cmd} {c}" for cmd, c in list(rate["by_command"].items())[:3]) or "none"
            note = f"{rate['total']} commands in {rate['seconds']:.1f} s ({top})"
            if impl.ours:
                note = f"target <= 5/s: {_verdict(rate['per_s'] <= 5)}; " + note
            rows.append(C.Row(figs[n][1], impl.label, rate["per_s"], "cmd/s", note=note + waiters))
    for n in counts:
        for fig in figs[n]:
            _fill_vs_redis_py(rows, fig)
    order = [fig for n in counts for fig in figs[n]]
    rows.sort(key=lambda r: order.index(r.figure))
    return rows


# --- main ---------------------------------------------------------------------------------------

def _run(client: Any, url: str, knobs: Knobs, figures: List[str]) -> List[C.Row]:
    ctx = Ctx(client, url, knobs)
    rows: List[C.Row] = []
    try:
        if "floor" in figures or "uncontended" in figures:
            rows += uncontended(ctx, with_locks="uncontended" in figures)
        if "handoff" in figures:
            rows += handoff(ctx)
        if "contended" in figures:
            rows += contended(ctx)
        if "waiting" in figures:
            rows += waiting(ctx)
    finally:
        shutdown()
    return rows


def main(argv: Optional[List[str]] = None) -> int:
    return C.bench_main(
        argv, doc=__doc__, title="distlock.asyncio benchmarks", figures=FIGURES, full=FULL,
        quick=QUICK,
        options=(C.Option("--rounds", "rounds", int, 1, "uncontended: rounds (default 40; quick 3)"),
                 C.Option("--ops", "ops", int, 1,
                          "uncontended: ops per candidate per round (200; quick 20)"),
                 C.Option("--tasks", "wait_many", int, 1,
                          "waiting: the larger number of waiting tasks (1000; quick 50)")),
        run=_run,
        versions=(("redis-py", "redis"), ("pottery", "pottery")))


if __name__ == "__main__":
    sys.exit(main())
