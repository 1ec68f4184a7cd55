#!/usr/bin/env python
"""DistCondition: how fast notify() wakes a waiter in another process, and what waiting costs.

Every figure in one run, against one freshly started private redis-server on 127.0.0.1:

- floor: two EVALSHA of ``return 1`` through one redis-py client (µs per pair), and the pub/sub
  hop: PUBLISH here -> ``get_message`` returns in another process (ms). A wake-up across
  processes cannot beat the hop;
- wake: from the start of ``notify()`` here to the return of ``wait()`` in another process, for
  DistCondition on its default DistRLock and on a DistLock (median, p90, p99). The notifier
  releases the lock right after ``notify()``, as ``with cond: cond.notify()`` does, and the
  waiter must take the lock back before ``wait()`` returns, so the figure includes that
  hand-off. The three candidates run interleaved, one sample each in turn, rotated every round;
- idle: Redis commands/s (INFO commandstats, where the commands a script runs count too) while
  10 threads of one process wait on one DistCondition, with the default settings.

Usage::

    python benchmarks/bench_condition.py [--quick] [--json out.json] [--samples N] [figure ...]

Figures: floor, wake, idle (default: all). The table goes to stdout, progress to stderr.
``--quick`` is a short smoke run whose numbers mean little.
"""

from __future__ import annotations

import os
import random
import sys
import threading
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any, Dict, List, Optional, Tuple

if __package__ in (None, ""):  # run as a script: make ``benchmarks`` and ``distlock`` importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import distlock  # noqa: E402
from benchmarks import _common as C  # noqa: E402
from distlock import DistCondition, DistLock

FIGURES = ("floor", "wake", "idle")
WAIT_LIMIT = 30.0  # every wait in a worker is bounded


@dataclass(frozen=True)
class Knobs:
    rounds: int = 20
    ops: int = 200
    samples: int = 200
    settle: Tuple[float, float] = (0.01, 0.03)
    wake_max_s: float = 120.0
    idle_threads: int = 10
    idle_settle_s: float = 3.0
    idle_window_s: float = 30.0


FULL = Knobs()
QUICK = Knobs(rounds=3, ops=20, samples=10, wake_max_s=10.0, idle_settle_s=0.5, idle_window_s=3.0)


# --- the candidates -----------------------------------------------------------------------------

def make_condition(kind: str, client: Any, name: str) -> DistCondition:
    if kind == "DistCondition(DistRLock)":
        return DistCondition(name, client=client)
    if kind == "DistCondition(DistLock)":
        return DistCondition(name, DistLock(name, client=client))
    raise ValueError(kind)


WAKE_KINDS = ("DistCondition(DistRLock)", "DistCondition(DistLock)")
HOP = "pub/sub hop (floor)"


# --- workers (module level: spawned processes import them) --------------------------------------

def _next(conn: Connection) -> Any:
    if not conn.poll(C.WORKER_IDLE_LIMIT):
        return None
    return conn.recv()


def _cond_waiter(url: str, kind: str, name: str, conn: Connection) -> None:
    """Per "go": take the lock, say "waiting", wait(); send (notified, monotonic at return)."""
    client = C.connect(url)
    cond = make_condition(kind, client, name)
    try:
        conn.send("ready")
        while _next(conn) == "go":
            with cond:
                conn.send("waiting")
                ok = cond.wait(WAIT_LIMIT)
                t1 = time.monotonic()
            conn.send((ok, t1))
    except (EOFError, BrokenPipeError, ConnectionResetError):
        return


def _subscriber(url: str, channel: str, conn: Connection) -> None:
    """Per "go": say "listening", then send the monotonic time the next message arrived."""
    client = C.connect(url)
    pubsub = client.pubsub(ignore_subscribe_messages=False)
    pubsub.subscribe(channel)
    try:
        confirmed = pubsub.get_message(timeout=10.0)
        if confirmed is None or confirmed.get("type") != "subscribe":
            return
        conn.send("ready")
        while _next(conn) == "go":
            conn.send("listening")
            message = None
            deadline = time.monotonic() + WAIT_LIMIT
            while message is None and time.monotonic() < deadline:
                message = pubsub.get_message(timeout=1.0)
            conn.send(time.monotonic() if message is not None else None)
    except (EOFError, BrokenPipeError, ConnectionResetError):
        return
    finally:
        pubsub.close()


