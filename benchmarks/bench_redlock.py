#!/usr/bin/env python
"""Redlock (``client=[...]``) on 3 and 5 masters against one standalone server, in one run.

Against one freshly started private redis-server and five more (the masters), all on this
machine, in interleaved rounds (``_common.interleaved``):

- uncontended: DistLock acquire + release on the single server, on a quorum of 3 masters and on
  a quorum of 5, each as a ratio to the floor (two EVALSHA of ``return 1`` on the single server)
  of the same rounds; beside them, as the figure a Redlock that asked its masters one after
  another could not beat, that floor done on each of the 5 masters in turn ("5 masters in
  turn"). Redlock on 5 costing about the floor, not five floors, is what "the masters are asked
  concurrently" means;
- round trips: socket writes per acquire + release (counted in this process by wrapping
  redis-py's ``send_packed_command``), and how many of them were waited on one after another
  (one per fan-out: the writes of one fan-out all go out before any reply is read).

The masters have been up for one lease before anything is measured: a master up for less
than a try's lease does not vote (docs/guides/redlock.rst).

Usage::

    python benchmarks/bench_redlock.py [--quick] [--json out.json] [figure ...]

- asyncio: the same uncontended figure in the asyncio shell (``distlock.asyncio.DistLock`` on
  ``redis.asyncio`` clients), in interleaved rounds inside one event loop, against the floor of
  two EVALSHA of ``return 1`` on an asyncio client of the single server.

Figures: uncontended, roundtrips, asyncio (default: all).
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Dict, List, Optional

if __package__ in (None, ""):  # run as a script: make ``benchmarks`` and ``distlock`` importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import redis  # noqa: E402

from benchmarks import _common as C  # noqa: E402
from distlock import DistLock, configure  # noqa: E402
from distlock._server import RedisServer  # noqa: E402

FIGURES = ("uncontended", "roundtrips", "asyncio")

#: the watchdog lease of the run (seconds): the masters must have been up that long
LEASE = 2.0


@dataclass(frozen=True)
class Knobs:
    rounds: int
    ops: int


FULL = Knobs(rounds=30, ops=200)
QUICK = Knobs(rounds=3, ops=20)


def uncontended(client: Any, masters: List[redis.Redis], knobs: Knobs) -> List[C.Row]:
    script = client.register_script("return 1")
    on_masters = [m.register_script("return 1") for m in masters]

    def floor() -> None:
        script()
        script()

    def in_turn() -> None:
        for s in on_masters:
            s()
        for s in on_masters:
            s()

    single = DistLock("bench:redlock:single", client=client)
    three = DistLock("bench:redlock:three", client=masters[:3])
    five = DistLock("bench:redlock:five", client=masters)
    ops = {"floor": floor, "DistLock, one server": C.cycle(single.acquire, single.release),
           "DistLock, Redlock on 3 masters": C.cycle(three.acquire, three.release),
           "DistLock, Redlock on 5 masters": C.cycle(five.acquire, five.release),
           "floor, 5 masters in turn": in_turn}
    per_round = C.interleaved(ops, rounds=knobs.rounds, per_round=knobs.ops)
    ratios = C.per_round_ratios(per_round, "floor")
    rows = []
    for label in ops:
        rows.append(C.Row("uncontended acquire+release", label, C.median(per_round[label]), "µs/op",
                          C.median(ratios[label]),
                          note="two EVALSHA of 'return 1'" if label == "floor" else
                          "the floor on each master, one after another" if "in turn" in label else ""))
    return rows


def roundtrips(client: Any, masters: List[redis.Redis], knobs: Knobs) -> List[C.Row]:
    """Socket writes per acquire + release, and the number of fan-outs (rounds of replies)."""
    writes = [0]
    original = redis.connection.Connection.send_packed_command

    def counting(self: Any, command: Any, check_health: bool = True) -> None:
        writes[0] += 1
        original(self, command, check_health)

    rows = []
    for label, target in (("one server", client), ("Redlock on 3 masters", masters[:3]),
                          ("Redlock on 5 masters", masters)):
        lock = DistLock(f"bench:redlock:rt:{label}", client=target)
        lock.acquire()
        lock.release()  # connections made, scripts loaded
        executor = lock._session().executor
        fanouts = [0]
        fanout = getattr(executor, "fanout", None)
        if fanout is not None:
            def counted(*args: Any, _f: Any = fanout, _n: List[int] = fanouts, **kwargs: Any) -> Any:
                _n[0] += 1
                return _f(*args, **kwargs)
            executor.fanout = counted
        n = knobs.ops
        redis.connection.Connection.send_packed_command = counting  # type: ignore[method-assign]
        try:
            writes[0] = 0
            for _ in range(n):
                lock.acquire()
                lock.release()
        finally:
            redis.connection.Connection.send_packed_command = original  # type: ignore[method-assign]
            if fanout is not None:
                del executor.fanout
        waited = fanouts[0] / n if fanout is not None else writes[0] / n
        rows.append(C.Row("round trips per acquire+release", f"DistLock, {label}", waited, "waited",
                          note=f"{writes[0] / n:.1f} socket writes; the writes of one fan-out go out "
                               "before any reply is read" if fanout is not None else
                               f"{writes[0] / n:.1f} socket writes"))
    return rows


def asyncio_figure(url: str, servers: List[RedisServer], knobs: Knobs) -> List[C.Row]:
    import asyncio

    import redis.asyncio as aredis

    import distlock.asyncio as aio

    async def main() -> Dict[str, List[float]]:
        single = aredis.Redis.from_url(url)
        masters = [aredis.Redis.from_url(s.url) for s in servers]
        script = single.register_script("return 1")

        async def floor() -> None:
            await script()
            await script()

        def cycle(lock: Any) -> Callable[[], Awaitable[None]]:
            async def op() -> None:
                await lock.acquire()
                await lock.release()
            return op

        ops = {"floor": floor,
               "asyncio DistLock, one server": cycle(aio.DistLock("bench:redlock:aio1", client=single)),
               "asyncio DistLock, Redlock on 3 masters": cycle(aio.DistLock("bench:redlock:aio3",
                                                                            client=masters[:3])),
               "asyncio DistLock, Redlock on 5 masters": cycle(aio.DistLock("bench:redlock:aio5",
                                                                            client=masters))}
        out: Dict[str, List[float]] = {name: [] for name in ops}
        try:
            for op in ops.values():
                for _ in range(20):
                    await op()
            for rnd in range(knobs.rounds):
                for name in C.round_robin(list(ops), rnd):
                    t0 = time.perf_counter()
                    for _ in range(knobs.ops):
                        await ops[name]()
                    out[name].append((time.perf_counter() - t0) / knobs.ops * 1e6)
        finally:
            await asyncio.sleep(0.5)  # distlock's reader tasks end
            for c in [single, *masters]:
                await c.aclose()
        return out

    per_round = asyncio.run(main())
    ratios = C.per_round_ratios(per_round, "floor")
    return [C.Row("uncontended acquire+release, asyncio", label, C.median(per_round[label]), "µs/op",
                  C.median(ratios[label]), note="two EVALSHA of 'return 1'" if label == "floor" else "")
            for label in per_round]


def _run(client: Any, url: str, knobs: Knobs, figures: List[str]) -> List[C.Row]:
    configure(lease=LEASE, renew_interval=LEASE / 4)
    C.eprint("starting 5 masters")
    servers = [RedisServer(die_with_parent=True) for _ in range(5)]
    masters = [redis.Redis.from_url(s.url) for s in servers]
    try:
        time.sleep(LEASE + 1.0)  # a master up for less than one lease does not vote
        rows: List[C.Row] = []
        if "uncontended" in figures:
            C.eprint(f"uncontended: {knobs.rounds} rounds x {knobs.ops} ops, round-robin")
            rows += uncontended(client, masters, knobs)
        if "roundtrips" in figures:
            C.eprint("roundtrips")
            rows += roundtrips(client, masters, knobs)
        if "asyncio" in figures:
            C.eprint(f"asyncio: {knobs.rounds} rounds x {knobs.ops} ops, round-robin")
            rows += asyncio_figure(url, servers, knobs)
        return rows
    finally:
        from distlock._session import reset_sessions
        reset_sessions()
        for m in masters:
            m.close()
        for s in servers:
            s.stop()


def main(argv: Optional[List[str]] = None) -> int:
    return C.bench_main(argv, doc=__doc__, title="distlock Redlock", figures=FIGURES,
                        full=FULL, quick=QUICK, options=[], run=_run)


if __name__ == "__main__":
    sys.exit(main())

