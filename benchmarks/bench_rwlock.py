#!/usr/bin/env python
"""DistReadWriteLock: the figures of its benchmark table, in one run, on one private server.

- floor: two EVALSHA of ``return 1`` through the same redis-py client (µs per pair);
- uncontended: read acquire+release and write acquire+release (DistRLock alongside), µs/op
  and as a ratio to the floor measured in the same interleaved rounds (target <= 1.15x);
- handoff: from the start of the last reader's ``release()`` here to the return of a waiting
  writer's ``acquire()`` in another process (median and p99; target median <= 0.5 ms);
- throughput: 4 processes loop ``acquire; GET; release`` with no writer, on the read lock and
  on a plain DistRLock (and a lock-free GET loop as the ceiling), in alternating rounds: ops/s.
  Readers do not queue, so the read lock should be well above DistRLock.

Usage::

    python benchmarks/bench_rwlock.py [--quick] [--json out.json] [figure ...]

Figures: uncontended, handoff, throughput (default: all). The table goes to stdout, progress to
stderr. ``--quick`` is a short smoke run whose numbers mean little.
"""

from __future__ import annotations

import os
import random
import sys
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any, Callable, Dict, List, Optional

if __package__ in (None, ""):  # run as a script: make ``benchmarks`` and ``distlock`` importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import _common as C  # noqa: E402
from benchmarks._internals import RWKeys, settings
from distlock import DistReadWriteLock, DistRLock

FIGURES = ("uncontended", "handoff", "throughput")


# --- the locks under test: module-level factories (spawned workers unpickle them) ----------------

def make_read(client: Any, name: str) -> C.LockHandle:
    lock = DistReadWriteLock(name, client=client).read_lock()
    return C.LockHandle(lambda t: lock.acquire(timeout=t), lock.release, lock.acquire, lock)


def make_write(client: Any, name: str) -> C.LockHandle:
    lock = DistReadWriteLock(name, client=client).write_lock()
    return C.LockHandle(lambda t: lock.acquire(timeout=t), lock.release, lock.acquire, lock)


def make_rlock(client: Any, name: str) -> C.LockHandle:
    lock = DistRLock(name, client=client)
    return C.LockHandle(lambda t: lock.acquire(timeout=t), lock.release, lock.acquire, lock)


def make_none(client: Any, name: str) -> C.LockHandle:
    """No lock at all: the throughput ceiling of the GET loop itself."""
    return C.LockHandle(lambda t: True, lambda: None, lambda: True, None)


@dataclass(frozen=True)
class Knobs:
    rounds: int = 40
    ops: int = 200
    uncontended_max_s: float = 180.0
    handoff_samples: int = 100
    handoff_max_s: float = 30.0
    procs: int = 4
    throughput_rounds: int = 3
    throughput_s: float = 3.0


FULL = Knobs()
QUICK = Knobs(rounds=3, ops=20, uncontended_max_s=10.0, handoff_samples=8, handoff_max_s=3.0,
              throughput_rounds=1, throughput_s=1.0)


@dataclass
class Ctx:
    client: Any
    url: str
    knobs: Knobs


def _verdict(ok: bool) -> str:
    return "met" if ok else "MISSED"


# --- uncontended ----------------------------------------------------------------------------------

def uncontended(ctx: Ctx) -> List[C.Row]:
    client, k = ctx.client, ctx.knobs
    script = client.register_script("return 1")

    def floor() -> None:
        script()
        script()

    ops: Dict[str, Callable[[], object]] = {"floor": floor}
    for label, factory in (("read lock", make_read), ("write lock", make_write),
                           ("DistRLock", make_rlock)):
        handle = factory(client, f"bench:rw:uncontended:{label}")
        ops[label] = C.cycle(handle.acquire_default, handle.release)
    C.eprint(f"uncontended: {k.rounds} rounds x {k.ops} ops x {len(ops)} candidates, round-robin")
    with C.pinned(ctx.client) as pin:
        per_round = C.interleaved(ops, rounds=k.rounds, per_round=k.ops, max_seconds=k.uncontended_max_s)
    vs_floor = C.per_round_ratios(per_round, "floor")
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
        if label != "DistRLock":
            note += "; target <= 1.15x floor: " + _verdict(ratio <= 1.15)
        rows.append(C.Row("uncontended acquire+release", label, C.median(values), "µs/op", ratio,
                          note=note, data={"per_round_us": values,
                                           "per_round_vs_floor": vs_floor[label]}))
    return rows


