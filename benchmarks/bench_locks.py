#!/usr/bin/env python
"""DistLock and DistRLock side by side with redis-py's Lock, python-redis-lock and pottery.

Every figure of the benchmark table in one run, against one freshly started private
redis-server on 127.0.0.1:

- floor: two EVALSHA of ``return 1`` through the same redis-py client (µs per pair);
- uncontended: acquire + release, µs/op, as a ratio to the floor measured in the same rounds
  (DistLock also on a client made with redis-py's defaults, as most users' are); and the
  client process' CPU time per acquire + release, as a ratio to the floor's CPU time;
- handoff: from the start of ``release()`` here to the return of ``acquire()`` in another
  process that was blocked on it (median and p99);
- contended: 4 processes, then 16, doing GET/SET of a counter under the lock for a fixed time,
  in 5 interleaved rounds: ops/s (and the ratio to redis-py's in the same round), lost updates,
  and fairness: per round, the least process' increments over the mean of the processes (the
  median over the rounds; targets: default locks >= 0.8, fair locks >= 0.95, peers reported);
  the fair locks' ops/s are also reported against the default lock of their kind;
- herd: Redis commands (INFO commandstats) and EVALSHA per hand-off while 1, 10 or 50 processes
  wait on a lock and each takes it once after this process releases it (flat: the 50-process
  figure at most 1.25 x the 1-process one);
- idle: Redis commands/s (INFO commandstats, where the commands a script runs count too)
  while 10 threads of one process wait on a lock held elsewhere;
- connections: Redis connections of one process whose 10 or 100 threads wait on 10 locks.

Usage::

    python benchmarks/bench_locks.py [--quick] [--json out.json] [--contended-rounds N] [figure ...]

Figures: floor, uncontended, handoff, contended, herd, idle, connections (default: all). The
table goes to stdout, progress to stderr. ``--quick`` is a short smoke run whose numbers mean
little (its contended runs have 2 and 4 processes, its herd 1 and 5). The yield rule's
fairness/throughput curve is ``benchmarks/bench_fairness.py``.
"""

from __future__ import annotations

import math
import os
import sys
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Tuple

import redis

if __package__ in (None, ""):  # run as a script: make ``benchmarks`` and ``distlock`` importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import _common as C  # noqa: E402
from benchmarks._internals import Keys, settings
from distlock import DistLock, DistRLock

try:
    import redis_lock
except ImportError:  # pragma: no cover - the "bench" extra is not installed
    redis_lock = None
try:
    import pottery
except ImportError:  # pragma: no cover
    pottery = None

FIGURES = ("floor", "uncontended", "handoff", "contended", "herd", "idle", "connections")


# --- the implementations: module-level factories, so spawned workers can unpickle them ------------

def make_distlock(client: Any, name: str) -> C.LockHandle:
    lock = DistLock(name, client=client)
    return C.LockHandle(lambda t: lock.acquire(timeout=t), lock.release, lock.acquire, lock)


def make_distrlock(client: Any, name: str) -> C.LockHandle:
    lock = DistRLock(name, client=client)
    return C.LockHandle(lambda t: lock.acquire(timeout=t), lock.release, lock.acquire, lock)


def make_distlock_fair(client: Any, name: str) -> C.LockHandle:
    lock = DistLock(name, client=client, fair=True)
    return C.LockHandle(lambda t: lock.acquire(timeout=t), lock.release, lock.acquire, lock)


def make_distrlock_fair(client: Any, name: str) -> C.LockHandle:
    lock = DistRLock(name, client=client, fair=True)
    return C.LockHandle(lambda t: lock.acquire(timeout=t), lock.release, lock.acquire, lock)


def make_redis_py(client: Any, name: str) -> C.LockHandle:
    lock = client.lock(name)  # its defaults: no expiry, polls every 0.1 s
    return C.LockHandle(lambda t: lock.acquire(blocking_timeout=t), lock.release, lock.acquire, lock)


