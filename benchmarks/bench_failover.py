#!/usr/bin/env python
"""What failover safety costs: ``min_replicas`` and Redlock, against the single-server floor.

One run, on the benchmark's own servers (all on free 127.0.0.1 ports, all stopped at the end):
one standalone server, a master with two replicas, and five independent masters for Redlock.
Figures:

- uncontended: acquire + release, timed in the same interleaved rounds
  (``_common.interleaved``) as the floor, two EVALSHA of ``return 1`` on the standalone server,
  and reported as a ratio to it:

  - ``DistLock`` on the standalone server;
  - ``DistLock`` and ``DistRLock`` with ``min_replicas=0`` (no WAIT is sent: the plain lock),
    ``1`` and ``2`` on the master with two replicas: each grant's script goes with ``WAIT k``
    in the same write, and counts once k replicas acknowledged it;
  - ``DistLock`` on a Redlock list of 3 and of 5 independent masters: each grant and release
    goes to every master at once and needs a majority; beside them, as the figure a Redlock
    that asked its masters one after another could not beat, the floor done on each of the 5
    masters in turn;

- roundtrips: socket writes per acquire + release (counted in this process by wrapping
  redis-py's ``send_packed_command``), and how many of them were waited for one after another
  (one per fan-out: the writes of one fan-out all go out before any reply is read);
- asyncio: the uncontended figure in the asyncio shell (``distlock.asyncio.DistLock`` on
  ``redis.asyncio`` clients, one server and Redlock on 3 and 5 masters), in interleaved rounds
  inside one event loop, against two EVALSHA of ``return 1`` on an asyncio client.

Replicas and masters on one host answer over loopback and share its cores: the figures show
the work, not a network's latency. The run's watchdog lease is ``LEASE`` (2 s), and the Redlock
masters have been up that long before anything is timed: a master up for less than a try's
lease does not vote (docs/guides/redlock.rst).

Usage::

    python benchmarks/bench_failover.py [--quick] [--json out.json] [--rounds N] [--ops N] [figure ...]

Figures: uncontended, roundtrips, asyncio (default: all). The table goes to stdout, progress
to stderr. ``--quick`` is a smoke run whose numbers mean little.
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
from benchmarks._internals import RedisServer
from distlock import DistLock, DistRLock, configure

FIGURES = ("uncontended", "roundtrips", "asyncio")

#: the watchdog lease of the run (seconds): the Redlock masters must have been up that long
LEASE = 2.0


@dataclass(frozen=True)
class Knobs:
    rounds: int = 30
    ops: int = 200
    max_s: float = 180.0


FULL = Knobs()
QUICK = Knobs(rounds=3, ops=20, max_s=10.0)


@dataclass
class Servers:
    """The run's servers besides ``bench_main``'s standalone one."""

    master: Any  # a client of the master that has two replicas
    masters: List[Any]  # a client per independent master
    urls: List[str]  # the independent masters' URLs


def _replicas(url: str, master_port: int) -> List[RedisServer]:
    """Two replicas of the master, linked and acknowledging a write (WAIT 2) before return."""
    made: List[RedisServer] = []
    try:
        for _ in range(2):
            made.append(RedisServer(extra_args=["--replicaof", "127.0.0.1", str(master_port),
                                                "--repl-diskless-sync", "yes"], die_with_parent=True))
        probe = C.connect(url, socket_timeout=5)
        try:
            deadline = time.monotonic() + 30
            while True:
                probe.set("bench:probe", "1")
                if int(probe.execute_command("WAIT", 2, 100)) == 2:
                    break
                if time.monotonic() > deadline:
                    raise TimeoutError("the replicas never acknowledged a write")
                time.sleep(0.05)
            probe.delete("bench:probe")
        finally:
            probe.close()
    except BaseException:
        for server in made:
            server.stop()
        raise
    return made


def _rows(figure: str, per_round: Dict[str, List[float]], k: Knobs, notes: Dict[str, str]) -> List[C.Row]:
    """One row per candidate: its median µs per op, and the median of its per-round ratios to
    the floor of the same rounds."""
    vs_floor = C.per_round_ratios(per_round, "floor")
    n = len(per_round["floor"])
    rows = []
    for label, values in per_round.items():
        note = notes.get(label, "")
        if label == "floor":
            note = f"{note}; median of {n} rounds x {k.ops}"
        else:
            note = (f"{note}; " if note else "") + (f"ratio IQR {C.percentile(vs_floor[label], 25):.2f}-"
                                                   f"{C.percentile(vs_floor[label], 75):.2f}")
        rows.append(C.Row(figure, label, C.median(values), "µs/op", C.median(vs_floor[label]), note=note,
                          data={"per_round_us": values, "per_round_vs_floor": vs_floor[label]}))
    return rows


def uncontended(client: Any, servers: Servers, k: Knobs) -> List[C.Row]:
    script = client.register_script("return 1")
    on_masters = [m.register_script("return 1") for m in servers.masters]

    def floor() -> None:
        script()
        script()

    def in_turn() -> None:
        for s in on_masters:
            s()
        for s in on_masters:
            s()

    def cycle(lock: Any) -> Callable[[], None]:
        return C.cycle(lock.acquire, lock.release)

    ops: Dict[str, Callable[[], object]] = {
        "floor": floor, "DistLock, one server": cycle(DistLock("bench:fo:single", client=client))}
    for kind in (DistLock, DistRLock):
        for n in (0, 1, 2):
            lock = kind(f"bench:fo:{kind.__name__}:{n}", client=servers.master, min_replicas=n)
            ops[f"{kind.__name__} min_replicas={n}"] = cycle(lock)
    for n in (3, 5):
        ops[f"DistLock, Redlock on {n} masters"] = cycle(
            DistLock(f"bench:fo:redlock{n}", client=servers.masters[:n]))
    ops["floor, 5 masters in turn"] = in_turn
    C.eprint(f"uncontended: {k.rounds} rounds x {k.ops} ops x {len(ops)} candidates, round-robin")
    with C.pinned(client) as pin:
        per_round = C.interleaved(ops, rounds=k.rounds, per_round=k.ops, max_seconds=k.max_s)
    notes = {"floor": f"2 x EVALSHA 'return 1' on the standalone server; {pin}",
             "floor, 5 masters in turn": "the floor on each master, one after another"}
    for n in (0, 1, 2):
        notes[f"DistLock min_replicas={n}"] = "on the master with two replicas"
    return _rows("uncontended acquire+release", per_round, k, notes)


def roundtrips(client: Any, servers: Servers, k: Knobs) -> List[C.Row]:
    """Socket writes per acquire + release, and the number of fan-outs (rounds of replies)."""
    writes = [0]
    original = redis.connection.Connection.send_packed_command

    def counting(self: Any, command: Any, check_health: bool = True) -> None:
        writes[0] += 1
        original(self, command, check_health)

    rows = []
    for label, target, options in (("one server", client, {}),
                                   ("min_replicas=2", servers.master, {"min_replicas": 2}),
                                   ("Redlock on 3 masters", servers.masters[:3], {}),
                                   ("Redlock on 5 masters", servers.masters, {})):
        lock = DistLock(f"bench:fo:rt:{label}", client=target, **options)
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
        n = k.ops
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


def asyncio_figure(url: str, servers: Servers, k: Knobs) -> List[C.Row]:
    import asyncio

    import redis.asyncio as aredis

    import distlock.asyncio as aio

    async def main() -> Dict[str, List[float]]:
        single = aredis.Redis.from_url(url)
        masters = [aredis.Redis.from_url(u) for u in servers.urls]
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
               "asyncio DistLock, one server": cycle(aio.DistLock("bench:fo:aio1", client=single)),
               "asyncio DistLock, Redlock on 3 masters": cycle(aio.DistLock("bench:fo:aio3",
                                                                            client=masters[:3])),
               "asyncio DistLock, Redlock on 5 masters": cycle(aio.DistLock("bench:fo:aio5",
                                                                            client=masters))}
        out: Dict[str, List[float]] = {name: [] for name in ops}
        started = time.monotonic()
        try:
            for op in ops.values():
                for _ in range(20):
                    await op()
            for rnd in range(k.rounds):
                for name in C.round_robin(list(ops), rnd):
                    t0 = time.perf_counter()
                    for _ in range(k.ops):
                        await ops[name]()
                    out[name].append((time.perf_counter() - t0) / k.ops * 1e6)
                if rnd >= 2 and time.monotonic() - started > k.max_s:
                    break
        finally:
            await asyncio.sleep(0.5)  # distlock's reader tasks end
            for c in [single, *masters]:
                await c.aclose()
        return out

    per_round = asyncio.run(main())
    return _rows("uncontended acquire+release, asyncio", per_round, k,
                 {"floor": "2 x EVALSHA 'return 1' through redis.asyncio"})


def _run(client: Any, url: str, knobs: Knobs, figures: List[str]) -> List[C.Row]:
    configure(lease=LEASE, renew_interval=LEASE / 4)
    C.eprint("starting a master with two replicas, and 5 independent masters")
    made: List[RedisServer] = []
    clients: List[Any] = []
    try:
        master = RedisServer(die_with_parent=True)
        made.append(master)
        made += _replicas(master.url, master.port)
        independent = [RedisServer(die_with_parent=True) for _ in range(5)]
        made += independent
        clients += [C.connect(master.url)] + [C.connect(s.url) for s in independent]
        servers = Servers(clients[0], clients[1:], [s.url for s in independent])
        # a master up for less than one lease does not vote: wait from the last one's start
        # (not the run's: starting eight servers on a loaded machine took seconds) and a second
        # more, which INFO's whole-second uptime may round away
        time.sleep(LEASE + 1.0)
        rows: List[C.Row] = []
        if "uncontended" in figures:
            rows += uncontended(client, servers, knobs)
        if "roundtrips" in figures:
            C.eprint("roundtrips")
            rows += roundtrips(client, servers, knobs)
        if "asyncio" in figures:
            C.eprint(f"asyncio: {knobs.rounds} rounds x {knobs.ops} ops, round-robin")
            rows += asyncio_figure(url, servers, knobs)
        return rows
    finally:
        from benchmarks._internals import reset_sessions
        reset_sessions()
        for c in clients:
            c.close()
        for s in made:
            s.stop()


def main(argv: Optional[List[str]] = None) -> int:
    return C.bench_main(
        argv, doc=__doc__, title="distlock failover safety", figures=FIGURES, full=FULL,
        quick=QUICK,
        options=(C.Option("--rounds", "rounds", int, 3, "rounds (default 30; quick 3)"),
                 C.Option("--ops", "ops", int, 1, "ops per candidate per round (200; quick 20)")),
        run=_run)


if __name__ == "__main__":
    sys.exit(main())
