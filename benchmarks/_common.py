"""Shared machinery of the benchmarks.

- one private ``redis-server`` per run (``start_server``), never the one on port 6379;
- interleaved timing of many candidates in short round-robin rounds (``interleaved``), so that
  the drift of a noisy machine hits every candidate alike and ratios come from the same rounds;
- cross-process harnesses, each bounded in time and always ending its workers:
  ``handoff_latency`` (release in this process -> acquire returns in another),
  ``contended_throughput`` (N processes increment a GET/SET counter under the lock; ops/s and
  how evenly the processes shared the lock, ``fairness``), ``hold_and_wait`` (this process
  holds some locks while a spawned process has many threads waiting on them, and a callable
  measures something meanwhile) and ``handoff_commands`` (the Redis commands per hand-off when
  1, 10 or 50 processes wait);
- Redis-side counters: ``command_calls`` / ``command_rate`` (INFO commandstats) and
  ``connections_named`` (CLIENT LIST);
- the result table (``Row``, ``format_table``) and its JSON form.

A lock under test is given as a *factory*: a module-level function
``factory(client, name) -> LockHandle``. It must be module-level because worker processes
are started with the ``spawn`` method and unpickle it by reference.
"""

from __future__ import annotations

import contextlib
import json
import math
import multiprocessing
import os
import random
import statistics
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from multiprocessing.connection import Connection
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Sequence, Set, Tuple, TypeVar

import redis

from benchmarks._internals import RedisServer

__all__ = [
    "LockHandle", "LockFactory", "start_server", "connect", "server_meta",
    "cycle", "interleaved", "per_round_ratios", "median", "percentile",
    "Workers", "expect", "handoff_latency", "contended_throughput", "hold_and_wait",
    "handoff_commands", "fairness", "fairness_rows", "versus_rows",
    "add_hint_floor", "make_hint_holder", "make_hint_waiter", "pinned", "round_robin",
    "command_calls", "calls_delta", "command_rate", "connections_named",
    "Row", "format_table", "text_table", "num_text", "ratio_text", "write_json",
]

T = TypeVar("T")

SPAWN = multiprocessing.get_context("spawn")

#: How long a worker waits for its next instruction before it gives up and exits (it also exits
#: at once when the parent's end of the pipe closes).
WORKER_IDLE_LIMIT = 120.0


# --- the lock under test ----------------------------------------------------------------------

class LockHandle:
    """A lock of any library behind one small interface.

    - ``acquire(timeout)``: block at most ``timeout`` seconds; True when taken;
    - ``release()``;
    - ``acquire_default()``: the library's own ``acquire()`` with its defaults (what the
      uncontended figure times, with no adapter in between);
    - ``obj``: the library's lock object itself;
    - ``acquired_at``: None, or set by ``acquire`` to when the library's own ``acquire()``
      returned, where that comes before ``acquire`` itself returns (an async lock behind a
      blocking facade: in its task, before the event loop it runs on has stopped).
    """

    __slots__ = ("acquire", "release", "acquire_default", "obj", "acquired_at")

    def __init__(self, acquire: Callable[[float], bool], release: Callable[[], object],
                 acquire_default: Optional[Callable[[], object]] = None, obj: object = None) -> None:
        self.acquire = acquire
        self.release = release
        self.acquire_default = acquire_default if acquire_default is not None else (lambda: acquire(60.0))
        self.obj = obj
        self.acquired_at: Optional[float] = None


LockFactory = Callable[["redis.Redis[Any]", str], LockHandle]


# --- the server ---------------------------------------------------------------------------------

def start_server() -> RedisServer:
    """A fresh private redis-server on a free 127.0.0.1 port, no persistence."""
    return RedisServer()


def connect(url: str, **kwargs: Any) -> redis.Redis[Any]:
    """A client of the benchmark's server, the same for every implementation.

    Without a socket timeout: redis-py 8 defaults to 5 s, which aborts any blocking command
    waiting longer (python-redis-lock's waiters BLPOP for as long as they wait). Pass
    ``socket_timeout=`` to override.
    """
    kwargs.setdefault("socket_timeout", None)
    return redis.Redis.from_url(url, **kwargs)


def server_meta(client: redis.Redis[Any]) -> Dict[str, Any]:
    info = client.info("server")
    return {"redis_version": info.get("redis_version"), "tcp_port": info.get("tcp_port")}


# --- statistics -----------------------------------------------------------------------------------

def median(values: Sequence[float]) -> float:
    return float(statistics.median(values)) if values else math.nan


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100): a value that was actually observed."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100.0 * len(ordered)))
    return float(ordered[min(rank, len(ordered)) - 1])


# --- interleaved timing -----------------------------------------------------------------------

def cycle(acquire: Callable[[], object], release: Callable[[], object]) -> Callable[[], None]:
    """One uncontended acquire + release, as one timed call."""
    def op() -> None:
        acquire()
        release()

    return op


def round_robin(names: Sequence[str], rnd: int) -> List[str]:
    """``names`` in the order of round ``rnd``: rotated by one each round, so that a slow spell
    of the machine does not always hit the same candidate."""
    shift = rnd % len(names)
    return list(names[shift:]) + list(names[:shift])