def _idle_waiters(url: str, name: str, threads: int, client_name: str, conn: Connection) -> None:
    """``threads`` threads wait on one DistCondition (bounded); report how they ended."""
    client = C.connect(url, client_name=client_name)
    cond = DistCondition(name, client=client)
    results: List[bool] = []

    def wait() -> None:
        with cond:
            results.append(cond.wait(WAIT_LIMIT + 120.0))

    try:
        conn.send("ready")
        if _next(conn) != "go":
            return
        pool = [threading.Thread(target=wait, daemon=True) for _ in range(threads)]
        for thread in pool:
            thread.start()
        deadline = time.monotonic() + WAIT_LIMIT + 150.0
        for thread in pool:
            thread.join(max(0.0, deadline - time.monotonic()))
        conn.send({"notified": sum(results), "timed_out": len(results) - sum(results),
                   "unfinished": threads - len(results)})
    except (EOFError, BrokenPipeError, ConnectionResetError):
        return


# --- figures --------------------------------------------------------------------------------------

def floor(client: Any, k: Knobs) -> List[C.Row]:
    script = client.register_script("return 1")

    def pair() -> None:
        script()
        script()

    C.eprint(f"floor: {k.rounds} rounds x {k.ops} pairs")
    per_round = C.interleaved({"floor": pair}, rounds=k.rounds, per_round=k.ops)["floor"]
    return [C.Row("floor", "2 x EVALSHA 'return 1'", C.median(per_round), "µs/pair", 1.0,
                  note=f"median of {len(per_round)} rounds x {k.ops}",
                  data={"per_round_us": per_round})]


def wake(client: Any, url: str, k: Knobs, with_hop: bool) -> List[C.Row]:
    """Interleaved samples of every candidate: one each per round, in rotated order."""
    rng = random.Random(7)
    conds = {kind: make_condition(kind, client, f"bench:cond:{i}") for i, kind in enumerate(WAKE_KINDS)}
    latencies: Dict[str, List[float]] = {kind: [] for kind in WAKE_KINDS}
    notifier: Dict[str, List[float]] = {kind: [] for kind in WAKE_KINDS}
    failures: Dict[str, int] = {kind: 0 for kind in WAKE_KINDS}
    if with_hop:
        latencies[HOP] = []
        failures[HOP] = 0
    channel = "bench:cond:hop"
    started = time.monotonic()
    with C.Workers() as workers:
        conns: Dict[str, Connection] = {}
        for i, kind in enumerate(WAKE_KINDS):
            conns[kind] = workers.start(_cond_waiter, url, kind, f"bench:cond:{i}")
        if with_hop:
            conns[HOP] = workers.start(_subscriber, url, channel)
        for name, conn in conns.items():
            if C.expect(conn, 60.0, "start") != "ready":
                raise RuntimeError(f"{name} worker failed to start")
        names = list(conns)
        C.eprint(f"wake: up to {k.samples} samples x {len(names)} candidates, interleaved "
                 f"(at most {k.wake_max_s:g} s)")
        warmup = 3
        for rnd in range(k.samples + warmup):
            if time.monotonic() - started > k.wake_max_s and rnd > warmup + 2:
                break
            shift = rnd % len(names)
            for name in names[shift:] + names[:shift]:
                settle = rng.uniform(*k.settle)
                if name == HOP:
                    hop = _sample_hop(client, conns[name], channel, settle)
                    if hop is None:
                        failures[name] += 1
                    elif rnd >= warmup:
                        latencies[name].append(hop)
                    continue
                ok, lat, own = _sample_wake(conds[name], conns[name], settle)
                if not ok:
                    failures[name] += 1
                elif rnd >= warmup:
                    latencies[name].append(lat)
                    notifier[name].append(own)
        for conn in conns.values():
            conn.send("stop")
    rows: List[C.Row] = []
    hop_median = C.median([x * 1000 for x in latencies.get(HOP, [])]) if with_hop else None
    for name, values in latencies.items():
        ms = [x * 1000 for x in values]
        med = C.median(ms)
        note = f"n={len(ms)}, p90 {C.percentile(ms, 90):.2f} ms"
        if failures[name]:
            note += f", {failures[name]} failed samples"
        if name != HOP:
            own = C.median([x * 1000 for x in notifier[name]])
            note = ("target <= 1 ms: " + ("met" if med <= 1.0 else "MISSED") + f"; {note}; "
                    f"notifier's notify()+release() median {own:.2f} ms")
        ratio = med / hop_median if hop_median else None
        rows.append(C.Row("wake median" if name != HOP else "pub/sub hop median", name, med, "ms",
                          ratio, note=note, data={"latencies_ms": ms}))
        rows.append(C.Row("wake p99" if name != HOP else "pub/sub hop p99", name,
                          C.percentile(ms, 99), "ms", note=f"n={len(ms)}"))
    rows.sort(key=lambda r: ("p99" in r.figure, "hop" not in r.figure))
    return rows


