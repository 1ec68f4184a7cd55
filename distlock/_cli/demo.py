"""``distlock demo``: the lost-update race, without a lock and with DistLock and DistRLock.

N worker processes each read a shared counter, add one in Python and write it back, K times.
Without a lock, two workers read the same value and one increment is lost; under DistLock (and
under DistRLock taken twice, reentrantly) the count is exact. Each worker also records, on
``time.monotonic()`` (one clock for every process of a host), when it asked for the lock, when it
got it and when it began to release it; the hand-off latency is the time from one worker's
release to the return of ``acquire()`` in another worker that was already waiting.

Without a URL the demo starts a private ``redis-server`` on a free loopback port, or, where there
is none, fakeredis' TCP server inside this process, and stops it afterwards. A given URL may
name a Redis Cluster (``redis+cluster://host:port[,host:port...]/``): the parent and every
worker then talk to it through a ``redis.RedisCluster``.
"""

from __future__ import annotations

import multiprocessing
import os
import queue
import statistics
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, TextIO, Tuple

import redis

from .._redis.scripts import all_sources

__all__ = ["run_demo", "handoff_latencies", "Row", "format_table"]

#: The longest one run may take before the demo gives up (a stuck worker, a dead server).
PHASE_TIMEOUT = 300.0
#: How long spawned workers may take to start and report for duty.
START_TIMEOUT = 120.0

#: (asked for the lock, got it, began to release it), all on time.monotonic()
Record = Tuple[float, float, float]

PHASES = (
    ("none", "no lock"),
    ("lock", "DistLock"),
    ("rlock", "DistRLock, taken twice"),
)


# --- what each worker process runs ----------------------------------------------------------

def _increment(client: Any, key: str) -> None:
    value = client.get(key)
    client.set(key, int(value or 0) + 1)


def _run_phase(client: Any, phase: str, counter: str, lock_name: str, k: int,
               ) -> Tuple[float, float, List[Record]]:
    from .. import DistLock, DistRLock

    records: List[Record] = []
    started = time.monotonic()
    if phase == "none":
        for _ in range(k):
            _increment(client, counter)
    elif phase == "lock":
        lock = DistLock(lock_name, client=client)
        for _ in range(k):
            asked = time.monotonic()
            lock.acquire()
            got = time.monotonic()
            try:
                _increment(client, counter)
            finally:
                releasing = time.monotonic()
                lock.release()
            records.append((asked, got, releasing))
    elif phase == "rlock":
        rlock = DistRLock(lock_name, client=client)
        for _ in range(k):
            asked = time.monotonic()
            rlock.acquire()
            got = time.monotonic()
            try:
                with rlock:  # the second, reentrant level: no round trip to wait on
                    _increment(client, counter)
            finally:
                releasing = time.monotonic()
                rlock.release()
            records.append((asked, got, releasing))
    else:
        raise ValueError(f"unknown phase {phase!r}")
    return started, time.monotonic(), records


def _worker(index: int, url: str, tasks: Any, results: Any, barrier: Any) -> None:
    """One worker process: run the phases it is sent until it is sent None."""
    from .connect import connect

    client: Any = None
    try:
        client = connect(url)
        client.ping()
        results.put((index, "ready", None))
        while True:
            task = tasks.get(timeout=PHASE_TIMEOUT * 2)
            if task is None:
                return
            phase, counter, lock_name, k = task
            try:
                barrier.wait(timeout=START_TIMEOUT)
                results.put((index, "done", _run_phase(client, phase, counter, lock_name, k)))
            except Exception as exc:  # noqa: BLE001 - reported to the parent, which stops
                results.put((index, "error", f"{type(exc).__name__}: {exc}"))
    except Exception as exc:  # noqa: BLE001
        results.put((index, "error", f"{type(exc).__name__}: {exc}"))
    finally:
        from .._session.session import reset_sessions

        reset_sessions()  # stop this process' distlock threads before their connections go
        if client is not None:
            client.close()


# --- the figures (no I/O) ----------------------------------------------------------------------

def handoff_latencies(records: Dict[int, Sequence[Record]]) -> List[float]:
    """Seconds from each release to the next grant, where the next holder is another worker
    that was already waiting when the release began (a true hand-off, not a fresh arrival)."""
    holds = sorted((got, releasing, asked, worker)
                   for worker, recs in records.items() for asked, got, releasing in recs)
    latencies = []
    for (_, released, _, worker), (got, _, asked, other) in zip(holds, holds[1:]):
        if other != worker and asked <= released <= got:
            latencies.append(got - released)
    return latencies