def interleaved(ops: Mapping[str, Callable[[], object]], *, rounds: int, per_round: int,
                warmup_ops: int = 20, max_seconds: Optional[float] = None,
                cpu: Optional[Dict[str, List[float]]] = None) -> Dict[str, List[float]]:
    """Time every candidate in ``rounds`` short rounds; return µs per call, per round.

    With ``cpu``, also record there the process' CPU time (``time.process_time()``, every
    thread of the client process) per call, per round: on a loaded machine that, not the wall
    time, is what a client's extra Python work costs.

    Each round runs every candidate ``per_round`` times back to back, in an order rotated by one
    each round (round-robin), so a slow spell of the machine is shared out. One warm-up pass of
    ``warmup_ops`` calls per candidate comes first and is not counted. With ``max_seconds``, stop
    after the round that crosses it (at least 3 rounds are always run).
    """
    names = list(ops)
    for name in names:
        fn = ops[name]
        for _ in range(warmup_ops):
            fn()
    out: Dict[str, List[float]] = {name: [] for name in names}
    started = time.monotonic()
    perf, process = time.perf_counter, time.process_time
    for rnd in range(rounds):
        for name in round_robin(names, rnd):
            fn = ops[name]
            c0 = process()
            t0 = perf()
            for _ in range(per_round):
                fn()
            out[name].append((perf() - t0) / per_round * 1e6)
            if cpu is not None:
                cpu.setdefault(name, []).append((process() - c0) / per_round * 1e6)
        if max_seconds is not None and rnd >= 2 and time.monotonic() - started > max_seconds:
            break
    return out


@contextlib.contextmanager
def pinned(client: redis.Redis[Any]) -> Iterator[str]:
    """Pin the calling thread to the first CPU and the benchmark's own server to the last for
    the block, then give both their CPUs back; yields what it did, for the notes.

    A single-client timing swings by 20 % from one minute to the next on a small VM as the
    scheduler moves the client and the server between cores (same core: no cross-core wake-up;
    different cores: one per message). Pinned, every candidate sees the same placement, and
    runs agree within a few percent. Off with ``DISTLOCK_BENCH_PIN=0``, on one CPU, or where
    the OS has no ``sched_setaffinity``."""
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    if os.environ.get("DISTLOCK_BENCH_PIN", "1") == "0" or len(cpus) < 2:
        yield "not pinned"
        return
    pid = int(client.info("server")["process_id"])
    mine, theirs = os.sched_getaffinity(0), os.sched_getaffinity(pid)
    try:
        os.sched_setaffinity(pid, {cpus[-1]})
        os.sched_setaffinity(0, {cpus[0]})
        yield f"client pinned to CPU {cpus[0]}, server to CPU {cpus[-1]}"
    finally:
        for who, was in ((0, mine), (pid, theirs)):
            try:
                os.sched_setaffinity(who, was)
            except OSError:
                pass


def per_round_ratios(per_round: Mapping[str, List[float]], reference: str) -> Dict[str, List[float]]:
    """Each candidate's time divided by ``reference``'s in the same round."""
    ref = per_round[reference]
    return {name: [v / r for v, r in zip(values, ref)] for name, values in per_round.items()}


# --- worker processes -------------------------------------------------------------------------

class Workers:
    """Spawned worker processes, each given the child end of a pipe as its last argument.

    A context manager: on exit every worker is joined briefly, then terminated, then killed.
    """

    def __init__(self, join_timeout: float = 5.0) -> None:
        self.procs: List[Any] = []
        self.conns: List[Connection] = []
        self.join_timeout = join_timeout

    def start(self, target: Callable[..., None], *args: Any) -> Connection:
        parent_end, child_end = SPAWN.Pipe()
        proc = SPAWN.Process(target=target, args=(*args, child_end), daemon=True)
        proc.start()
        child_end.close()
        self.procs.append(proc)
        self.conns.append(parent_end)
        return parent_end

    def close(self) -> None:
        for conn in self.conns:
            try:
                conn.close()  # a worker blocked on recv() sees EOF and exits
            except OSError:
                pass
        deadline = time.monotonic() + self.join_timeout
        for proc in self.procs:
            proc.join(timeout=max(0.0, deadline - time.monotonic()))
        for proc in self.procs:
            if proc.is_alive():
                proc.terminate()
                proc.join(timeout=5.0)
            if proc.is_alive():
                proc.kill()
                proc.join(timeout=5.0)

    def __enter__(self) -> Workers:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def expect(conn: Connection, timeout: float, what: str) -> Any:
    """The worker's next message, or TimeoutError if it does not come within ``timeout``."""
    if not conn.poll(timeout):
        raise TimeoutError(f"worker did not {what} within {timeout:g} s")
    return conn.recv()


def _next_command(conn: Connection) -> Any:
    if not conn.poll(WORKER_IDLE_LIMIT):
        return None
    return conn.recv()


# --- handoff latency --------------------------------------------------------------------------