def make_python_redis_lock(client: Any, name: str) -> C.LockHandle:
    lock = redis_lock.Lock(client, name)  # its defaults: no expiry, waiters BLPOP a signal list
    return C.LockHandle(lambda t: lock.acquire(timeout=max(1, math.ceil(t))), lock.release,
                        lock.acquire, lock)


def make_pottery(client: Any, name: str) -> C.LockHandle:
    lock = pottery.Redlock(key=name, masters={client})  # its defaults: 10 s lease, random retry
    return C.LockHandle(lambda t: lock.acquire(timeout=t), lock.release, lock.acquire, lock)


@dataclass(frozen=True)
class Impl:
    key: str
    label: str
    factory: C.LockFactory
    available: bool = True


IMPLS = [
    Impl("distlock", "DistLock", make_distlock),
    Impl("distrlock", "DistRLock", make_distrlock),
    # fair=True: candidates the handoff and contended figures measure beside the default locks
    Impl("distlock_fair", "DistLock fair", make_distlock_fair),
    Impl("distrlock_fair", "DistRLock fair", make_distrlock_fair),
    Impl("redis_py", "redis-py Lock", make_redis_py),
    Impl("python_redis_lock", "python-redis-lock", make_python_redis_lock, redis_lock is not None),
    Impl("pottery", "pottery Redlock", make_pottery, pottery is not None),
]
REDIS_PY = "redis-py Lock"
#: the uncontended figure's DistLock on a client made with redis-py's defaults
DEFAULTS = "DistLock, default client"


def impls(*keys: str) -> List[Impl]:
    return [i for i in IMPLS if i.key in keys and i.available]


# --- knobs --------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Knobs:
    rounds: int = 40
    ops: int = 200
    uncontended_max_s: float = 180.0
    handoff_samples: int = 100
    handoff_max_s: float = 25.0
    handoff_slow_samples: int = 60  # the polling peers (redis-py Lock, pottery)
    handoff_slow_max_s: float = 12.0
    contended_procs: int = 4
    contended_procs_many: int = 16  # the second contended run: throughput and fairness
    contended_s: float = 1.0
    contended_rounds: int = 5
    herd_waiting: Tuple[int, ...] = (1, 10, 50)  # waiting processes of the commands-per-hand-off figure
    herd_settle_s: float = 0.5
    idle_threads: int = 10
    idle_settle_s: float = 2.0
    idle_window_s: float = 5.0
    conn_locks: int = 10
    conn_threads: tuple = (10, 100)
    conn_settle_s: float = 3.0
    conn_stagger_s: float = 0.01  # the extra "starts spread out" run of the largest thread count


FULL = Knobs()
QUICK = Knobs(rounds=3, ops=20, uncontended_max_s=10.0, handoff_samples=8, handoff_max_s=2.0,
              handoff_slow_samples=4, handoff_slow_max_s=1.5, contended_procs=2,
              contended_procs_many=4, contended_s=0.3, contended_rounds=2, herd_waiting=(1, 5),
              herd_settle_s=0.3,
              idle_settle_s=0.5, idle_window_s=1.0, conn_settle_s=0.5, conn_stagger_s=0.0)


@dataclass
class Ctx:
    client: Any
    url: str
    knobs: Knobs


# --- figures ------------------------------------------------------------------------------------