# --- handoff: last reader out -> waiting writer in ------------------------------------------------

def handoff(ctx: Ctx) -> List[C.Row]:
    """Like ``_common.handoff_latency``, but the holder here is a reader and the process that
    waits is a writer. Each sample: take the read lock; the writer is told to acquire; once it
    is seen queued (it registers in the same script that refuses it) this process sleeps a
    random 30-130 ms, stamps ``time.monotonic()`` (one clock for the whole system on Linux) and
    releases; the writer stamps the clock when its ``acquire()`` returns and releases."""
    k = ctx.knobs
    name = "bench:rw:handoff"
    queue = RWKeys.of(settings().prefix, name).queue
    reader = make_read(ctx.client, name)
    rng = random.Random(1)
    latencies: List[float] = []
    failures = 0
    warmup = 3
    C.eprint(f"handoff: read lock -> write lock (up to {k.handoff_samples} samples / "
             f"{k.handoff_max_s:g} s)")
    with C.Workers() as workers:
        conn = workers.start(_handoff_writer, ctx.url, name)
        if C.expect(conn, 60.0, "start") != "ready":
            raise RuntimeError("handoff writer failed to start")
        started = time.monotonic()
        attempt = 0
        while len(latencies) < k.handoff_samples and attempt < k.handoff_samples + warmup + 20:
            if time.monotonic() - started > k.handoff_max_s:
                break
            if not reader.acquire(10.0):
                raise RuntimeError("the reader could not take the read lock")
            conn.send("go")
            if C.expect(conn, 30.0, "start waiting") != "waiting":
                raise RuntimeError("handoff writer sent something unexpected")
            queued_by = time.monotonic() + 10.0
            while not ctx.client.exists(queue) and time.monotonic() < queued_by:
                time.sleep(0.001)
            time.sleep(rng.uniform(0.03, 0.13))
            t0 = time.monotonic()
            reader.release()
            ok, t1 = C.expect(conn, 40.0, "acquire")
            attempt += 1
            if not ok:
                failures += 1
            elif attempt > warmup:
                latencies.append(t1 - t0)
        conn.send("stop")
    lat_ms = [x * 1000.0 for x in latencies]
    med, p99 = C.median(lat_ms), C.percentile(lat_ms, 99)
    capped = len(lat_ms) < k.handoff_samples
    note = f"n={len(lat_ms)}{' (capped)' if capped else ''}"
    if failures:
        note += f", {failures} acquire timeouts"
    rows = [
        C.Row("handoff median, last reader -> writer", "DistReadWriteLock", med, "ms",
              note=note + "; target <= 0.5 ms: " + _verdict(med <= 0.5), data={"latencies_ms": lat_ms}),
        C.Row("handoff p99, last reader -> writer", "DistReadWriteLock", p99, "ms", note=note),
    ]
    C.add_hint_floor(rows, ctx.client, ctx.url, {"handoff median, last reader -> writer": 50,
                                                 "handoff p99, last reader -> writer": 99},
                     samples=k.handoff_samples, max_seconds=k.handoff_max_s)
    rows.sort(key=lambda r: "p99" in r.figure)
    return rows


def _handoff_writer(url: str, name: str, conn: Connection) -> None:
    writer = make_write(C.connect(url), name)
    try:
        conn.send("ready")
        while conn.poll(C.WORKER_IDLE_LIMIT):
            if conn.recv() != "go":
                return
            conn.send("waiting")
            ok = writer.acquire(30.0)
            t1 = time.monotonic()
            if ok:
                writer.release()
            conn.send((ok, t1))
    except (EOFError, BrokenPipeError, ConnectionResetError):
        return


# --- read throughput -------------------------------------------------------------------------------

