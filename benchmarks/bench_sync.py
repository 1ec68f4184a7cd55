#!/usr/bin/env python
"""DistSemaphore, DistEvent and DistBarrier: what they cost, across processes.

Every figure in one run, against one freshly started private redis-server on 127.0.0.1:

- floor: two EVALSHA of ``return 1`` through one redis-py client (µs per pair);
- semaphore: uncontended ``acquire()`` + ``release()`` of a DistSemaphore and of a
  DistBoundedSemaphore (value 1), µs/op and the ratio to the floor measured in the same rounds
  (interleaved round-robin, the median of the per-round ratios; target <= 1.15x), with DistLock
  in the same rounds for reference;
- event: from the start of ``set()`` here to the return of ``wait()`` in 10 other processes,
  each waiting in its own process (median and p90 over every waiter of every sample, and the
  median of the slowest waiter per sample; target: median <= 1 ms), next to its floor, the bare
  pub/sub hop: PUBLISH here -> ``get_message()`` returns in 10 subscriber processes, sampled
  alternately with it;
- barrier: 4 processes call ``wait()`` back to back for many generations; per generation, the
  time from the last party's call to ``wait()`` to the return of ``wait()`` in the slowest party
  (median, p90), and generations per second.

Usage::

    python benchmarks/bench_sync.py [--quick] [--json out.json] [figure ...]

Figures: floor, semaphore, event, barrier (default: all; semaphore includes the floor). The
table goes to stdout, progress to stderr. ``--quick`` is a short smoke run whose numbers mean
little.
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
from distlock import DistBarrier, DistBoundedSemaphore, DistEvent, DistLock, DistSemaphore

FIGURES = ("floor", "semaphore", "event", "barrier")
WAIT_LIMIT = 30.0  # every wait in a worker is bounded


@dataclass(frozen=True)
class Knobs:
    rounds: int = 40
    ops: int = 200
    uncontended_max_s: float = 90.0
    event_waiters: int = 10
    event_samples: int = 100
    event_max_s: float = 120.0
    settle: tuple = (0.01, 0.03)
    barrier_parties: int = 4
    barrier_generations: int = 300


FULL = Knobs()
QUICK = Knobs(rounds=3, ops=20, uncontended_max_s=10.0, event_samples=5, event_max_s=20.0,
              barrier_generations=20)


# --- workers (module level: spawned processes import them) ---------------------------------------

def _next(conn: Connection) -> Any:
    if not conn.poll(C.WORKER_IDLE_LIMIT):
        return None
    return conn.recv()


def _event_waiter(url: str, name: str, conn: Connection) -> None:
    """Per "go": say "waiting", wait(); send (ok, monotonic time wait() returned)."""
    event = DistEvent(name, client=C.connect(url))
    try:
        conn.send("ready")
        while _next(conn) == "go":
            conn.send("waiting")
            ok = event.wait(WAIT_LIMIT)
            t1 = time.monotonic()
            conn.send((ok, t1))
    except (EOFError, BrokenPipeError, ConnectionResetError):
        return


def _subscriber(url: str, channel: str, conn: Connection) -> None:
    """The floor of a wake-up: per "go", say "listening", then send the monotonic time the next
    message on ``channel`` arrived (plain redis-py pub/sub, no distlock)."""
    pubsub = C.connect(url).pubsub()
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
            conn.send((message is not None, time.monotonic()))
    except (EOFError, BrokenPipeError, ConnectionResetError):
        return
    finally:
        pubsub.close()


def _barrier_party(url: str, name: str, parties: int, generations: int, conn: Connection) -> None:
    """On "go": wait() ``generations`` times back to back; send the monotonic time of each call
    and each return."""
    barrier = DistBarrier(name, parties, timeout=WAIT_LIMIT, client=C.connect(url))
    try:
        conn.send("ready")
        if _next(conn) != "go":
            return
        calls: List[float] = []
        returns: List[float] = []
        for _ in range(generations):
            calls.append(time.monotonic())
            barrier.wait()
            returns.append(time.monotonic())
        conn.send({"calls": calls, "returns": returns})
    except (EOFError, BrokenPipeError, ConnectionResetError):
        return
    except Exception as exc:  # noqa: BLE001 - reported, the parent fails the figure
        conn.send({"error": repr(exc)})


# --- figures --------------------------------------------------------------------------------------

def semaphore(client: Any, k: Knobs) -> List[C.Row]:
    script = client.register_script("return 1")

    def floor() -> None:
        script()
        script()

    plain = DistSemaphore("bench:sem:plain", 1, client=client)
    bounded = DistBoundedSemaphore("bench:sem:bounded", 1, client=client)
    lock = DistLock("bench:sem:lock", client=client)
    ops: Dict[str, Callable[[], object]] = {
        "floor": floor,
        "DistSemaphore": C.cycle(plain.acquire, plain.release),
        "DistBoundedSemaphore": C.cycle(bounded.acquire, bounded.release),
        "DistLock (reference)": C.cycle(lock.acquire, lock.release),
    }
    C.eprint(f"semaphore: {k.rounds} rounds x {k.ops} ops x {len(ops)} candidates, round-robin")
    with C.pinned(client) as pin:
        per_round = C.interleaved(ops, rounds=k.rounds, per_round=k.ops, max_seconds=k.uncontended_max_s)
    vs_floor = C.per_round_ratios(per_round, "floor")
    n = len(per_round["floor"])
    rows = [C.Row("floor", "2 x EVALSHA 'return 1'", C.median(per_round["floor"]), "µs/pair", 1.0,
                  note=f"median of {n} rounds x {k.ops}; {pin}", data={"per_round_us": per_round["floor"]})]
    for label in ("DistSemaphore", "DistBoundedSemaphore", "DistLock (reference)"):
        ratio = C.median(vs_floor[label])
        note = (f"ratio IQR {C.percentile(vs_floor[label], 25):.2f}-"
                f"{C.percentile(vs_floor[label], 75):.2f}")
        if "Semaphore" in label:
            note += "; target <= 1.15x floor: " + ("met" if ratio <= 1.15 else "MISSED")
        rows.append(C.Row("uncontended acquire+release", label, C.median(per_round[label]), "µs/op",
                          ratio, note=note, data={"per_round_us": per_round[label],
                                                  "per_round_vs_floor": vs_floor[label]}))
    return rows


def floor_only(client: Any, k: Knobs) -> List[C.Row]:
    script = client.register_script("return 1")

    def pair() -> None:
        script()
        script()

    per_round = C.interleaved({"floor": pair}, rounds=k.rounds, per_round=k.ops)["floor"]
    return [C.Row("floor", "2 x EVALSHA 'return 1'", C.median(per_round), "µs/pair", 1.0,
                  note=f"median of {len(per_round)} rounds x {k.ops}",
                  data={"per_round_us": per_round})]


def event(client: Any, url: str, k: Knobs) -> List[C.Row]:
    """Samples of DistEvent and of the bare pub/sub hop to as many subscriber processes,
    alternating, so both see the same machine."""
    rng = random.Random(11)
    name, channel = "bench:event", "bench:event:hop"
    ev = DistEvent(name, client=client)
    ev.clear()
    waiters_key = ev._keys.waiters
    lat: Dict[str, List[float]] = {"event": [], "hop": []}
    slowest: Dict[str, List[float]] = {"event": [], "hop": []}
    setter: List[float] = []
    failures = 0
    started = time.monotonic()
    with C.Workers() as workers:
        conns = [workers.start(_event_waiter, url, name) for _ in range(k.event_waiters)]
        subs = [workers.start(_subscriber, url, channel) for _ in range(k.event_waiters)]
        for conn in conns + subs:
            if C.expect(conn, 60.0, "start") != "ready":
                raise RuntimeError("event worker failed to start")
        C.eprint(f"event: up to {k.event_samples} samples x {k.event_waiters} waiting processes, "
                 f"and as many of the pub/sub hop (at most {k.event_max_s:g} s)")
        warmup = 3
        for sample in range(k.event_samples + warmup):
            if time.monotonic() - started > k.event_max_s and sample > warmup + 2:
                break
            for kind in (("event", "hop") if sample % 2 else ("hop", "event")):
                group = conns if kind == "event" else subs
                for conn in group:
                    conn.send("go")
                for conn in group:
                    if C.expect(conn, 30.0, "start waiting") not in ("waiting", "listening"):
                        raise RuntimeError("event worker sent something unexpected")
                if kind == "event":
                    deadline = time.monotonic() + 30.0
                    while int(client.zcard(waiters_key)) < k.event_waiters:  # all joined
                        if time.monotonic() > deadline:
                            raise RuntimeError("the waiters did not all join within 30 s")
                        time.sleep(0.001)
                time.sleep(rng.uniform(*k.settle))  # every waiter is asleep by now
                t0 = time.monotonic()
                if kind == "event":
                    ev.set()
                    setter.append(time.monotonic() - t0)
                else:
                    client.publish(channel, "x")
                got = [C.expect(conn, WAIT_LIMIT + 30.0, "wake up") for conn in group]
                if kind == "event":
                    ev.clear()
                if not all(ok for ok, _ in got):
                    failures += 1
                    continue
                if sample >= warmup:
                    these = [(t1 - t0) * 1000 for _, t1 in got]
                    lat[kind].extend(these)
                    slowest[kind].append(max(these))
        for conn in conns + subs:
            conn.send("stop")
    n = k.event_waiters
    hop = C.median(lat["hop"])
    med = C.median(lat["event"])
    note = (f"target median <= 1 ms: {'met' if med <= 1.0 else 'MISSED'}; n={len(lat['event'])} "
            f"({len(slowest['event'])} samples x {n}), p90 {C.percentile(lat['event'], 90):.2f} ms; "
            f"set() itself median {C.median([x * 1000 for x in setter]):.2f} ms")
    if failures:
        note += f"; {failures} failed samples"
    return [
        C.Row(f"wake-up of {n} waiting processes", "pub/sub hop (floor)", hop, "ms", 1.0,
              note=(f"PUBLISH -> get_message() returns in {n} subscriber processes; "
                    f"n={len(lat['hop'])}, p90 {C.percentile(lat['hop'], 90):.2f} ms"),
              data={"latencies_ms": lat["hop"]}),
        C.Row(f"wake-up of {n} waiting processes", "DistEvent set() -> wait() returns", med, "ms",
              med / hop if hop else None, note=note, data={"latencies_ms": lat["event"]}),
        C.Row(f"slowest of {n} waiting processes", "pub/sub hop (floor)",
              C.median(slowest["hop"]), "ms", 1.0, note="median over samples of the slowest",
              data={"slowest_ms": slowest["hop"]}),
        C.Row(f"slowest of {n} waiting processes", "DistEvent set() -> wait() returns",
              C.median(slowest["event"]), "ms",
              C.median(slowest["event"]) / C.median(slowest["hop"]) if slowest["hop"] else None,
              note=f"median over {len(slowest['event'])} samples",
              data={"slowest_ms": slowest["event"]}),
    ]


def barrier(client: Any, url: str, k: Knobs) -> List[C.Row]:
    name = "bench:barrier"
    parties, gens = k.barrier_parties, k.barrier_generations
    C.eprint(f"barrier: {parties} processes x {gens} generations")
    with C.Workers() as workers:
        conns = [workers.start(_barrier_party, url, name, parties, gens) for _ in range(parties)]
        for conn in conns:
            if C.expect(conn, 60.0, "start") != "ready":
                raise RuntimeError("barrier party failed to start")
        for conn in conns:
            conn.send("go")
        reports = [C.expect(conn, gens * WAIT_LIMIT + 60.0, "finish") for conn in conns]
    errors = [r["error"] for r in reports if "error" in r]
    if errors:
        raise RuntimeError(f"barrier parties failed: {errors}")
    per_gen: List[float] = []
    for g in range(gens):
        last_call = max(r["calls"][g] for r in reports)
        last_return = max(r["returns"][g] for r in reports)
        per_gen.append((last_return - last_call) * 1000)
    warm = per_gen[min(5, len(per_gen) - 1):]
    start = min(r["calls"][0] for r in reports)
    end = max(r["returns"][-1] for r in reports)
    rate = gens / (end - start) if end > start else float("nan")
    return [
        C.Row(f"barrier round trip, {parties} processes", "DistBarrier", C.median(warm), "ms",
              note=(f"last wait() call -> last wait() return, per generation; n={len(warm)}, "
                    f"p90 {C.percentile(warm, 90):.2f} ms; {rate:.0f} generations/s back to back"),
              data={"per_generation_ms": per_gen, "generations_per_s": rate}),
    ]


# --- main -----------------------------------------------------------------------------------------

def _run(client: Any, url: str, knobs: Knobs, figures: List[str]) -> List[C.Row]:
    rows: List[C.Row] = []
    if "semaphore" in figures:
        rows += semaphore(client, knobs)
    elif "floor" in figures:
        rows += floor_only(client, knobs)
    if "event" in figures:
        rows += event(client, url, knobs)
    if "barrier" in figures:
        rows += barrier(client, url, knobs)
    return rows


def main(argv: Optional[List[str]] = None) -> int:
    return C.bench_main(
        argv, doc=__doc__, title="distlock DistSemaphore/DistEvent/DistBarrier benchmarks",
        figures=FIGURES, full=FULL, quick=QUICK,
        options=(C.Option("--samples", "event_samples", int, 1, "event: samples (default 100; quick 5)"),
                 C.Option("--generations", "barrier_generations", int, 2,
                          "barrier: generations (default 300)")),
        run=_run)


if __name__ == "__main__":
    sys.exit(main())