def uncontended(ctx: Ctx, with_locks: bool) -> List[C.Row]:
    client, k = ctx.client, ctx.knobs
    script = client.register_script("return 1")

    def floor() -> None:
        script()
        script()

    ops: Dict[str, Callable[[], object]] = {"floor": floor}
    defaults = None
    if with_locks:
        for impl in impls("distlock", "distrlock", "redis_py", "python_redis_lock", "pottery"):
            handle = impl.factory(client, f"bench:uncontended:{impl.key}")
            ops[impl.label] = C.cycle(handle.acquire_default, handle.release)
        # What most users have: redis-py 8's own defaults (a 5 s socket timeout), whose pool
        # the session adopts, where the benchmark's client (no timeout) gets a pool of the
        # session's own (see docs/how-it-works.rst, the direct path)
        defaults = redis.Redis.from_url(ctx.url)
        lock = DistLock("bench:uncontended:defaults", client=defaults)
        ops[DEFAULTS] = C.cycle(lock.acquire, lock.release)
    C.eprint(f"uncontended: {k.rounds} rounds x {k.ops} ops x {len(ops)} candidates, round-robin")
    cpu: Dict[str, List[float]] = {}
    try:
        with C.pinned(client) as pin:
            per_round = C.interleaved(ops, rounds=k.rounds, per_round=k.ops,
                                      max_seconds=k.uncontended_max_s, cpu=cpu)
    finally:
        if defaults is not None:
            defaults.close()
    cpu_vs_floor = C.per_round_ratios(cpu, "floor")
    vs_floor = C.per_round_ratios(per_round, "floor")
    vs_redis = C.per_round_ratios(per_round, REDIS_PY) if REDIS_PY in per_round else {}
    n = len(per_round["floor"])
    rows = [C.Row("floor", "2 x EVALSHA 'return 1'", C.median(per_round["floor"]), "µs/pair", 1.0,
                  note=f"median of {n} rounds x {k.ops}; min {min(per_round['floor']):.0f}; {pin}",
                  data={"per_round_us": per_round["floor"]})]
    for label, values in per_round.items():
        if label == "floor":
            continue
        ratio = C.median(vs_floor[label])
        note = (f"ratio IQR {C.percentile(vs_floor[label], 25):.2f}-"
                f"{C.percentile(vs_floor[label], 75):.2f}")
        if label in ("DistLock", "DistRLock", DEFAULTS):
            note += "; target <= 1.10x floor: " + ("met" if ratio <= 1.10 else "MISSED")
        rows.append(C.Row("uncontended acquire+release", label, C.median(values), "µs/op", ratio,
                          C.median(vs_redis[label]) if vs_redis else None, note,
                          {"per_round_us": values, "per_round_vs_floor": vs_floor[label]}))
    # The server's share: the scripts' own time, which the 2 x ``return 1`` floor hardly has
    server = {label: C.script_server_us(client, ops[label], k.ops) for label in ("floor", "DistLock")
              if label in ops}
    if "DistLock" in server:
        extra = server["DistLock"] - server["floor"]
        floor_us = C.median(per_round["floor"])
        rows.append(C.Row("server time in scripts", "DistLock", server["DistLock"], "µs/op",
                          server["DistLock"] / max(server["floor"], 1e-9),
                          note=f"INFO commandstats, acquire+release; the floor's 2 scripts "
                               f"{server['floor']:.1f} µs: the lock's scripts alone put it at "
                               f">= {(floor_us + extra) / floor_us:.2f}x floor"))
    for label, values in cpu.items():
        ratio = C.median(cpu_vs_floor[label])
        rows.append(C.Row("client CPU per acquire+release", label, C.median(values), "µs/op", ratio,
                          note=f"time.process_time(), ratio to the floor's per round; median of "
                               f"{len(values)} rounds",
                          data={"per_round_cpu_us": values,
                                "per_round_cpu_vs_floor": cpu_vs_floor[label]}))
    return rows