def handoff_latency(client: redis.Redis[Any], url: str, factory: LockFactory, name: str, *,
                    samples: int, max_seconds: float, settle: Tuple[float, float] = (0.03, 0.13),
                    acquire_timeout: float = 10.0, warmup: int = 3, seed: int = 1,
                    waiter_factory: Optional[LockFactory] = None) -> Dict[str, Any]:
    """Seconds from the start of ``release()`` here to the return of ``acquire()`` in another
    process that was blocked on it, once per sample.

    Each sample: this process takes the lock; the waiter process is told to acquire and says it
    is about to; this process sleeps a random time in ``settle`` (so the waiter is blocked, and
    a polling waiter is caught at a random phase of its poll), stamps ``time.monotonic()`` (one
    clock for the whole system on Linux) and releases; the waiter stamps the clock when its
    ``acquire()`` returns, releases, and sends the stamp back. The first ``warmup`` samples are
    dropped. Stops at ``samples`` or after ``max_seconds``, whichever comes first.
    ``waiter_factory`` (default ``factory``) makes the waiter's side.
    """
    rng = random.Random(seed)
    holder = factory(client, name)
    latencies: List[float] = []
    failures = 0
    started = time.monotonic()
    with Workers() as workers:
        conn = workers.start(_handoff_waiter, url, waiter_factory or factory, name, acquire_timeout)
        if expect(conn, 60.0, "start") != "ready":
            raise RuntimeError("handoff waiter failed to start")
        started = time.monotonic()
        attempt = 0
        while len(latencies) < samples and attempt < samples + warmup + 20:
            if time.monotonic() - started > max_seconds:
                break
            if not holder.acquire(acquire_timeout):
                raise RuntimeError(f"holder could not take {name!r} in {acquire_timeout} s")
            conn.send("go")
            if expect(conn, 30.0, "start waiting") != "waiting":
                raise RuntimeError("handoff waiter sent something unexpected")
            time.sleep(rng.uniform(*settle))
            t0 = time.monotonic()
            holder.release()
            ok, t1 = expect(conn, acquire_timeout + 30.0, "acquire")
            attempt += 1
            if not ok:
                failures += 1
            elif attempt > warmup:
                latencies.append(t1 - t0)
        conn.send("stop")
    return {"latencies": latencies, "failures": failures, "seconds": time.monotonic() - started,
            "capped": len(latencies) < samples}


def handoff_latency_local(client: redis.Redis[Any], factory: LockFactory, name: str, *,
                          samples: int, max_seconds: float, settle: Tuple[float, float] = (0.03, 0.13),
                          acquire_timeout: float = 10.0, warmup: int = 3, seed: int = 1) -> Dict[str, Any]:
    """``handoff_latency`` with the waiter a thread of this process, on the same client: two
    threads of one process taking turns on one name (what a lock that hands over in the
    process saves). Each sample as there: this thread takes the lock, the waiter thread says
    it is about to acquire, this thread sleeps a random time in ``settle``, stamps the clock
    and releases; the waiter stamps it when its ``acquire()`` returns, and releases."""
    rng = random.Random(seed)
    holder = factory(client, name)
    waiter = factory(client, name)
    go, waiting, done = threading.Event(), threading.Event(), threading.Event()
    results: List[Tuple[bool, float]] = []
    stop = [False]

    def wait() -> None:
        while True:
            go.wait()
            go.clear()
            if stop[0]:
                return
            waiting.set()
            ok = waiter.acquire(acquire_timeout)
            t1 = time.monotonic()
            if ok:
                waiter.release()
            results.append((ok, t1))
            done.set()

    thread = threading.Thread(target=wait, name="bench-handoff-waiter", daemon=True)
    thread.start()
    latencies: List[float] = []
    failures = 0
    started = time.monotonic()
    attempt = 0
    try:
        while len(latencies) < samples and attempt < samples + warmup + 20:
            if time.monotonic() - started > max_seconds:
                break
            if not holder.acquire(acquire_timeout):
                raise RuntimeError(f"holder could not take {name!r} in {acquire_timeout} s")
            done.clear()
            go.set()
            if not waiting.wait(30.0):
                raise RuntimeError("handoff waiter thread did not start waiting")
            waiting.clear()
            time.sleep(rng.uniform(*settle))
            t0 = time.monotonic()
            holder.release()
            if not done.wait(acquire_timeout + 30.0):
                raise RuntimeError("handoff waiter thread did not come back")
            ok, t1 = results[-1]
            attempt += 1
            if not ok:
                failures += 1
            elif attempt > warmup:
                latencies.append(t1 - t0)
    finally:
        stop[0] = True
        go.set()
        thread.join(acquire_timeout + 30.0)
    return {"latencies": latencies, "failures": failures, "seconds": time.monotonic() - started,
            "capped": len(latencies) < samples}


def _handoff_waiter(url: str, factory: LockFactory, name: str, acquire_timeout: float,
                    conn: Connection) -> None:
    client = connect(url)
    lock = factory(client, name)
    try:
        conn.send("ready")
        while True:
            if _next_command(conn) != "go":
                return
            conn.send("waiting")
            lock.acquired_at = None
            ok = lock.acquire(acquire_timeout)
            t1 = time.monotonic() if lock.acquired_at is None else lock.acquired_at
            if ok:
                lock.release()
            conn.send((ok, t1))
    except (EOFError, BrokenPipeError, ConnectionResetError):
        return


# --- the floor of a hinted handoff: no lock at all --------------------------------------------

def make_hint_holder(client: Any, name: str) -> LockHandle:
    """The holder's side of the handoff floor: ``release()`` is one PUBLISH."""
    channel = f"{name}:floor"
    return LockHandle(lambda t: True, lambda: client.publish(channel, "1"), obj=channel)


