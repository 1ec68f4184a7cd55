#!/usr/bin/env python
"""Torn reads under a DistReadWriteLock: many readers, one refresher, no torn reads.

The cached value is spread over several Redis keys (its "parts"). A refresher process rewrites
all of them, one key at a time and slowly, so between two of its writes the value is half old
and half new. Several reader processes read every part. Readers take the read lock, so they
read side by side; the refresher takes the write lock, so nobody reads while it writes. Every
part carries the version it was written by: a read that finds two versions is a torn read.

Run it::

    python docs/examples/torn_reads.py                 # starts its own private redis-server
    python docs/examples/torn_reads.py --url redis://127.0.0.1:6380/0

Options: ``--readers N`` (3), ``--seconds S`` (4), ``--parts K`` (5), and ``--unlocked``, which
runs the same programs without the lock: torn reads then show up. The exit status is 0 when no
reader saw a torn value, 1 otherwise.

This is the read/write lock's own demonstration. For the usual cache, a value computed once
when many callers miss it at the same moment, use a dogpile.cache region on the
``distlock.redis`` backend instead (docs/guides/dogpile.rst, docs/examples/cache_refresh.py).
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import sys
import time
from typing import Any, Dict, List, Optional

import redis

if __package__ in (None, ""):  # run from a source checkout: make ``distlock`` importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from distlock import DistReadWriteLock
from distlock.testing.server import RedisServer

LOCK_NAME = "example:cache"
PART_KEY = "example:cache:part:{}"
INSIDE_KEY = "example:cache:readers-inside"  # how many readers are reading right now


def _nolock() -> Any:
    """A stand-in for a lock side that does nothing (``--unlocked``)."""
    import contextlib

    return contextlib.nullcontext()


def _start_together(results: Any, go: Any, end: Any) -> float:
    """Say ready, wait for the common start, return when to stop (monotonic clock)."""
    results.put({"role": "ready"})
    if not go.wait(60):
        raise SystemExit("no start signal")
    return float(end.value)


def refresher(url: str, parts: int, locked: bool, results: Any, go: Any, end: Any) -> None:
    """Rewrite the cached value, part by part, under the write lock, until the end."""
    client = redis.Redis.from_url(url)
    writer = DistReadWriteLock(LOCK_NAME, client=client).write_lock()
    end_at = _start_together(results, go, end)
    version = 0
    readers_seen = 0  # readers found reading while the refresher was writing
    while time.monotonic() < end_at:
        with writer if locked else _nolock():
            version += 1
            readers_seen = max(readers_seen, int(client.get(INSIDE_KEY) or 0))
            for i in range(parts):
                client.set(PART_KEY.format(i), f"{version}:payload-{i}-of-version-{version}")
                time.sleep(0.002)  # a slow refresh: the value is half-written in between
        time.sleep(0.05)  # readers get their turn
    results.put({"role": "refresher", "refreshes": version, "readers_seen": readers_seen})


def reader(url: str, index: int, parts: int, locked: bool, results: Any, go: Any, end: Any) -> None:
    """Read every part under the read lock until the end; count reads that mix versions."""
    client = redis.Redis.from_url(url)
    shared = DistReadWriteLock(LOCK_NAME, client=client).read_lock()
    end_at = _start_together(results, go, end)
    reads = torn = together = 0
    seen = set()
    while time.monotonic() < end_at:
        with shared if locked else _nolock():
            together = max(together, int(client.incr(INSIDE_KEY)))
            values = []
            for i in range(parts):
                values.append(client.get(PART_KEY.format(i)))
                time.sleep(0.0005)
            client.decr(INSIDE_KEY)
        versions = {v.split(b":", 1)[0] for v in values if v is not None}
        if len(versions) > 1 or (versions and None in values):
            torn += 1
        reads += 1
        seen |= versions
        time.sleep(0.001)
    results.put({"role": "reader", "index": index, "reads": reads, "torn": torn,
                 "versions": len(seen), "together": together})


def run(url: str, readers: int, seconds: float, parts: int, locked: bool) -> int:
    client = redis.Redis.from_url(url)
    for i in range(parts):
        client.set(PART_KEY.format(i), f"0:initial-{i}")
    client.set(INSIDE_KEY, 0)
    ctx = multiprocessing.get_context("spawn")
    results, go, end = ctx.Queue(), ctx.Event(), ctx.Value("d", 0.0)
    procs = [ctx.Process(target=refresher, args=(url, parts, locked, results, go, end), daemon=True)]
    procs += [ctx.Process(target=reader, args=(url, i + 1, parts, locked, results, go, end), daemon=True)
              for i in range(readers)]
    reports: List[Dict[str, Any]] = []
    try:
        for proc in procs:
            proc.start()
        for _ in procs:  # every process started (spawned interpreters take a moment)
            results.get(timeout=60)
        end.value = time.monotonic() + seconds
        go.set()
        for _ in procs:
            reports.append(results.get(timeout=seconds + 60))
        for proc in procs:
            proc.join(timeout=30)
    finally:
        for proc in procs:
            if proc.is_alive():
                proc.kill()
                proc.join(timeout=10)
        client.delete(INSIDE_KEY, *[PART_KEY.format(i) for i in range(parts)])
        client.close()

    for r in reports:
        if r["role"] == "refresher":
            print(f"refresher: {r['refreshes']} refreshes, each rewriting {parts} keys one by one; "
                  f"readers reading meanwhile: at most {r['readers_seen']}")
    together = max(r["together"] for r in reports if r["role"] == "reader")
    total_reads = total_torn = 0
    for r in sorted((r for r in reports if r["role"] == "reader"), key=lambda r: r["index"]):
        print(f"reader {r['index']}: {r['reads']} reads, {r['versions']} versions seen, "
              f"{r['torn']} torn")
        total_reads += r["reads"]
        total_torn += r["torn"]
    print(f"readers reading side by side: up to {together} at once")
    if total_torn == 0:
        print(f"total: {total_reads} reads, 0 torn: no reader ever saw a half-written value")
        return 0
    print(f"total: {total_reads} reads, {total_torn} torn: readers saw half-written values"
          + ("" if locked else " (as expected without the lock)"))
    return 1


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--url", help="a Redis to use (default: start a private redis-server)")
    parser.add_argument("--readers", type=int, default=3, help="reader processes (3)")
    parser.add_argument("--seconds", type=float, default=4.0, help="how long to run (4)")
    parser.add_argument("--parts", type=int, default=5, help="keys the cached value spans (5)")
    parser.add_argument("--unlocked", action="store_true",
                        help="run without the lock, to see torn reads happen")
    args = parser.parse_args(argv)
    if args.readers < 1 or args.parts < 2 or not 0 < args.seconds <= 600:
        parser.error("need --readers >= 1, --parts >= 2 and 0 < --seconds <= 600")
    mode = "no lock" if args.unlocked else "read/write lock"
    if args.url:
        print(f"torn_reads: {args.url}, {args.readers} readers, 1 refresher, {args.parts} parts, "
              f"{args.seconds:g} s, {mode}")
        return run(args.url, args.readers, args.seconds, args.parts, not args.unlocked)
    with RedisServer() as server:
        print(f"torn_reads: private redis-server at {server.url}, {args.readers} readers, "
              f"1 refresher, {args.parts} parts, {args.seconds:g} s, {mode}")
        return run(server.url, args.readers, args.seconds, args.parts, not args.unlocked)


if __name__ == "__main__":
    sys.exit(main())