@dataclass(frozen=True)
class Row:
    label: str
    final: int
    expected: int
    wall: float
    handoff_median: Optional[float]
    handoffs: int

    @property
    def lost(self) -> int:
        return self.expected - self.final


def format_table(rows: Sequence[Row]) -> List[str]:
    head = ("run", "final count", "expected", "lost updates", "wall time", "median handoff")
    body = []
    for r in rows:
        handoff = "-" if r.handoff_median is None else \
            f"{r.handoff_median * 1000:.2f} ms (n={r.handoffs})"
        body.append((r.label, str(r.final), str(r.expected), str(r.lost), f"{r.wall:.2f} s",
                     handoff))
    widths = [max(len(row[i]) for row in (head, *body)) for i in range(len(head))]

    def line(cells: Sequence[str]) -> str:
        first = cells[0].ljust(widths[0])
        rest = [c.rjust(w) for c, w in zip(cells[1:], widths[1:])]
        return "  ".join([first, *rest])

    return [line(head), "  ".join("-" * w for w in widths), *(line(b) for b in body)]


# --- the embedded server -----------------------------------------------------------------------

class _Backend:
    """The server the demo runs on: the given URL, a private redis-server, or fakeredis."""

    def __init__(self, url: Optional[str]) -> None:
        from .._redis.urls import cluster_url

        self.url = url
        what = "Redis Cluster" if url is not None and cluster_url(url) is not None else "Redis server"
        self.description = f"the {what} at {url}"
        self._server: Any = None
        self._fake: Any = None
        self._thread: Optional[threading.Thread] = None

    def start(self) -> None:
        if self.url is not None:
            return
        from ..testing.server import RedisServer, redis_server_binary

        binary = redis_server_binary()
        if binary is not None:
            self._server = RedisServer()
            self.url = self._server.url
            self.description = f"a private redis-server ({binary}) at {self.url}"
            return
        try:
            import fakeredis
        except ImportError:
            raise RuntimeError(
                "there is no redis-server on PATH and fakeredis is not installed: install "
                "redis-server, or pip install 'distlock-redis[demo]', or pass --url") from None
        self._fake = fakeredis.TcpFakeServer(("127.0.0.1", 0))
        port = self._fake.server_address[1]
        self._thread = threading.Thread(target=self._fake.serve_forever, kwargs={"poll_interval": 0.1},
                                        name="demo-fakeredis", daemon=True)
        self._thread.start()
        self.url = f"redis://127.0.0.1:{port}/0"
        self.description = (f"fakeredis' TCP server in this process at {self.url} "
                            "(no redis-server on PATH; expect slower figures)")

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop()
            self._server = None
        if self._fake is not None:
            self._fake.shutdown()
            self._fake.server_close()
            if self._thread is not None:
                self._thread.join(timeout=10)
            self._fake = None


# --- the parent ----------------------------------------------------------------------------------

class _Progress:
    """One status line per run: rewritten in place on a terminal, every few seconds otherwise."""

    def __init__(self, out: TextIO) -> None:
        self.out = out
        self.tty = out.isatty()
        self.last = 0.0

    def update(self, text: str) -> None:
        now = time.monotonic()
        if self.tty:
            self.out.write("\r  " + text.ljust(60))
            self.out.flush()
        elif now - self.last >= 5.0:
            self.out.write("  " + text + "\n")
            self.out.flush()
            self.last = now

    def done(self, text: str) -> None:
        if self.tty:
            self.out.write("\r  " + text.ljust(60) + "\n")
        else:
            self.out.write("  " + text + "\n")
        self.out.flush()
        self.last = 0.0


class _Failed(Exception):
    pass


def _collect(results: Any, n: int, kind: str, timeout: float, progress: Optional[_Progress] = None,
             poll: Any = None) -> Dict[int, Any]:
    """Wait for ``n`` reports of ``kind`` from the workers, showing progress; bounded."""
    deadline = time.monotonic() + timeout
    got: Dict[int, Any] = {}
    while len(got) < n:
        left = deadline - time.monotonic()
        if left <= 0:
            raise _Failed(f"workers did not finish within {timeout:.0f} s")
        try:
            index, what, payload = results.get(timeout=min(0.5, left))
        except queue.Empty:
            if progress is not None and poll is not None:
                progress.update(poll())
            continue
        if what == "error":
            raise _Failed(f"worker {index} failed: {payload}")
        if what == kind:
            got[index] = payload
    return got


