#!/usr/bin/env python
"""A bounded producer/consumer queue shared by processes: two DistConditions on one DistRLock.

The queue is a Redis list that never holds more than ``--capacity`` items. Producer processes
put items in; consumer processes take them out. Both sides hold one DistRLock while they look
at the list, and wait on a DistCondition tied to that lock, exactly as the same program would
with ``threading``:

- a producer that finds the queue full waits on ``not_full``; a consumer that took an item
  notifies ``not_full``;
- a consumer that finds the queue empty waits on ``not_empty``; a producer that put an item
  notifies ``not_empty``.

When every producer is done, the main process puts one STOP item per consumer, the same way.
Each consumer reports what it took; the program checks that every item was consumed exactly
once and that the queue never held more than its capacity.

Run it::

    python docs/examples/bounded_queue.py              # starts its own private redis-server
    python docs/examples/bounded_queue.py --url redis://127.0.0.1:6380/0

Options: ``--producers N`` (3), ``--consumers N`` (3), ``--items N`` per producer (40),
``--capacity N`` (4). The exit status is 0 when every item was consumed exactly once, 1
otherwise.
"""

from __future__ import annotations

import argparse
import collections
import multiprocessing
import os
import sys
import time
from typing import Any, Dict, List, Optional, Tuple

import redis

if __package__ in (None, ""):  # run from a source checkout: make ``distlock`` importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from distlock import DistCondition, DistRLock
from distlock.testing.server import RedisServer

LOCK_NAME = "example:queue"
QUEUE_KEY = "example:queue:items"
HIGH_KEY = "example:queue:high-water"  # the longest the list ever was, seen under the lock
STOP = "STOP"
WAIT_LIMIT = 60.0  # no wait here is unbounded: a bug ends the run instead of hanging it


def shared(client: redis.Redis[Any]) -> Tuple[DistRLock, DistCondition, DistCondition]:
    """The lock and its two conditions, as every process makes them."""
    lock = DistRLock(LOCK_NAME, client=client)
    return lock, DistCondition("not-full", lock), DistCondition("not-empty", lock)


def put(client: redis.Redis[Any], capacity: int, item: str) -> None:
    """Append ``item``, waiting while the queue is full."""
    lock, not_full, not_empty = shared(client)
    with lock:
        if not not_full.wait_for(lambda: client.llen(QUEUE_KEY) < capacity, timeout=WAIT_LIMIT):
            raise SystemExit(f"put({item!r}): the queue stayed full for {WAIT_LIMIT:g} s")
        length = client.rpush(QUEUE_KEY, item)
        if length > int(client.get(HIGH_KEY) or 0):
            client.set(HIGH_KEY, length)
        not_empty.notify()  # one item: one consumer


def producer(url: str, index: int, items: int, capacity: int) -> int:
    client = redis.Redis.from_url(url)
    for k in range(items):
        put(client, capacity, f"p{index}-{k}")
    client.close()
    return items


def stopper(url: str, capacity: int, stops: int) -> int:
    """Put one STOP per consumer, like any item (after every producer is done)."""
    client = redis.Redis.from_url(url)
    for _ in range(stops):
        put(client, capacity, STOP)
    client.close()
    return stops


def consumer(url: str, index: int) -> List[str]:
    """Take items until a STOP; return what was taken, in order."""
    client = redis.Redis.from_url(url)
    lock, not_full, not_empty = shared(client)
    taken: List[str] = []
    while True:
        with lock:
            if not not_empty.wait_for(lambda: client.llen(QUEUE_KEY) > 0, timeout=WAIT_LIMIT):
                raise SystemExit(f"consumer {index}: the queue stayed empty for {WAIT_LIMIT:g} s")
            item = client.lpop(QUEUE_KEY).decode()
            not_full.notify()  # one free slot: one producer
        if item == STOP:
            break
        taken.append(item)
    client.close()
    return taken


def run(url: str, producers: int, consumers: int, items: int, capacity: int) -> int:
    client = redis.Redis.from_url(url)
    client.delete(QUEUE_KEY, HIGH_KEY)
    ctx = multiprocessing.get_context("spawn")
    started = time.monotonic()
    with ctx.Pool(producers + consumers) as pool:
        eaten = [pool.apply_async(consumer, (url, i + 1)) for i in range(consumers)]
        made = [pool.apply_async(producer, (url, i + 1, items, capacity)) for i in range(producers)]
        produced = sum(result.get(timeout=600) for result in made)
        pool.apply_async(stopper, (url, capacity, consumers)).get(timeout=600)
        takes: Dict[int, List[str]] = {i + 1: r.get(timeout=600) for i, r in enumerate(eaten)}
    elapsed = time.monotonic() - started
    high = int(client.get(HIGH_KEY) or 0)
    left = client.llen(QUEUE_KEY)
    client.delete(QUEUE_KEY, HIGH_KEY)
    client.close()

    counts = collections.Counter(item for took in takes.values() for item in took)
    expected = {f"p{i + 1}-{k}" for i in range(producers) for k in range(items)}
    missing = expected - set(counts)
    twice = sorted(item for item, n in counts.items() if n > 1)
    strange = sorted(set(counts) - expected)
    for index, took in takes.items():
        print(f"consumer {index}: took {len(took)} items")
    print(f"{producers} producers put {produced} items through a queue of capacity {capacity} "
          f"in {elapsed:.1f} s; the queue held at most {high}")
    ok = not missing and not twice and not strange and high <= capacity and left == 0
    if ok:
        print(f"every item was consumed exactly once ({sum(counts.values())} of {len(expected)})")
        return 0
    print(f"FAILED: {len(missing)} never consumed, {len(twice)} consumed twice, {len(strange)} unknown, "
          f"{left} left in the queue, high-water {high} (capacity {capacity})")
    return 1


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--url", help="a Redis to use (default: start a private redis-server)")
    parser.add_argument("--producers", type=int, default=3, help="producer processes (3)")
    parser.add_argument("--consumers", type=int, default=3, help="consumer processes (3)")
    parser.add_argument("--items", type=int, default=40, help="items per producer (40)")
    parser.add_argument("--capacity", type=int, default=4, help="most items the queue holds (4)")
    args = parser.parse_args(argv)
    if args.producers < 1 or args.consumers < 1 or args.items < 1 or args.capacity < 1:
        parser.error("--producers, --consumers, --items and --capacity must be at least 1")
    if args.producers + args.consumers > 32 or args.items > 10000:
        parser.error("at most 32 processes and 10000 items per producer")
    shape = (f"{args.producers} producers, {args.consumers} consumers, {args.items} items each, "
             f"capacity {args.capacity}")
    if args.url:
        print(f"bounded_queue: {args.url}, {shape}")
        return run(args.url, args.producers, args.consumers, args.items, args.capacity)
    with RedisServer() as server:
        print(f"bounded_queue: private redis-server at {server.url}, {shape}")
        return run(server.url, args.producers, args.consumers, args.items, args.capacity)


if __name__ == "__main__":
    sys.exit(main())
