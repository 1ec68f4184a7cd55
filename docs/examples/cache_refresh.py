#!/usr/bin/env python
"""Cache refresh on a dogpile.cache region: an expensive value, made once per expiry by all processes.

Several processes ask a dogpile.cache region for the same key, over and over. Its value is
expensive to make (the creator sleeps a little) and expires after a short time. The region is
on the ``distlock.redis`` backend, so the lock it takes to make a missing or expired value is a
DistLock, shared by every process: when the value expires, one process makes it anew while the
others go on with the old value (or, when there is none yet, wait for the new one). Each run of
the creator counts itself in Redis (INCR), and so does the number of creators running at the
same moment (INCR at the start, DECR at the end): two runs overlapped if it ever exceeded one.

Run it::

    python docs/examples/cache_refresh.py              # starts its own private redis-server
    python docs/examples/cache_refresh.py --url redis://127.0.0.1:6380/0

Options: ``--processes N`` (4), ``--seconds S`` (5), and ``--unlocked``, which configures the
region with ``distributed_lock=False`` (dogpile's in-process mutex): each process then makes
the value itself when it expires, side by side with the others. The exit status is 0 when no
two creations overlapped, 1 otherwise, and 2 when dogpile.cache is not installed (it comes with
the ``dogpile`` extra: ``pip install 'distlock-redis[dogpile]'``). See docs/guides/dogpile.rst.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import sys
import time
from typing import Any, Dict, List, Optional

import redis

if __package__ in (None, ""):  # run from a source checkout: make ``distlock`` importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from distlock.testing.server import RedisServer

try:
    from dogpile.cache import make_region, register_backend
    from dogpile.cache.api import NO_VALUE
    from dogpile.util.langhelpers import PluginLoader
except ImportError:  # checked in main(): exit status 2
    make_region = None  # type: ignore[assignment]

KEY = "example:cache:report"  # the region's key (dogpile stores its value under this name)
CREATIONS_KEY = "example:cache:creations"  # INCR by every run of the creator
CREATING_KEY = "example:cache:creating"  # how many creators are running right now
LOG_KEY = "example:cache:log"  # one JSON record per run of the creator
EXPIRATION = 1.0  # seconds: the region's expiration_time (when dogpile makes the value anew)
REDIS_EXPIRATION = 10  # seconds: redis_expiration_time (when Redis drops the stored value)
WORK = 0.2  # seconds: how long the creator takes


def make_cache_region(url: str, locked: bool) -> Any:
    """The region on the ``distlock.redis`` backend. Redis keeps a value longer than the region
    does (``redis_expiration_time``), so that an expired value is still there to serve while one
    process makes the new one."""
    arguments = {"url": url, "redis_expiration_time": REDIS_EXPIRATION, "distributed_lock": locked}
    try:
        return make_region().configure("distlock.redis", expiration_time=EXPIRATION,
                                       arguments=arguments)
    except PluginLoader.NotFound:  # a source checkout that pip did not install: no entry point
        register_backend("distlock.redis", "distlock.contrib.dogpile", "DistlockRedisBackend")
        return make_region().configure("distlock.redis", expiration_time=EXPIRATION,
                                       arguments=arguments)


def asker(url: str, index: int, locked: bool, results: Any, go: Any, end: Any) -> None:
    """Ask the region for the value until the end; report the gets and the values seen."""
    client = redis.Redis.from_url(url)
    region = make_cache_region(url, locked)

    def create() -> Dict[str, Any]:
        """The expensive part: it runs under the key's lock (with ``distributed_lock``)."""
        creating = int(client.incr(CREATING_KEY))  # > 1: another creator is running too
        started = time.time()
        number = int(client.incr(CREATIONS_KEY))
        # what it replaces: nothing, an expired value, or (a process that read the old value
        # just before another one stored the new value) a value that is fresh again
        old = region.get(KEY, ignore_expiration=True)
        if old is NO_VALUE:
            replaces = "missing"
        elif started - old["made"] < EXPIRATION:
            replaces = "fresh"
        else:
            replaces = f"#{old['number']}"
        time.sleep(WORK)
        made = time.time()
        client.decr(CREATING_KEY)
        client.rpush(LOG_KEY, json.dumps({"number": number, "process": index, "creating": creating,
                                          "replaces": replaces, "start": started, "end": made}))
        return {"number": number, "process": index, "made": made}

    results.put({"role": "ready"})
    if not go.wait(60):
        raise SystemExit("no start signal")
    end_at = float(end.value)
    gets = 0
    seen = set()
    while time.monotonic() < end_at:
        value = region.get_or_create(KEY, create)
        gets += 1
        seen.add(value["number"])
        time.sleep(0.005)
    results.put({"role": "asker", "index": index, "gets": gets, "seen": len(seen)})