def handoff(ctx: Ctx) -> List[C.Row]:
    k = ctx.knobs
    rows: List[C.Row] = []
    for impl in impls("distlock", "distlock_fair", "redis_py", "python_redis_lock", "pottery"):
        slow = impl.key in ("redis_py", "pottery")
        samples = k.handoff_slow_samples if slow else k.handoff_samples
        cap = k.handoff_slow_max_s if slow else k.handoff_max_s
        C.eprint(f"handoff: {impl.label} (up to {samples} samples / {cap:g} s)")
        res = C.handoff_latency(ctx.client, ctx.url, impl.factory, f"bench:handoff:{impl.key}",
                                samples=samples, max_seconds=cap)
        lat_ms = [x * 1000.0 for x in res["latencies"]]
        med, p99 = C.median(lat_ms), C.percentile(lat_ms, 99)
        note = f"n={len(lat_ms)}{' (capped)' if res['capped'] else ''}"
        if res["failures"]:
            note += f", {res['failures']} acquire timeouts"
        data = {"latencies_ms": lat_ms, **{kk: v for kk, v in res.items() if kk != "latencies"}}
        rows.append(C.Row("handoff median", impl.label, med, "ms", note=note, data=data))
        rows.append(C.Row("handoff p99", impl.label, p99, "ms", note=note))
    rows += handoff_local(ctx)
    C.add_hint_floor(rows, ctx.client, ctx.url, {"handoff median": 50, "handoff p99": 99,
                                                 LOCAL_MEDIAN: 50, LOCAL_P99: 99},
                     samples=k.handoff_samples, max_seconds=k.handoff_max_s)
    # issue 28's targets, as ratios to this run's floor (never an absolute time): a default
    # lock's waiter in another process within 1.10 x the hop, a fair one's within 1.0 x, and
    # a waiting thread of the releasing process within 1.0 x
    targets = {("handoff median", "DistLock"): 1.10, ("handoff median", "DistLock fair"): 1.0,
               (LOCAL_MEDIAN, "DistLock"): 1.0}
    for r in rows:
        target = targets.get((r.figure, r.impl))
        if target is not None and r.vs_floor is not None:
            r.note += f"; target <= {target:.2f}x floor: " + ("met" if r.vs_floor <= target else "MISSED")
    order = ["handoff median", "handoff p99", LOCAL_MEDIAN, LOCAL_P99]
    rows.sort(key=lambda r: order.index(r.figure))  # medians first, then p99s (stable)
    for figure in order:
        _fill_vs_redis_py(rows, lambda r, f=figure: r.figure == f,  # type: ignore[misc]
                          {r.impl: r.value for r in rows if r.figure == figure})
    _note_vs(rows, LOCAL_MEDIAN, "python-redis-lock")
    return rows


LOCAL_MEDIAN, LOCAL_P99 = "in-process handoff median", "in-process handoff p99"


def handoff_local(ctx: Ctx) -> List[C.Row]:
    """The hand-off between two threads of one process (``C.handoff_latency_local``): what a
    lock that hands over within the process saves; a polling peer polls here as well."""
    k = ctx.knobs
    rows: List[C.Row] = []
    for impl in impls("distlock", "distrlock", "redis_py", "python_redis_lock"):
        slow = impl.key == "redis_py"
        samples = k.handoff_slow_samples if slow else k.handoff_samples
        cap = k.handoff_slow_max_s if slow else k.handoff_max_s
        C.eprint(f"handoff in-process: {impl.label} (up to {samples} samples / {cap:g} s)")
        res = C.handoff_latency_local(ctx.client, impl.factory, f"bench:handoff-local:{impl.key}",
                                      samples=samples, max_seconds=cap)
        lat_ms = [x * 1000.0 for x in res["latencies"]]
        note = f"n={len(lat_ms)}{' (capped)' if res['capped'] else ''}"
        if res["failures"]:
            note += f", {res['failures']} acquire timeouts"
        data = {"latencies_ms": lat_ms, **{kk: v for kk, v in res.items() if kk != "latencies"}}
        rows.append(C.Row(LOCAL_MEDIAN, impl.label, C.median(lat_ms), "ms", note=note, data=data))
        rows.append(C.Row(LOCAL_P99, impl.label, C.percentile(lat_ms, 99), "ms", note=note))
    return rows


def _note_vs(rows: List[C.Row], figure: str, peer: str) -> None:
    """Add to the notes of distlock's ``figure`` rows their ratio to ``peer``'s in this run."""
    theirs = next((r.value for r in rows if r.figure == figure and r.impl == peer), None)
    if not theirs:
        return
    for r in rows:
        if r.figure == figure and r.impl.startswith("Dist") and r.value is not None:
            r.note = (r.note + "; " if r.note else "") + f"{r.value / theirs:.2f} x {peer}"


