#!/usr/bin/env python
"""How late a holder stops believing: ``on_lost`` against the hold's local deadline.

docs/safety.rst ("Belief keeps time") promises that ``owned()`` is False at a hold's local
deadline (it reads the clock) and that ``on_lost`` fires there, whatever I/O is in flight; the
bar is 50 ms. This measures, against one freshly started private redis-server on 127.0.0.1,
in one run:

- ``fixed``: a DistLock with ``lease=0.2`` and no watchdog, held past its lease: ``on_lost``'s
  time minus the hold's local deadline (``Hold.expires_at``);
- ``stalled``: a watchdog DistLock (``lease=1``, renewals every 0.3 s) whose server is stopped
  with SIGSTOP (connections open, nothing answered: a renewal round hangs in flight): the same
  difference, then SIGCONT;
- ``floor``: how late a thread sleeping on a timer wakes on this machine in the same run
  (``threading.Event().wait(0.2)`` past its 0.2 s), which is what the watchdog thread pays;
- ``owned()`` at the deadline: how many samples still said True 1 ms past it (must be 0).

Usage::

    python benchmarks/bench_belief.py [--samples N]

Medians, p90 and max in ms, and the median as a ratio to the floor's median.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import sys
import threading
import time
from typing import Any, Dict, List

if __package__ in (None, ""):  # run as a script: make ``benchmarks`` and ``distlock`` importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import distlock  # noqa: E402
from benchmarks import _common as C  # noqa: E402


def _hold_of(lock: Any) -> Any:
    return lock._hold  # a DistLock keeps its hold on the object


def _late(lock: Any, lost: List[float], pause: Any = None, resume: Any = None) -> Dict[str, Any]:
    """Acquire, let the hold run out (``pause`` first), and return how late on_lost fired."""
    assert lock.acquire(timeout=5)
    hold = _hold_of(lock)
    if pause is not None:
        pause()
    deadline = hold.expires_at
    while time.monotonic() < deadline + 0.001:
        time.sleep(0.0005)
    believed = lock.owned()
    end = time.monotonic() + 10.0
    while not lost and time.monotonic() < end:
        time.sleep(0.001)
    if resume is not None:
        resume()
    try:
        lock.release()
    except distlock.LockLostError:
        pass
    assert lost, "on_lost never fired"
    return {"late": lost[0] - deadline, "believed": believed}


def _floor(samples: int) -> List[float]:
    out = []
    event = threading.Event()
    for _ in range(samples):
        start = time.monotonic()
        event.wait(0.2)
        out.append(time.monotonic() - start - 0.2)
    return out


def _stats(values: List[float]) -> str:
    ms = sorted(v * 1000.0 for v in values)
    p90 = ms[min(len(ms) - 1, int(round(0.9 * (len(ms) - 1))))]
    return f"{statistics.median(ms):8.2f} {p90:8.2f} {ms[-1]:8.2f}"


def main(argv: Any = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--samples", type=int, default=20)
    args = parser.parse_args(argv)
    server = C.start_server()
    client = C.connect(server.url, socket_timeout=5)
    results: Dict[str, List[float]] = {"fixed": [], "stalled": []}
    believed = {"fixed": 0, "stalled": 0}
    try:
        distlock.configure(lease=1.0, renew_interval=0.3)
        floor = _floor(args.samples)
        for i in range(args.samples):
            for kind in ("fixed", "stalled"):
                lost: List[float] = []
                if kind == "fixed":
                    lock = distlock.DistLock(f"belief-bench-{kind}-{i}", client=client, lease=0.2)
                    lock.on_lost(lambda _l, lost=lost: lost.append(time.monotonic()))
                    got = _late(lock, lost)
                else:
                    lock = distlock.DistLock(f"belief-bench-{kind}-{i}", client=client)
                    lock.on_lost(lambda _l, lost=lost: lost.append(time.monotonic()))
                    pid = server.proc.pid

                    def stop(pid: int = pid) -> None:
                        time.sleep(0.35)  # a renewal went through; the next hangs in flight
                        os.kill(pid, signal.SIGSTOP)

                    got = _late(lock, lost, stop, lambda pid=pid: os.kill(pid, signal.SIGCONT))
                results[kind].append(got["late"])
                believed[kind] += bool(got["believed"])
            print(f"sample {i + 1}/{args.samples}", file=sys.stderr)
    finally:
        try:
            os.kill(server.proc.pid, signal.SIGCONT)
        except OSError:
            pass
        client.close()
        server.stop()
    floor_median = statistics.median(floor)
    print(f"on_lost after the hold's local deadline, {args.samples} samples each (ms); "
          f"bar: <= 50 ms")
    print(f"{'figure':<10} {'median':>8} {'p90':>8} {'max':>8}  {'x floor':>8}  owned() True past it")
    for kind in ("fixed", "stalled"):
        ratio = statistics.median(results[kind]) / floor_median if floor_median > 0 else float("nan")
        print(f"{kind:<10} {_stats(results[kind])}  {ratio:8.2f}  {believed[kind]}")
    print(f"{'floor':<10} {_stats(floor)}  {1.0:8.2f}  -")
    return 0


if __name__ == "__main__":
    sys.exit(main())