def make_hint_waiter(client: Any, name: str) -> LockHandle:
    """The waiter's side of the handoff floor: ``acquire()`` waits for the PUBLISH on a
    subscribed redis-py PubSub, then makes one EVALSHA round trip (the try every hinted waiter
    must make), and returns. What any lock woken by pub/sub needs at least, on this machine."""
    pubsub = client.pubsub()
    pubsub.subscribe(f"{name}:floor")
    if (pubsub.get_message(timeout=10.0) or {}).get("type") != "subscribe":
        raise RuntimeError("handoff floor: subscription not confirmed")
    script = client.register_script("return 1")

    def acquire(timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if pubsub.get_message(timeout=max(0.0, deadline - time.monotonic())) is not None:
                script()
                return True
        return False

    return LockHandle(acquire, lambda: None, obj=pubsub)


HINT_FLOOR = "floor: pub/sub hop + 1 EVALSHA"


def add_hint_floor(rows: List[Any], client: redis.Redis[Any], url: str, figures: Mapping[str, int],
                   *, samples: int, max_seconds: float) -> None:
    """Measure the floor of any handoff woken by pub/sub (``make_hint_holder`` /
    ``make_hint_waiter``, through ``handoff_latency``), add a row of it for each ``figure ->
    percentile`` at the front of ``rows``, and fill the ``vs floor`` of that figure's rows."""
    eprint(f"handoff: floor, PUBLISH -> subscriber + 1 EVALSHA (up to {samples} samples)")
    res = handoff_latency(client, url, make_hint_holder, "bench:handoff:floor", samples=samples,
                          max_seconds=max_seconds, waiter_factory=make_hint_waiter)
    lat_ms = [x * 1000.0 for x in res["latencies"]]
    note = ("no lock: PUBLISH here -> the subscribed waiter process wakes and makes one EVALSHA "
            f"round trip; n={len(lat_ms)}")
    for figure, q in figures.items():
        value = median(lat_ms) if q == 50 else percentile(lat_ms, q)
        for r in rows:
            if r.figure == figure and value:
                r.vs_floor = (r.value or 0) / value
        rows.insert(0, Row(figure, HINT_FLOOR, value, "ms", 1.0, note=note, data={"latencies_ms": lat_ms}))


# --- contended throughput ---------------------------------------------------------------------

def contended_throughput(client: redis.Redis[Any], url: str,
                         candidates: Mapping[str, Tuple[LockFactory, str, str]], *,
                         procs: int = 4, seconds: float = 1.0, rounds: int = 5,
                         acquire_timeout: float = 10.0) -> Dict[str, Dict[str, Any]]:
    """For each candidate ``label -> (factory, lock name, counter key)``: ``procs`` processes
    loop ``acquire; GET counter; SET counter+1; release`` for ``seconds``, all starting at one
    instant; ``rounds`` such runs per candidate, interleaved round-robin (the order rotated by
    one each round), so that a slow spell of a noisy machine hits every candidate alike.

    The workers of every candidate are started once and stay up between rounds. Returns, per
    candidate: the increments the workers reported and the counter's final value, summed over
    the rounds; ``lost`` (reported minus final: updates one worker overwrote for another);
    ``per_round_ops`` (ops/s of each round: increments over the time from the common start to
    the last worker's finish) and ``ops_per_s`` (their median); per-process increments, summed
    (``per_worker``) and per round (``per_round_workers``); fairness (``per_round_fairness``:
    the least process' increments over the mean of the processes, per round; ``fairness``:
    their median; ``fairness_min``: the worst round), since a lock can be fast by letting one
    process keep it; and the Redis commands run meanwhile (``commands``, ``commands_per_op``:
    commands run inside scripts count too; ``scripts_per_op``: EVALSHA and EVAL calls per
    increment).
    """
    labels = list(candidates)
    out: Dict[str, Dict[str, Any]] = {
        label: {"increments": 0, "final": 0, "per_round_ops": [], "per_worker": [0] * procs,
                "per_round_workers": [], "timeouts": 0, "release_errors": 0, "commands": {}}
        for label in labels}
    with Workers() as workers:
        conns: Dict[str, List[Connection]] = {}
        for label in labels:
            factory, name, counter_key = candidates[label]
            conns[label] = [workers.start(_contended_worker, url, factory, name, counter_key,
                                          acquire_timeout) for _ in range(procs)]
        for label in labels:
            for conn in conns[label]:
                if expect(conn, 60.0, "start") != "ready":
                    raise RuntimeError("contended worker failed to start")
        for rnd in range(rounds):
            for label in round_robin(labels, rnd):
                counter_key = candidates[label][2]
                res = out[label]
                client.delete(counter_key)
                calls_before = command_calls(client)
                start_at = time.monotonic() + 0.1
                for conn in conns[label]:
                    conn.send((start_at, start_at + seconds))
                reports = [expect(conn, seconds + acquire_timeout + 30.0, "finish")
                           for conn in conns[label]]
                calls = calls_delta(calls_before, command_calls(client))
                done = sum(r["increments"] for r in reports)
                res["increments"] += done
                res["final"] += int(client.get(counter_key) or 0)
                elapsed = max(r["finished"] for r in reports) - start_at
                res["per_round_ops"].append(done / elapsed if elapsed > 0 else math.nan)
                res["per_worker"] = [a + r["increments"] for a, r in zip(res["per_worker"], reports)]
                res["per_round_workers"].append([r["increments"] for r in reports])
                res["timeouts"] += sum(r["timeouts"] for r in reports)
                res["release_errors"] += sum(r["release_errors"] for r in reports)
                for cmd, n in calls.items():
                    res["commands"][cmd] = res["commands"].get(cmd, 0) + n
                client.delete(counter_key)
    for res in out.values():
        done, calls = res["increments"], res["commands"]
        res["lost"] = done - res["final"]
        res["ops_per_s"] = median(res["per_round_ops"])
        res["commands_per_op"], res["scripts_per_op"] = per_unit(calls, done)
        res["per_round_fairness"] = [fairness(workers) for workers in res["per_round_workers"]]
        res["fairness"] = median(res["per_round_fairness"])
        res["fairness_min"] = min(res["per_round_fairness"], default=math.nan)
    return out


def fairness(increments: Sequence[int]) -> float:
    """The least process' share over the mean share (1.0: all alike; 0.0: one was starved);
    NaN when nobody got anything."""
    mean = sum(increments) / len(increments) if increments else 0.0
    return min(increments) / mean if mean > 0 else math.nan


def _contended_worker(url: str, factory: LockFactory, name: str, counter_key: str,
                      acquire_timeout: float, conn: Connection) -> None:
    client = connect(url)
    lock = factory(client, name)
    try:
        conn.send("ready")
        while True:
            window = _next_command(conn)
            if window is None:
                return
            start_at, end_at = window
            time.sleep(max(0.0, start_at - time.monotonic()))
            increments = timeouts = release_errors = 0
            while time.monotonic() < end_at:
                if not lock.acquire(acquire_timeout):
                    timeouts += 1
                    continue
                try:
                    value = client.get(counter_key)
                    client.set(counter_key, int(value or 0) + 1)
                    increments += 1
                finally:
                    try:
                        lock.release()
                    except Exception:  # noqa: BLE001 - a lost lease is counted, not fatal
                        release_errors += 1
            conn.send({"increments": increments, "timeouts": timeouts,
                       "release_errors": release_errors, "finished": time.monotonic()})
    except (EOFError, BrokenPipeError, ConnectionResetError):
        return


# --- one process holds, another has many threads waiting ------------------------------------------

def hold_and_wait(client: redis.Redis[Any], url: str, factory: LockFactory, names: Sequence[str],
                  measure: Callable[[], T], *, threads: int, settle: float, client_name: str,
                  wait_timeout: float = 60.0, drain_timeout: float = 30.0,
                  stagger: float = 0.0) -> Tuple[T, Dict[str, Any]]:
    """Hold every lock in ``names`` here while a spawned process has ``threads`` threads (thread
    i on ``names[i % len(names)]``) blocked in ``acquire()``; call ``measure()`` after
    ``settle`` seconds, then release and let the waiters through.

    The waiting process names its connections ``client_name`` (CLIENT SETNAME), so
    ``connections_named`` counts exactly its connections. Its threads start together (a barrier)
    or, with ``stagger``, thread i that many seconds times i later (``settle`` counts from the
    last start); each waits at most ``wait_timeout``. Returns ``(measure(), report)``; the report says how
    many waiters got the lock, how many timed out, and ``early``: how many got it before this
    process released (a holder that expired under the measurement would show there).
    """
    holders = [factory(client, n) for n in names]
    report: Dict[str, Any] = {}
    with Workers() as workers:
        conn = workers.start(_waiters_worker, url, factory, list(names), threads, wait_timeout,
                             client_name, stagger)
        if expect(conn, 60.0, "start") != "ready":
            raise RuntimeError("waiting process failed to start")
        taken: List[LockHandle] = []
        released_at = math.inf
        try:
            for holder in holders:
                if not holder.acquire(10.0):
                    raise RuntimeError("holder could not take its lock")
                taken.append(holder)
            conn.send("go")
            if expect(conn, 60.0, "start its threads") != "started":
                raise RuntimeError("waiting process failed to start its threads")
            time.sleep(settle + stagger * threads)
            result = measure()
        finally:
            released_at = time.monotonic()
            holder_errors = []
            for holder in taken:
                try:
                    holder.release()
                except Exception as exc:  # noqa: BLE001 - reported, e.g. a holder that expired
                    holder_errors.append(repr(exc))
        try:
            report = expect(conn, drain_timeout, "let every waiter through")
        except TimeoutError:
            report = {"acquired": None, "timed_out": None, "acquired_at": [], "drained": False}
    report["early"] = sum(1 for t in report.get("acquired_at", []) if t < released_at)
    report["holder_errors"] = holder_errors
    report.pop("acquired_at", None)
    return result, report


def _waiters_worker(url: str, factory: LockFactory, names: List[str], threads: int,
                    wait_timeout: float, client_name: str, stagger: float, conn: Connection) -> None:
    client = connect(url, client_name=client_name)
    locks = [factory(client, names[i % len(names)]) for i in range(threads)]
    results: List[Optional[Tuple[bool, float]]] = [None] * threads
    errors: List[str] = []
    barrier = threading.Barrier(threads + 1)

    def wait(i: int) -> None:
        try:
            barrier.wait(30.0)
        except threading.BrokenBarrierError:
            return
        if stagger:
            time.sleep(stagger * i)
        try:
            ok = locks[i].acquire(wait_timeout)
            at = time.monotonic()
            if ok:
                locks[i].release()
        except Exception as exc:  # noqa: BLE001 - reported to the parent, not printed here
            errors.append(repr(exc))
            return
        results[i] = (ok, at)

    try:
        conn.send("ready")
        if _next_command(conn) != "go":
            return
        pool = [threading.Thread(target=wait, args=(i,), daemon=True) for i in range(threads)]
        for thread in pool:
            thread.start()
        barrier.wait(30.0)
        conn.send("started")
        deadline = time.monotonic() + wait_timeout + 30.0
        for thread in pool:
            thread.join(max(0.0, deadline - time.monotonic()))
        done = [r for r in results if r is not None]
        conn.send({"acquired": sum(1 for ok, _ in done if ok),
                   "timed_out": sum(1 for ok, _ in done if not ok),
                   "unfinished": threads - len(done) - len(errors), "errors": errors,
                   "drained": len(done) == threads, "acquired_at": [at for ok, at in done if ok]})
    except (EOFError, BrokenPipeError, ConnectionResetError, threading.BrokenBarrierError):
        return


# --- commands per hand-off, by waiting processes --------------------------------------------------

def handoff_commands(client: redis.Redis[Any], url: str, factory: LockFactory, name: str, *,
                     waiting: int, registry: Optional[str] = None, settle: float = 0.5,
                     registry_bound: float = 60.0, quiet: float = 0.6, acquire_timeout: float = 300.0,
                     hold: float = 0.001) -> Dict[str, Any]:
    """The Redis commands a run of hand-offs costs, by how many processes wait: this process
    holds ``name`` while ``waiting`` spawned processes (one thread each) block on it, then
    releases; each waiter takes the lock once, holds it ``hold`` seconds (no Redis command:
    only the lock's own commands are counted), releases and reports.

    Counted on the server (INFO commandstats, which counts the commands scripts run too, minus
    the INFO calls themselves) from just before the release here until every waiter has
    reported, plus ``quiet`` seconds for the last of them to stop waiting (unsubscribe).

    A herd shows as a count per hand-off that grows with ``waiting``: every release would wake
    every waiter to try. Before the release, the waiters are given time to all be blocked:
    until ``registry`` (a sorted set of waiters, e.g. the lock's waiting processes) has
    ``waiting`` entries, for at most ``registry_bound`` seconds, then ``settle`` seconds more for
    the first tries' dust. Returns the delta by command, ``per_handoff`` (all commands over
    ``waiting``), ``scripts_per_handoff`` (EVALSHA and EVAL), how many acquired, the registry's
    size at the release and the seconds from release to the last report.
    """
    holder = factory(client, name)
    report: Dict[str, Any] = {"waiting": waiting}
    with Workers(join_timeout=10.0) as workers:
        conns = [workers.start(_handoff_commands_worker, url, factory, name, acquire_timeout, hold)
                 for _ in range(waiting)]
        for conn in conns:
            if expect(conn, 120.0, "start") != "ready":
                raise RuntimeError("hand-off waiter failed to start")
        if not holder.acquire(10.0):
            raise RuntimeError(f"holder could not take {name!r}")
        try:
            for conn in conns:
                conn.send("go")
            for conn in conns:
                if expect(conn, 60.0, "start waiting") != "waiting":
                    raise RuntimeError("hand-off waiter sent something unexpected")
            queued = None
            if registry is not None:
                deadline = time.monotonic() + registry_bound
                while True:
                    queued = int(client.zcard(registry))
                    if queued >= waiting or time.monotonic() > deadline:
                        break
                    time.sleep(0.02)
            report["queued"] = queued
            time.sleep(settle)
            before = command_calls(client)
        finally:
            t0 = time.monotonic()
            holder.release()
        done = [expect(conn, acquire_timeout + 30.0, "acquire") for conn in conns]
        report["seconds"] = max(t for _, t in done) - t0
        time.sleep(quiet)
        after = command_calls(client)
    delta = calls_delta(before, after)
    report["acquired"] = sum(1 for ok, _ in done if ok)
    report["commands"] = delta
    report["per_handoff"], report["scripts_per_handoff"] = per_unit(delta, waiting)
    return report


def _handoff_commands_worker(url: str, factory: LockFactory, name: str, acquire_timeout: float,
                             hold: float, conn: Connection) -> None:
    client = connect(url)
    lock = factory(client, name)
    try:
        conn.send("ready")
        if _next_command(conn) != "go":
            return
        conn.send("waiting")
        ok = lock.acquire(acquire_timeout)
        if ok:
            time.sleep(hold)
            lock.release()
        conn.send((ok, time.monotonic()))
        _next_command(conn)  # idle (no Redis command) until the parent is done counting
    except (EOFError, BrokenPipeError, ConnectionResetError):
        return


# --- Redis-side counters ------------------------------------------------------------------------

def command_calls(client: redis.Redis[Any]) -> Dict[str, int]:
    """Calls per command since the server started (INFO commandstats)."""
    stats = client.info("commandstats")
    return {key[len("cmdstat_"):]: int(value["calls"]) for key, value in stats.items()
            if key.startswith("cmdstat_")}


def script_server_us(client: redis.Redis[Any], op: Callable[[], object], times: int) -> float:
    """The server's own time running the scripts of ``op`` (EVALSHA's ``usec`` in INFO
    commandstats, the commands the scripts call included), µs per call of ``op``, over
    ``times`` calls: what no client can take off a round trip."""
    def usec() -> int:
        return int(client.info("commandstats").get("cmdstat_evalsha", {}).get("usec", 0))

    before = usec()
    for _ in range(times):
        op()
    return (usec() - before) / times


def per_unit(calls: Mapping[str, int], units: int) -> Tuple[float, float]:
    """Redis commands, and scripts (EVALSHA and EVAL), per unit of work (an increment, a
    hand-off) from ``calls_delta``'s counts; NaN for no unit."""
    if not units:
        return math.nan, math.nan
    return sum(calls.values()) / units, (calls.get("evalsha", 0) + calls.get("eval", 0)) / units


def calls_delta(before: Mapping[str, int], after: Mapping[str, int],
                exclude: Sequence[str] = ("info",)) -> Dict[str, int]:
    """Calls per command between two ``command_calls`` snapshots, without ``exclude`` (by
    default the INFO calls that took the snapshots)."""
    delta = {cmd: n - before.get(cmd, 0) for cmd, n in after.items() if cmd not in exclude}
    return {cmd: n for cmd, n in sorted(delta.items(), key=lambda kv: -kv[1]) if n > 0}


def command_rate(client: redis.Redis[Any], window: float) -> Dict[str, Any]:
    """Commands per second the server executed over ``window`` seconds (INFO excluded)."""
    before = command_calls(client)
    t0 = time.monotonic()
    time.sleep(window)
    after = command_calls(client)
    elapsed = time.monotonic() - t0
    delta = calls_delta(before, after)
    total = sum(delta.values())
    return {"per_s": total / elapsed, "total": total, "seconds": elapsed, "by_command": delta}


def connections_named(client: redis.Redis[Any], name: str) -> int:
    """How many connections the server has open whose CLIENT SETNAME is ``name``."""
    return sum(1 for entry in client.client_list() if entry.get("name") == name)


# --- the result table -----------------------------------------------------------------------------

@dataclass
class Row:
    figure: str
    impl: str
    value: Optional[float]
    unit: str
    vs_floor: Optional[float] = None
    vs_redis_py: Optional[float] = None
    note: str = ""
    data: Dict[str, Any] = field(default_factory=dict)


def num_text(value: Optional[float]) -> str:
    """A number for a table cell: "-" when missing, fewer decimals the larger it is."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    mag = abs(value)
    if mag >= 100 or float(value).is_integer():
        return f"{value:,.0f}"
    if mag >= 10:
        return f"{value:.1f}"
    if mag >= 1:
        return f"{value:.2f}"
    return f"{value:.3f}"


def ratio_text(value: Optional[float]) -> str:
    """A ratio for a table cell ("1.23x"); empty when missing."""
    if value is None or math.isnan(value):
        return ""
    return f"{value:.2f}x"


def format_table(rows: Sequence[Row]) -> str:
    """An aligned text table, rows of one figure kept together (in order of first appearance)."""
    first: Dict[str, int] = {}
    for i, r in enumerate(rows):
        first.setdefault(r.figure, i)
    rows = sorted(rows, key=lambda r: first[r.figure])
    header = ("figure", "implementation", "value", "unit", "vs floor", "vs redis-py", "notes")
    body = [(r.figure, r.impl, num_text(r.value), r.unit, ratio_text(r.vs_floor),
             ratio_text(r.vs_redis_py), r.note) for r in rows]
    return text_table(header, body, right={2, 4, 5})


def text_table(header: Sequence[str], body: Sequence[Sequence[str]], *, right: Set[int],
               grouped: bool = True) -> str:
    """Aligned columns (those in ``right`` right-justified), a rule under the header, and (when
    ``grouped``) a blank line wherever the first column changes."""
    widths = [max(len(h), *(len(cells[i]) for cells in body)) if body else len(h)
              for i, h in enumerate(header)]

    def line(cells: Sequence[str]) -> str:
        parts = [c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths))]
        return "  ".join(parts).rstrip()

    out = [line(header), line(["-" * w for w in widths])]
    previous = None
    for cells in body:
        if grouped and previous is not None and cells[0] != previous:
            out.append("")
        previous = cells[0]
        out.append(line(cells))
    return "\n".join(out)


def json_clean(obj: Any) -> Any:
    """``obj`` as strict JSON takes it: NaN and infinities become null, keys strings."""
    if isinstance(obj, float) and (math.isnan(obj) or math.isinf(obj)):
        return None
    if isinstance(obj, dict):
        return {str(k): json_clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_clean(v) for v in obj]
    return obj


def write_json(path: str, meta: Mapping[str, Any], rows: Sequence[Row]) -> None:
    payload = {"meta": dict(meta), "rows": [asdict(r) for r in rows]}
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(json_clean(payload), fh, indent=2)
        fh.write("\n")


_T0 = time.monotonic()


def eprint(*args: Any) -> None:
    """Progress messages, stamped with seconds since start, go to stderr (stdout: the table)."""
    print(f"[{time.monotonic() - _T0:6.1f} s]", *args, file=sys.stderr, flush=True)


# --- the command line every benchmark file shares --------------------------------------------

@dataclass(frozen=True)
class Option:
    """A command-line option that overrides one field of a file's knobs; a number is raised to
    ``minimum`` (``None``: the value is taken as ``type`` made it, e.g. a tuple)."""

    flag: str
    field: str
    type: Callable[[str], Any]
    minimum: Optional[float]
    help: str


def _version(dist: str) -> Optional[str]:
    import importlib.metadata

    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def bench_main(argv: Optional[List[str]], *, doc: Optional[str], title: str,
               figures: Sequence[str], full: Any, quick: Any, options: Sequence[Option],
               run: Callable[[Any, str, Any, List[str]], List[Row]],
               versions: Sequence[Tuple[str, str]] = (),
               table: Callable[[Sequence[Row]], str] = format_table) -> int:
    """Parse ``[figure ...] [--quick] [--json PATH] [options]``, start one private server, call
    ``run(client, url, knobs, chosen figures)`` and print its rows as a table (and JSON).

    ``versions`` are (label, distribution) pairs reported with the run, e.g. the peers.
    ``table`` renders the rows for stdout (a file whose rows read better another way, e.g. as
    a curve, passes its own); the JSON always has the rows themselves.
    """
    import argparse
    import os
    import platform
    from dataclasses import replace

    import distlock
    from benchmarks._internals import reset_sessions

    parser = argparse.ArgumentParser(description=(doc or "").split("\n\n")[0])
    parser.add_argument("figures", nargs="*", metavar="figure",
                        help=f"figures to run (default: all): {', '.join(figures)}")
    parser.add_argument("--quick", action="store_true", help="a short smoke run (< 60 s)")
    parser.add_argument("--json", metavar="PATH", help="also write every figure and sample as JSON")
    for option in options:
        parser.add_argument(option.flag, type=option.type, help=option.help)
    args = parser.parse_args(argv)
    unknown = [f for f in args.figures if f not in figures]
    if unknown:
        parser.error(f"unknown figure(s) {', '.join(unknown)}; choose from {', '.join(figures)}")
    chosen = [f for f in figures if f in args.figures] if args.figures else list(figures)
    knobs = quick if args.quick else full
    for option in options:
        value = getattr(args, option.flag.lstrip("-").replace("-", "_"))
        if value:
            if option.minimum is not None:
                value = max(option.minimum, value)
            knobs = replace(knobs, **{option.field: value})

    started = time.monotonic()
    server = start_server()
    client = connect(server.url)
    try:
        labels = {label: _version(dist) for label, dist in versions}
        meta: Dict[str, Any] = {
            "command": " ".join([os.path.basename(sys.executable), *sys.argv]),
            "figures": chosen, "quick": args.quick, "knobs": knobs.__dict__,
            "python": platform.python_version(), "platform": platform.platform(),
            "cpus": os.cpu_count(), "distlock": distlock.__version__,
            **{label.replace("-", "_"): v for label, v in labels.items()},
            **server_meta(client),
        }
        rows = run(client, server.url, knobs, chosen)
    finally:
        client.close()
        reset_sessions()
        server.stop()
    meta["seconds"] = round(time.monotonic() - started, 1)
    peers = "".join(f"{label} {v}, " for label, v in labels.items())
    print(f"{title}: redis {meta['redis_version']}, {peers}Python {meta['python']}, "
          f"{meta['cpus']} CPUs; {meta['seconds']} s"
          f"{' (--quick: numbers are not meaningful)' if args.quick else ''}")
    print(table(rows))
    if args.json:
        write_json(args.json, meta, rows)
    return 0


def contended_rows(results: Mapping[str, Dict[str, Any]], labels: Sequence[str], ours: Sequence[str],
                   figure: str, reference: str,
                   lost_figure: str = "contended lost updates") -> Tuple[List[Row], List[Row]]:
    """The rows of ``contended_throughput``'s ``results``, in the order of ``labels``: ops/s
    (with the ratio to ``reference`` per round, and the target for ``ours``) and lost updates
    (as ``lost_figure``)."""
    per_round = {label: res["per_round_ops"] for label, res in results.items()}
    vs_ref = per_round_ratios(per_round, reference) if reference in per_round else {}
    ops: List[Row] = []
    lost: List[Row] = []
    for label in labels:
        res = results[label]
        vs = None
        note = ""
        if vs_ref:
            ratios = vs_ref[label]
            vs = median(ratios)
            res["per_round_vs_redis_py"] = ratios
            note = (f"ratio to redis-py per round: IQR {percentile(ratios, 25):.2f}-"
                    f"{percentile(ratios, 75):.2f}; ")
            if label in ours:
                note = f"target >= redis-py: {'met' if vs >= 1.0 else 'MISSED'}; " + note
        note += (f"median of {len(res['per_round_ops'])} rounds; {res['increments']} increments, "
                 f"per process {res['per_worker']}, {res['scripts_per_op']:.1f} EVALSHA/op")
        if "commands_per_op" in res:
            note += f", {res['commands_per_op']:.1f} commands/op"
        if res["timeouts"] or res["release_errors"]:
            note += f", {res['timeouts']} failed acquires, {res['release_errors']} release errors"
        ops.append(Row(figure, label, res["ops_per_s"], "ops/s", None, vs, note, res))
        lost.append(Row(lost_figure, label, float(res["lost"]), "updates",
                        note=f"target 0: {'met' if res['lost'] == 0 else 'MISSED'}; final counters "
                             f"{res['final']} of {res['increments']}"))
    return ops, lost



def fairness_rows(results: Mapping[str, Dict[str, Any]], labels: Sequence[str], figure: str,
                  targets: Mapping[str, float]) -> List[Row]:
    """One row per label of ``contended_throughput``'s fairness (median over the rounds of the
    least process' increments over the mean), with the target of the labels in ``targets``
    (the others are just reported)."""
    rows: List[Row] = []
    for label in labels:
        res = results[label]
        value = res["fairness"]
        per_round = res["per_round_fairness"]
        note = (f"min/mean per round, median of {len(per_round)} rounds; worst round "
                f"{res['fairness_min']:.2f}; per process {res['per_worker']}")
        if label in targets:
            met = not math.isnan(value) and value >= targets[label]
            note = f"target >= {targets[label]:g}: {'met' if met else 'MISSED'}; " + note
        rows.append(Row(figure, label, value, "min/mean", note=note,
                        data={"per_round_fairness": per_round,
                              "per_round_workers": res["per_round_workers"]}))
    return rows


def versus_rows(results: Mapping[str, Dict[str, Any]], pairs: Mapping[str, str], figure: str) -> List[Row]:
    """For each ``label -> reference`` of ``pairs`` (both in ``contended_throughput``'s
    ``results``): the median over the rounds of the label's ops/s over the reference's in the
    same round, as a row of its own (the value is the ratio)."""
    per_round = {label: res["per_round_ops"] for label, res in results.items()}
    rows: List[Row] = []
    for label, ref in pairs.items():
        if label not in per_round or ref not in per_round:
            continue
        ratios = [v / r for v, r in zip(per_round[label], per_round[ref]) if r]
        rows.append(Row(figure, label, median(ratios), f"x {ref}",
                        note=f"ops/s over {ref}'s in the same round: IQR {percentile(ratios, 25):.2f}-"
                             f"{percentile(ratios, 75):.2f}, median of {len(ratios)} rounds",
                        data={"per_round_ratio": ratios}))
    return rows