#: fairness targets of the contended figure (min/mean increments per process); peers: reported
FAIRNESS_TARGETS = {"DistLock": 0.8, "DistRLock": 0.8, "DistLock fair": 0.95, "DistRLock fair": 0.95}
#: what a fair lock's contended throughput is reported against: the default lock of its kind
FAIR_VS_DEFAULT = {"DistLock fair": "DistLock", "DistRLock fair": "DistRLock"}


def contended(ctx: Ctx) -> List[C.Row]:
    """Two runs, ``contended_procs`` (4) and ``contended_procs_many`` (16) processes: each
    gives ops/s (and the ratio to redis-py in the same rounds), fairness, the fair locks' ops/s
    against the default lock's, and lost updates; each figure of the first run first."""
    k = ctx.knobs
    chosen = impls("distlock", "distrlock", "distlock_fair", "distrlock_fair", "redis_py",
                   "python_redis_lock", "pottery")
    runs = [contended_run(ctx, chosen, procs) for procs in (k.contended_procs, k.contended_procs_many)]
    rows: List[C.Row] = []
    for figure in range(len(runs[0])):  # ops/s of both runs, then fairness of both, ...
        for run in runs:
            rows += run[figure]
    return rows


def contended_run(ctx: Ctx, chosen: List[Impl], procs: int) -> List[List[C.Row]]:
    """One interleaved ``contended_throughput`` run with ``procs`` processes per candidate: its
    ops/s rows, fairness rows, fair-vs-default rows and lost-update rows (in that order)."""
    k = ctx.knobs
    C.eprint(f"contended: {len(chosen)} candidates x {k.contended_rounds} rounds x "
             f"{procs} processes x {k.contended_s:g} s, round-robin")
    results = C.contended_throughput(
        ctx.client, ctx.url,
        {impl.label: (impl.factory, f"bench:contended:{procs}:{impl.key}",
                      f"bench:counter:{procs}:{impl.key}")
         for impl in chosen},
        procs=procs, seconds=k.contended_s, rounds=k.contended_rounds)
    labels = [impl.label for impl in chosen]
    # the ">= redis-py" target is the 4-process figure's; the 16-process one is reported
    ours = ("DistLock", "DistRLock") if procs == k.contended_procs else ()
    ops, lost = C.contended_rows(results, labels, ours, f"contended ops/s, {procs} processes", REDIS_PY,
                                 lost_figure=f"contended lost updates, {procs} processes")
    fair = C.fairness_rows(results, labels, f"fairness, {procs} processes", FAIRNESS_TARGETS)
    versus = C.versus_rows(results, FAIR_VS_DEFAULT,
                           f"fair-lock contended ops/s vs the default lock, {procs} processes")
    return [ops, fair, versus, lost]