def throughput(ctx: Ctx) -> List[C.Row]:
    """``procs`` processes loop ``acquire; GET; release`` for a fixed time, all starting at one
    instant; rounds alternate between the candidates so that the machine's drift hits each."""
    k = ctx.knobs
    candidates = [("read lock", make_read), ("DistRLock", make_rlock), ("no lock (GET only)", make_none)]
    results: Dict[str, List[float]] = {label: [] for label, _ in candidates}
    ctx.client.set("bench:rw:value", "x" * 64)
    for rnd in range(k.throughput_rounds):
        order = candidates[rnd % len(candidates):] + candidates[:rnd % len(candidates)]
        for label, factory in order:
            C.eprint(f"throughput: round {rnd + 1}/{k.throughput_rounds}, {label} "
                     f"({k.procs} processes x {k.throughput_s:g} s)")
            results[label].append(_read_loop(ctx, factory, f"bench:rw:tp:{label}")["ops_per_s"])
    ref = C.median(results["DistRLock"])
    rows = []
    for label, values in results.items():
        value = C.median(values)
        note = f"median of {len(values)} rounds: {', '.join(f'{v:,.0f}' for v in values)}"
        if label == "read lock":
            note = f"{value / ref:.2f}x DistRLock (should be > 1): {_verdict(value > ref)}; " + note
        rows.append(C.Row(f"read throughput, {k.procs} processes", label, value, "ops/s",
                          note=note, data={"per_round": values}))
    return rows


def _read_loop(ctx: Ctx, factory: C.LockFactory, name: str) -> Dict[str, Any]:
    k = ctx.knobs
    with C.Workers() as workers:
        conns = [workers.start(_reader_worker, ctx.url, factory, name) for _ in range(k.procs)]
        for conn in conns:
            if C.expect(conn, 60.0, "start") != "ready":
                raise RuntimeError("reader worker failed to start")
        start_at = time.monotonic() + 0.3
        for conn in conns:
            conn.send((start_at, start_at + k.throughput_s))
        reports = [C.expect(conn, k.throughput_s + 60.0, "finish") for conn in conns]
    done = sum(r["ops"] for r in reports)
    elapsed = max(r["finished"] for r in reports) - start_at
    return {"ops": done, "ops_per_s": done / elapsed, "per_worker": [r["ops"] for r in reports],
            "timeouts": sum(r["timeouts"] for r in reports)}


def _reader_worker(url: str, factory: C.LockFactory, name: str, conn: Connection) -> None:
    client = C.connect(url)
    lock = factory(client, name)
    try:
        conn.send("ready")
        if not conn.poll(C.WORKER_IDLE_LIMIT):
            return
        start_at, end_at = conn.recv()
        time.sleep(max(0.0, start_at - time.monotonic()))
        ops = timeouts = 0
        while time.monotonic() < end_at:
            if not lock.acquire(10.0):
                timeouts += 1
                continue
            try:
                client.get("bench:rw:value")
                ops += 1
            finally:
                lock.release()
        conn.send({"ops": ops, "timeouts": timeouts, "finished": time.monotonic()})
    except (EOFError, BrokenPipeError, ConnectionResetError):
        return


# --- main -----------------------------------------------------------------------------------------

def _run(client: Any, url: str, knobs: Knobs, figures: List[str]) -> List[C.Row]:
    ctx = Ctx(client, url, knobs)
    rows: List[C.Row] = []
    if "uncontended" in figures:
        rows += uncontended(ctx)
    if "handoff" in figures:
        rows += handoff(ctx)
    if "throughput" in figures:
        rows += throughput(ctx)
    return rows


def main(argv: Optional[List[str]] = None) -> int:
    return C.bench_main(
        argv, doc=__doc__, title="DistReadWriteLock benchmarks", figures=FIGURES, full=FULL,
        quick=QUICK,
        options=(C.Option("--rounds", "rounds", int, 1, "uncontended: rounds (default 40; quick 3)"),
                 C.Option("--ops", "ops", int, 1,
                          "uncontended: ops per candidate per round (200; quick 20)")),
        run=_run, versions=(("redis-py", "redis"),))


if __name__ == "__main__":
    sys.exit(main())
