#!/usr/bin/env python
"""The cost of one ``distlock top`` refresh against many held names, on a private server.

Holds ``--names`` DistLocks (10,000 by default, explicit 10-minute leases, all taken by this
process through the real scripts), gives ``--waited`` of them a registered waiting process
(the real ``lock_acquire`` in its waiting mode, with a wake-up channel nobody listens on), then
times ``--refreshes`` refreshes of each kind and counts, from ``INFO commandstats``, the
commands they sent and the server's time spent on them:

- ``screen``: what the live view does on a 50-line terminal (46 rows): SCAN the keyspace,
  read every primitive that may be waited on (at most ``READ_BUDGET``, 2000), and the first
  others by name up to 46 rows;
- ``all rows``: what ``distlock top --once --json`` does: SCAN, then read every primitive.

Usage::

    python benchmarks/bench_top.py [--names N] [--waited W] [--refreshes R] [--json out.json]

The wall time of a refresh is this process' (redis-py on one core: the parsing dominates); the
server time is the ``usec`` of the commands in ``INFO commandstats``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any, Dict, List, Optional

if __package__ in (None, ""):  # run as a script: make ``benchmarks`` and ``distlock`` importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import _common as C  # noqa: E402
from benchmarks._internals import Keys, session_for, settings, top
from distlock import DistLock

SCREEN_ROWS = 46


def command_usage(client: Any) -> Dict[str, Dict[str, int]]:
    """calls and usec per command since the server started (INFO commandstats)."""
    stats = client.info("commandstats")
    return {key[len("cmdstat_"):]: {"calls": int(v["calls"]), "usec": int(v["usec"])}
            for key, v in stats.items() if key.startswith("cmdstat_")}


def usage_delta(before: Dict[str, Dict[str, int]],
                after: Dict[str, Dict[str, int]]) -> Dict[str, Dict[str, int]]:
    out = {}
    for cmd, now in after.items():
        if cmd == "info":
            continue
        was = before.get(cmd, {"calls": 0, "usec": 0})
        calls = now["calls"] - was["calls"]
        if calls > 0:
            out[cmd] = {"calls": calls, "usec": now["usec"] - was["usec"]}
    return out


def hold_names(client: Any, n: int) -> List[DistLock]:
    locks = []
    for i in range(n):
        lock = DistLock(f"bench:top:{i:05d}", client=client, lease=600)
        if not lock.acquire(blocking=False):
            raise RuntimeError(f"could not take {lock.name}")
        locks.append(lock)
    return locks


def register_waiters(client: Any, locks: List[DistLock]) -> None:
    """One waiting process per lock, as the waiting path records it (a queued try that fails)."""
    session = session_for(client)
    prefix = settings().prefix
    for i, lock in enumerate(locks):
        keys = Keys(prefix, lock.name)
        reply = session.run("lock_acquire", (keys.lock, keys.fence, keys.queue),
                            (f"bench-waiter:{i:012x}", 30_000, 3_630_000, "bench-host:1", "w", 1,
                             keys.waiter_channel("bench-waiter"), 600_000))
        if int(reply) > 0:
            raise RuntimeError(f"the waiter took {lock.name}")


def measure(client: Any, url: str, limit: Optional[int], refreshes: int) -> Dict[str, Any]:
    budget = top.READ_BUDGET if limit is not None else None  # the live view's cap; none for --once
    top.snapshot(client, url, limit, budget)  # warm-up
    walls: List[float] = []
    before = command_usage(client)
    last = None
    for _ in range(refreshes):
        t0 = time.perf_counter()
        last = top.snapshot(client, url, limit, budget)
        walls.append((time.perf_counter() - t0) * 1000)
    delta = usage_delta(before, command_usage(client))
    assert last is not None
    calls = {cmd: d["calls"] / refreshes for cmd, d in delta.items()}
    return {
        "wall_ms": C.median(walls), "wall_p90_ms": C.percentile(walls, 90),
        "commands": sum(calls.values()), "by_command": calls,
        "server_ms": sum(d["usec"] for d in delta.values()) / refreshes / 1000,
        "rows": len(last.rows), "keys": last.keys_scanned, "scans": last.scan_calls,
        "self_reported": last.commands,
    }


def main(argv: List[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--names", type=int, default=10_000, help="held DistLocks (10000)")
    parser.add_argument("--waited", type=int, default=100,
                        help="of which this many have a waiting process (100)")
    parser.add_argument("--refreshes", type=int, default=10, help="refreshes timed per kind (10)")
    parser.add_argument("--json", help="also write the rows here")
    args = parser.parse_args(argv)
    server = C.start_server()
    try:
        client = C.connect(server.url)
        t0 = time.monotonic()
        locks = hold_names(client, args.names)
        register_waiters(client, locks[:args.waited])
        C.eprint(f"{args.names} names held, {args.waited} waited on, "
                 f"in {time.monotonic() - t0:.1f} s; {client.dbsize()} keys")
        rows = []
        for label, limit in (("live view, 46 rows", SCREEN_ROWS), ("all rows (--once --json)", None)):
            C.eprint(f"timing {label}: {args.refreshes} refreshes")
            m = measure(client, server.url, limit, args.refreshes)
            by = ", ".join(f"{cmd} {n:g}" for cmd, n in sorted(m["by_command"].items(),
                                                               key=lambda kv: -kv[1]))
            note = f"{args.names} held, {args.waited} waited; {m['keys']} keys, {m['rows']} rows"
            rows += [
                C.Row("top refresh: wall time (median)", label, m["wall_ms"], "ms", note=note,
                      data=m),
                C.Row("top refresh: server time", label, m["server_ms"], "ms",
                      note="usec of its commands, INFO commandstats"),
                C.Row("top refresh: commands", label, m["commands"], "commands", note=by),
            ]
        print(C.format_table(rows))
        if args.json:
            C.write_json(args.json, {"names": args.names, "waited": args.waited,
                                     "refreshes": args.refreshes, **C.server_meta(client)}, rows)
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