def herd(ctx: Ctx) -> List[C.Row]:
    """Redis commands per hand-off while 1, 10 or 50 processes wait (``C.handoff_commands``):
    a lock that wakes every waiter on each release costs more per hand-off the more wait; one
    that wakes one process keeps the count flat."""
    k = ctx.knobs
    rows: List[C.Row] = []
    few, many = min(k.herd_waiting), max(k.herd_waiting)
    for impl in impls("distlock", "distrlock", "distlock_fair", "distrlock_fair"):
        figures: Dict[int, float] = {}
        for waiting in sorted(k.herd_waiting):
            C.eprint(f"herd: {impl.label}, {waiting} waiting processes")
            name = f"bench:herd:{impl.key}:{waiting}"
            # the lock's waiter registry: one entry per waiting process (default locks), one
            # per waiter (fair locks); with one thread a process, both are ``waiting`` when all wait
            keys = Keys(settings().prefix, name)
            registry = keys.sub("fq") if impl.key.endswith("_fair") else keys.queue
            res = C.handoff_commands(ctx.client, ctx.url, impl.factory, name, waiting=waiting,
                                     registry=registry, settle=k.herd_settle_s)
            per = res["per_handoff"]
            figures[waiting] = per
            top = ", ".join(f"{cmd} {n}" for cmd, n in list(res["commands"].items())[:4]) or "none"
            note = (f"{res['scripts_per_handoff']:.2f} EVALSHA/hand-off, "
                    f"{res['commands'].get('publish', 0) / waiting:.2f} PUBLISH/hand-off; {top}; "
                    f"{res['seconds'] * 1000:.0f} ms for all")
            if res["queued"] is not None and res["queued"] < waiting:
                note += f"; only {res['queued']} of {waiting} in the registry at the release"
            if res["acquired"] != waiting:
                note += f"; {waiting - res['acquired']} waiters did not get the lock (INVALID)"
            if waiting == many and few in figures and many != few:
                flat = per <= 1.25 * figures[few]
                note = (f"flat (<= 1.25 x the {few}-process figure): {'met' if flat else 'MISSED'}"
                        f"; " + note)
            rows.append(C.Row(f"commands per hand-off, {waiting} waiting processes", impl.label,
                              per, "cmd", note=note, data=res))
    order = [f"commands per hand-off, {n} waiting processes" for n in sorted(k.herd_waiting)]
    rows.sort(key=lambda r: order.index(r.figure))
    return rows


def idle(ctx: Ctx) -> List[C.Row]:
    k = ctx.knobs
    rows: List[C.Row] = []
    for impl in impls("distlock", "redis_py", "python_redis_lock", "pottery"):
        C.eprint(f"idle: {impl.label} ({k.idle_threads} threads, settle {k.idle_settle_s:g} s, "
                 f"window {k.idle_window_s:g} s)")
        rate, report = C.hold_and_wait(
            ctx.client, ctx.url, impl.factory, [f"bench:idle:{impl.key}"],
            lambda: C.command_rate(ctx.client, k.idle_window_s),
            threads=k.idle_threads, settle=k.idle_settle_s, client_name=f"bench-idle-{impl.key}",
            wait_timeout=k.idle_settle_s + k.idle_window_s + 30.0)
        top = ", ".join(f"{cmd} {n}" for cmd, n in list(rate["by_command"].items())[:3]) or "none"
        note = f"{rate['total']} commands in {rate['seconds']:.1f} s ({top})"
        note += _waiter_note(report, k.idle_threads)
        if impl.key == "distlock":
            note = "target <= 5/s: " + ("met" if rate["per_s"] <= 5 else "MISSED") + "; " + note
        rows.append(C.Row("idle load", impl.label, rate["per_s"], "cmd/s", note=note,
                          data={"rate": rate, "waiters": report}))
    _fill_vs_redis_py(rows, lambda r: True, {r.impl: r.value for r in rows})
    return rows