def run(url: str, processes: int, seconds: float, locked: bool) -> int:
    client = redis.Redis.from_url(url)
    client.delete(KEY, CREATIONS_KEY, CREATING_KEY, LOG_KEY)
    ctx = multiprocessing.get_context("spawn")
    results, go, end = ctx.Queue(), ctx.Event(), ctx.Value("d", 0.0)
    procs = [ctx.Process(target=asker, args=(url, i + 1, locked, results, go, end), daemon=True)
             for i in range(processes)]
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
        creations = int(client.get(CREATIONS_KEY) or 0)
        log = [json.loads(r) for r in client.lrange(LOG_KEY, 0, -1)]
    finally:
        for proc in procs:
            if proc.is_alive():
                proc.kill()
                proc.join(timeout=10)
        client.delete(KEY, CREATIONS_KEY, CREATING_KEY, LOG_KEY)
        client.close()

    gets = 0
    for r in sorted(reports, key=lambda r: r["index"]):
        made_here = sum(1 for c in log if c["process"] == r["index"])
        print(f"process {r['index']}: {r['gets']} gets, {r['seen']} values seen, {made_here} made here")
        gets += r["gets"]
    # each missing or expired value that some creator replaced: the first miss and each expiry
    expiries = len({c["replaces"] for c in log if c["replaces"] != "fresh"})
    at_once = max((c["creating"] for c in log), default=0)
    overlapped = sum(1 for c in log if c["creating"] > 1)
    print(f"total: {gets} gets, {creations} creations, {expiries} misses or expiries, "
          f"at most {at_once} creation(s) at a time")
    fresh = sum(1 for c in log if c["replaces"] == "fresh")
    if fresh:
        print(f"{fresh} creation(s) replaced a value that another process had just made: their "
              f"process read the old value just before the new one was stored (dogpile checks "
              f"again, under the lock, only a value that was missing)")
    if overlapped == 0:
        print(f"no two creations overlapped: one creator at a time across all {processes} processes")
        return 0
    print(f"{overlapped} creation(s) ran while another was running"
          + ("" if locked else " (as expected without the distributed lock)"))
    return 1


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--url", help="a Redis to use (default: start a private redis-server)")
    parser.add_argument("--processes", type=int, default=4, help="processes asking for the value (4)")
    parser.add_argument("--seconds", type=float, default=5.0, help="how long to run (5)")
    parser.add_argument("--unlocked", action="store_true",
                        help="distributed_lock=False, to see concurrent creations happen")
    args = parser.parse_args(argv)
    if args.processes < 1 or not 0 < args.seconds <= 600:
        parser.error("need --processes >= 1 and 0 < --seconds <= 600")
    if make_region is None:
        print("cache_refresh: this example needs dogpile.cache, which comes with the dogpile "
              "extra: pip install 'distlock-redis[dogpile]'", file=sys.stderr)
        return 2
    mode = "dogpile's in-process mutex" if args.unlocked else "distributed lock (DistLock)"
    what = (f"{args.processes} processes, {args.seconds:g} s, value expires after "
            f"{EXPIRATION:g} s and takes {WORK:g} s to make, {mode}")
    if args.url:
        print(f"cache_refresh: {args.url}, {what}")
        return run(args.url, args.processes, args.seconds, not args.unlocked)
    with RedisServer() as server:
        print(f"cache_refresh: private redis-server at {server.url}, {what}")
        return run(server.url, args.processes, args.seconds, not args.unlocked)


if __name__ == "__main__":
    sys.exit(main())
