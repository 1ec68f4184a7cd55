#!/usr/bin/env python
"""Uncontended acquire + release with ``min_replicas`` 0, 1 and 2, on a master with two replicas.

One private master (``redis-server`` on a free 127.0.0.1 port, or ``$DISTLOCK_SERVER_BIN``)
and two replicas of it (``--replicaof``), all on this machine, linked and acknowledging before
anything is timed. Candidates, timed in the same interleaved rounds (``_common.interleaved``):

- floor: two EVALSHA of ``return 1`` on the master (the single-server floor of the same run);
- DistLock with ``min_replicas=0`` (the default: nothing is waited for), ``1`` and ``2``
  (each grant's script goes with ``WAIT k`` in the same write, and returns once k replicas
  acknowledged it);
- the same for DistRLock.

Each figure is reported as µs per acquire + release and as a ratio to the floor of the same
rounds (median of the per-round ratios). Replicas on the same host acknowledge over loopback,
so the figures show the cost of the WAIT round on the server side, not of a network hop.

Usage::

    python benchmarks/bench_replicas.py [--quick] [--json out.json] [--rounds N] [--ops N]
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional

if __package__ in (None, ""):  # run as a script: make ``benchmarks`` and ``distlock`` importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import distlock  # noqa: E402
from benchmarks import _common as C  # noqa: E402
from distlock._server import RedisServer  # noqa: E402

FIGURES = ("uncontended",)


@dataclass(frozen=True)
class Knobs:
    rounds: int = 30
    ops: int = 200
    max_s: float = 120.0


FULL = Knobs()
QUICK = Knobs(rounds=3, ops=20, max_s=10.0)


def _replicas(url: str, master_port: int) -> List[RedisServer]:
    """Two replicas of the master, linked and acknowledging a write (WAIT 2) before return."""
    made: List[RedisServer] = []
    try:
        for _ in range(2):
            made.append(RedisServer(extra_args=["--replicaof", "127.0.0.1", str(master_port),
                                                "--repl-diskless-sync", "yes"]))
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


def uncontended(client: Any, url: str, k: Knobs) -> List[C.Row]:
    port = int(client.info("server")["tcp_port"])
    replicas = _replicas(url, port)
    try:
        script = client.register_script("return 1")

        def floor() -> None:
            script()
            script()

        ops: Dict[str, Callable[[], object]] = {"floor": floor}
        for kind in ("DistLock", "DistRLock"):
            for n in (0, 1, 2):
                lock = getattr(distlock, kind)(f"bench:replicas:{kind}:{n}", client=client,
                                               min_replicas=n)
                ops[f"{kind} min_replicas={n}"] = C.cycle(lock.acquire, lock.release)
        C.eprint(f"uncontended: {k.rounds} rounds x {k.ops} ops x {len(ops)} candidates, round-robin")
        with C.pinned(client) as pin:
            per_round = C.interleaved(ops, rounds=k.rounds, per_round=k.ops, max_seconds=k.max_s)
    finally:
        for server in replicas:
            server.stop()
    vs_floor = C.per_round_ratios(per_round, "floor")
    n = len(per_round["floor"])
    rows = [C.Row("floor", "2 x EVALSHA 'return 1' on the master", C.median(per_round["floor"]),
                  "µs/pair", 1.0, note=f"median of {n} rounds x {k.ops}; {pin}",
                  data={"per_round_us": per_round["floor"]})]
    for label, values in per_round.items():
        if label == "floor":
            continue
        ratio = C.median(vs_floor[label])
        rows.append(C.Row("uncontended acquire+release, master + 2 replicas", label,
                          C.median(values), "µs/op", ratio,
                          note=f"ratio IQR {C.percentile(vs_floor[label], 25):.2f}-"
                               f"{C.percentile(vs_floor[label], 75):.2f}",
                          data={"per_round_us": values, "per_round_vs_floor": vs_floor[label]}))
    return rows


def _run(client: Any, url: str, knobs: Knobs, figures: List[str]) -> List[C.Row]:
    return uncontended(client, url, knobs) if "uncontended" in figures else []


def main(argv: Optional[List[str]] = None) -> int:
    return C.bench_main(
        argv, doc=__doc__, title="distlock min_replicas benchmark", figures=FIGURES, full=FULL,
        quick=QUICK,
        options=(C.Option("--rounds", "rounds", int, 1, "rounds (default 30; quick 3)"),
                 C.Option("--ops", "ops", int, 1, "ops per candidate per round (200; quick 20)")),
        run=_run)


if __name__ == "__main__":
    sys.exit(main())