def connections(ctx: Ctx) -> List[C.Row]:
    k = ctx.knobs
    rows: List[C.Row] = []
    many = max(k.conn_threads)
    runs = [(threads, 0.0) for threads in k.conn_threads]
    if k.conn_stagger_s:
        runs.append((many, k.conn_stagger_s))
    for impl in impls("distlock", "redis_py", "python_redis_lock"):
        counts: Dict[int, int] = {}
        for threads, stagger in runs:
            how = f", starts {stagger * 1000:g} ms apart" if stagger else ""
            C.eprint(f"connections: {impl.label} ({threads} threads on {k.conn_locks} locks{how})")
            tag = f"bench-conn-{impl.key}-{threads}-{int(stagger * 1000)}"
            names = [f"bench:conn:{impl.key}:{threads}:{int(stagger * 1000)}:{i}"
                     for i in range(k.conn_locks)]
            samples: List[int] = []

            def measure(tag: str = tag, samples: List[int] = samples) -> int:
                for _ in range(3):  # a few looks, a moment apart; the largest counts
                    samples.append(C.connections_named(ctx.client, tag))
                    time.sleep(0.2)
                return max(samples)

            count, report = C.hold_and_wait(
                ctx.client, ctx.url, impl.factory, names, measure, threads=threads,
                settle=k.conn_settle_s, client_name=tag, wait_timeout=k.conn_settle_s + 40.0,
                drain_timeout=60.0, stagger=stagger)
            note = f"samples {samples}" + _waiter_note(report, threads)
            if stagger:
                note = "diagnostic, not the target; " + note
            else:
                counts[threads] = count
                if impl.key == "distlock" and threads == many and len(counts) > 1:
                    few = counts[min(k.conn_threads)]
                    note = (f"target <= {few} (the {min(k.conn_threads)}-thread figure): "
                            + ("met" if count <= few else "MISSED") + "; " + note)
            rows.append(C.Row(f"connections, {threads} threads/{k.conn_locks} locks{how}", impl.label,
                              float(count), "conns", note=note, data={"samples": samples, "waiters": report}))
    order = [f"connections, {t} threads/{k.conn_locks} locks" for t in k.conn_threads]
    for fig in {r.figure for r in rows}:
        _fill_vs_redis_py(rows, lambda r, fig=fig: r.figure == fig,
                          {r.impl: r.value for r in rows if r.figure == fig})
    rows.sort(key=lambda r: order.index(r.figure) if r.figure in order else len(order))
    return rows


def _waiter_note(report: Dict[str, Any], threads: int) -> str:
    parts = []
    if report.get("drained") is False or report.get("unfinished"):
        parts.append("waiters did not all finish")
    if report.get("errors"):
        parts.append(f"{len(report['errors'])} waiters failed: {report['errors'][0]}")
    if report.get("timed_out"):
        parts.append(f"{report['timed_out']} waiters timed out")
    if report.get("early"):
        parts.append(f"{report['early']} waiters got the lock before it was released (INVALID)")
    if report.get("holder_errors"):
        parts.append(f"holder release failed: {report['holder_errors'][0]}")
    return "; " + "; ".join(parts) if parts else ""


def _fill_vs_redis_py(rows: List[C.Row], which: Callable[[C.Row], bool], values: Dict[str, Any]) -> None:
    ref = values.get(REDIS_PY)
    for r in rows:
        if which(r) and ref and r.value is not None and not math.isnan(r.value):
            r.vs_redis_py = r.value / ref


# --- main ---------------------------------------------------------------------------------------

def _run(client: Any, url: str, knobs: Knobs, figures: List[str]) -> List[C.Row]:
    ctx = Ctx(client, url, knobs)
    rows: List[C.Row] = []
    if "floor" in figures or "uncontended" in figures:
        rows += uncontended(ctx, with_locks="uncontended" in figures)
    if "handoff" in figures:
        rows += handoff(ctx)
    if "contended" in figures:
        rows += contended(ctx)
    if "herd" in figures:
        rows += herd(ctx)
    if "idle" in figures:
        rows += idle(ctx)
    if "connections" in figures:
        rows += connections(ctx)
    return rows


def main(argv: Optional[List[str]] = None) -> int:
    return C.bench_main(
        argv, doc=__doc__, title="distlock benchmarks", figures=FIGURES, full=FULL, quick=QUICK,
        options=(C.Option("--rounds", "rounds", int, 1, "uncontended: rounds (default 40; quick 3)"),
                 C.Option("--ops", "ops", int, 1,
                          "uncontended: ops per candidate per round (200; quick 20)"),
                 C.Option("--contended-rounds", "contended_rounds", int, 1,
                          "contended: interleaved rounds per run (5; quick 2)")),
        run=_run,
        versions=(("redis-py", "redis"), ("python-redis-lock", "python-redis-lock"),
                  ("pottery", "pottery")))


if __name__ == "__main__":
    sys.exit(main())