def _sample_wake(cond: DistCondition, conn: Connection, settle: float) -> Tuple[bool, float, float]:
    conn.send("go")
    if C.expect(conn, 30.0, "start waiting") != "waiting":
        raise RuntimeError("waiter sent something unexpected")
    with cond:  # taken once the waiter has released it inside wait(): it is queued
        time.sleep(settle)  # the waiter is asleep by now
        t0 = time.monotonic()
        cond.notify()
    released = time.monotonic()
    ok, t1 = C.expect(conn, WAIT_LIMIT + 30.0, "return from wait()")
    return bool(ok), t1 - t0, released - t0


def _sample_hop(client: Any, conn: Connection, channel: str, settle: float) -> Optional[float]:
    conn.send("go")
    if C.expect(conn, 30.0, "listen") != "listening":
        raise RuntimeError("subscriber sent something unexpected")
    time.sleep(settle)
    t0 = time.monotonic()
    client.publish(channel, "x")
    t1 = C.expect(conn, WAIT_LIMIT + 30.0, "receive")
    return None if t1 is None else t1 - t0


def idle(client: Any, url: str, k: Knobs) -> List[C.Row]:
    name = "bench:cond:idle"
    probe = DistCondition(name, client=client)
    client_name = "bench-cond-idle"
    C.eprint(f"idle: {k.idle_threads} threads waiting, settle {k.idle_settle_s:g} s, "
             f"window {k.idle_window_s:g} s")
    report: Dict[str, Any] = {}
    with C.Workers() as workers:
        conn = workers.start(_idle_waiters, url, name, k.idle_threads, client_name)
        if C.expect(conn, 60.0, "start") != "ready":
            raise RuntimeError("idle worker failed to start")
        conn.send("go")
        deadline = time.monotonic() + 60.0
        while int(client.zcard(probe._keys.queue)) < k.idle_threads:
            if time.monotonic() > deadline:
                raise RuntimeError("the waiting threads did not all queue within 60 s")
            time.sleep(0.1)
        time.sleep(k.idle_settle_s)
        rate = C.command_rate(client, k.idle_window_s)
        with probe:
            probe.notify_all()
        report = C.expect(conn, 60.0, "let every waiter return")
    top = ", ".join(f"{cmd} {n}" for cmd, n in list(rate["by_command"].items())[:5]) or "none"
    note = ("target <= 5/s: " + ("met" if rate["per_s"] <= 5 else "MISSED")
            + f"; {rate['total']} commands in {rate['seconds']:.1f} s ({top}); "
            f"then notify_all woke {report.get('notified')}/{k.idle_threads}")
    s = distlock._core.settings.settings()
    note += f"; wait_cap {s.wait_cap:g} s, renew every {s.renew_interval:g} s"
    return [C.Row("idle load, 10 waiting threads", "DistCondition", rate["per_s"], "cmd/s",
                  note=note, data={"rate": rate, "waiters": report})]


# --- main -----------------------------------------------------------------------------------------

def _run(client: Any, url: str, knobs: Knobs, figures: List[str]) -> List[C.Row]:
    rows: List[C.Row] = []
    if "floor" in figures:
        rows += floor(client, knobs)
    if "wake" in figures:
        rows += wake(client, url, knobs, with_hop="floor" in figures)
    if "idle" in figures:
        rows += idle(client, url, knobs)
    return rows


def main(argv: Optional[List[str]] = None) -> int:
    return C.bench_main(
        argv, doc=__doc__, title="distlock DistCondition benchmarks", figures=FIGURES, full=FULL,
        quick=QUICK,
        options=(C.Option("--samples", "samples", int, 1,
                          "wake: samples per candidate (default 200; quick 10)"),
                 C.Option("--idle-window", "idle_window_s", float, 0.5,
                          "idle: seconds measured (default 30; quick 3)")),
        run=_run)


if __name__ == "__main__":
    sys.exit(main())