def run_demo(url: Optional[str] = None, workers: int = 4, increments: int = 200,
             out: Optional[TextIO] = None) -> int:
    """Run the demo; return the exit status (0 when both locked runs are exact)."""
    out = out or sys.stdout
    err = sys.stderr
    backend = _Backend(url)
    procs: List[Any] = []
    task_queues: List[Any] = []
    client: Any = None
    run = os.urandom(4).hex()
    counter = f"distlock-demo:{run}:counter"
    names = {"lock": f"distlock-demo:{run}:lock", "rlock": f"distlock-demo:{run}:rlock"}
    try:
        try:
            backend.start()
        except (RuntimeError, OSError) as exc:
            err.write(f"distlock: cannot start a server for the demo: {exc}\n")
            return 69
        assert backend.url is not None
        print(f"distlock demo: {workers} worker processes x {increments} increments of one shared "
              f"counter, on {backend.description}", file=out, flush=True)
        from .connect import connect

        client = connect(backend.url, socket_connect_timeout=10)
        client.ping()
        # Load every script once up front. The workers' first EVALSHA then finds it, and no
        # NOSCRIPT error reply is sent, which fakeredis' TCP server answers by closing the
        # connection (redis-py's reload on that connection would then fail).
        for source in all_sources().values():
            client.script_load(source)

        ctx = multiprocessing.get_context("spawn")
        results = ctx.Queue()
        barrier = ctx.Barrier(workers)
        progress = _Progress(err)
        progress.update(f"starting {workers} worker processes ...")
        for i in range(workers):
            tasks = ctx.Queue()
            proc = ctx.Process(target=_worker, args=(i, backend.url, tasks, results, barrier),
                               name=f"distlock-demo-worker-{i}", daemon=True)
            proc.start()
            procs.append(proc)
            task_queues.append(tasks)
        _collect(results, workers, "ready", START_TIMEOUT)
        progress.done(f"{workers} worker processes ready")

        expected = workers * increments
        rows: List[Row] = []
        for phase, label in PHASES:
            client.set(counter, 0)
            lock_name = names.get(phase, "")
            for tasks in task_queues:
                tasks.put((phase, counter, lock_name, increments))

            def poll(label: str = label) -> str:
                try:
                    value = int(client.get(counter) or 0) if client is not None else 0
                except redis.RedisError:
                    value = 0
                return f"{label}: counter at {value} of {expected}"

            done = _collect(results, workers, "done", PHASE_TIMEOUT, progress, poll)
            start = min(d[0] for d in done.values())
            end = max(d[1] for d in done.values())
            latencies = handoff_latencies({i: d[2] for i, d in done.items()})
            final = int(client.get(counter) or 0)
            median = statistics.median(latencies) if latencies else None
            rows.append(Row(label, final, expected, end - start, median, len(latencies)))
            progress.done(f"{label}: {final} of {expected} in {end - start:.2f} s")

        print(file=out)
        for line in format_table(rows):
            print(line, file=out)
        print(file=out, flush=True)
        lost_free = [r for r in rows[1:] if r.lost == 0]
        print(f"Without a lock {rows[0].lost} of {expected} updates were lost; under DistLock "
              f"and DistRLock {'none was' if len(lost_free) == 2 else 'SOME WERE'}. Median "
              "handoff: from one worker's release() to the return of acquire() in a worker that "
              "was already waiting.", file=out, flush=True)
        return 0 if len(lost_free) == 2 else 1
    except _Failed as exc:
        err.write(f"\ndistlock: demo failed: {exc}\n")
        return 1
    except (redis.ConnectionError, redis.TimeoutError) as exc:
        err.write(f"\ndistlock: cannot reach the Redis server at {backend.url}: {exc}\n")
        return 69
    finally:
        for tasks in task_queues:
            try:
                tasks.put(None)
            except (OSError, ValueError):
                pass
        for proc in procs:
            proc.join(timeout=10)
            if proc.is_alive():
                proc.kill()
                proc.join(timeout=10)
        if client is not None:
            try:
                from .._core.keys import Keys
                from .._core.settings import settings

                prefix = settings().prefix
                client.delete(counter, *(Keys(prefix, n).fence for n in names.values()))
            except redis.RedisError:
                pass
            client.close()
        backend.stop()
