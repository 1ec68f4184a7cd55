#!/usr/bin/env python
"""What recording metrics costs the uncontended acquire + release, in one run.

With ``prometheus_client`` installed and a ``DistlockCollector`` registered (as a service that
exports the figures would have it), against one freshly started private redis-server:

- recording: the exact recording work of one DistLock acquire + release (the meter lookup,
  three clock reads, one ``acquired`` and one ``held``), timed alone in a tight loop, as a
  share of the acquire + release measured in the same run: the overhead, without noise from
  the network;
- on/off: DistLock acquire + release with recording on, and with a meter that records
  nothing (the calls stay, their work goes), in interleaved rounds, wall and client CPU time,
  each as a ratio to the floor (two EVALSHA of ``return 1``) of the same rounds.

For the comparison with the code before metrics existed, in interleaved rounds of one run:
``python benchmarks/ab.py --base <commit before metrics> uncontended``.

Usage::

    python benchmarks/bench_metrics.py [--quick] [--json out.json] [figure ...]

Figures: recording, onoff (default: both).
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass
from typing import Any, Dict, List, Optional

if __package__ in (None, ""):  # run as a script: make ``benchmarks`` and ``distlock`` importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import _common as C  # noqa: E402
from benchmarks._internals import metrics as _metrics
from distlock import DistLock

FIGURES = ("recording", "onoff")


@dataclass(frozen=True)
class Knobs:
    rounds: int
    ops: int
    micro_calls: int


FULL = Knobs(rounds=30, ops=200, micro_calls=200_000)
QUICK = Knobs(rounds=4, ops=50, micro_calls=20_000)


class _Silent(_metrics.Meter):
    """A meter whose calls do nothing: 'recording off' with the same call sites."""

    def acquired(self, outcome: str, seconds: float, waited: bool = False, hinted: bool = False) -> None:
        pass

    def held(self, seconds: float) -> None:
        pass


def _register_collector() -> str:
    try:
        from prometheus_client import REGISTRY

        from distlock.prometheus import DistlockCollector
    except ImportError:
        return "prometheus_client not installed: no collector"
    REGISTRY.register(DistlockCollector())
    return "prometheus_client installed, DistlockCollector registered"


def recording(client: Any, knobs: Knobs, note: str) -> List[C.Row]:
    """The recording work of one acquire + release, alone, against the op it rides on."""
    lock = DistLock("bench:metrics:recording", client=client)
    op = C.cycle(lock.acquire, lock.release)
    monotonic = time.monotonic

    def record_once() -> None:
        meter = lock._metered()
        t0 = monotonic()
        meter.acquired("acquired", monotonic() - t0)
        meter.held(monotonic() - t0)

    per_round = C.interleaved({"acquire+release": op, "recording": record_once}, rounds=knobs.rounds,
                              per_round=knobs.ops)
    # the micro figure is far below the timer's resolution per call: time it in a long loop too
    t0 = time.perf_counter()
    for _ in range(knobs.micro_calls):
        record_once()
    micro_us = (time.perf_counter() - t0) / knobs.micro_calls * 1e6
    op_us = C.median(per_round["acquire+release"])
    share = micro_us / op_us
    return [
        C.Row("metrics recording", "per acquire+release", micro_us, "µs",
              note=f"{knobs.micro_calls} calls; {note}"),
        C.Row("metrics recording", "share of DistLock acquire+release", share * 100, "%",
              note=f"acquire+release {op_us:.0f} µs (median of {len(per_round['acquire+release'])} "
                   f"rounds); target <= 3 %: {'met' if share <= 0.03 else 'MISSED'}"),
    ]


def onoff(client: Any, knobs: Knobs, note: str) -> List[C.Row]:
    script = client.register_script("return 1")

    def floor() -> None:
        script()
        script()

    on = DistLock("bench:metrics:on", client=client)
    off = DistLock("bench:metrics:off", client=client)
    real = off._metered()
    off._meter = _Silent(real.kind, real.name, real.series, real.rule)
    ops = {"floor": floor, "metrics on": C.cycle(on.acquire, on.release),
           "metrics off": C.cycle(off.acquire, off.release)}
    cpu: Dict[str, List[float]] = {}
    with C.pinned(client) as pin:
        per_round = C.interleaved(ops, rounds=knobs.rounds, per_round=knobs.ops, cpu=cpu)
    wall = C.per_round_ratios(per_round, "floor")
    cpu_ratio = C.per_round_ratios(cpu, "floor")
    on_off = C.per_round_ratios(per_round, "metrics off")["metrics on"]
    cpu_on_off = C.per_round_ratios(cpu, "metrics off")["metrics on"]
    rows = []
    for label in ("metrics on", "metrics off"):
        rows.append(C.Row("uncontended acquire+release", f"DistLock, {label}", C.median(per_round[label]),
                          "µs/op", C.median(wall[label]), note=f"wall, ratio to the floor; {pin}"))
        rows.append(C.Row("client CPU per acquire+release", f"DistLock, {label}", C.median(cpu[label]),
                          "µs/op", C.median(cpu_ratio[label]), note="time.process_time()"))
    rows.append(C.Row("on / off", "wall", C.median(on_off), "x",
                      note=f"median of per-round ratios, IQR {C.percentile(on_off, 25):.3f}-"
                           f"{C.percentile(on_off, 75):.3f}; {note}"))
    rows.append(C.Row("on / off", "client CPU", C.median(cpu_on_off), "x",
                      note=f"IQR {C.percentile(cpu_on_off, 25):.3f}-{C.percentile(cpu_on_off, 75):.3f}"))
    return rows


def _run(client: Any, url: str, knobs: Knobs, figures: List[str]) -> List[C.Row]:
    note = _register_collector()
    rows: List[C.Row] = []
    if "recording" in figures:
        C.eprint("recording: the recording calls alone vs acquire+release")
        rows += recording(client, knobs, note)
    if "onoff" in figures:
        C.eprint(f"onoff: {knobs.rounds} rounds x {knobs.ops} ops, recording on and off, round-robin")
        rows += onoff(client, knobs, note)
    return rows


def main(argv: Optional[List[str]] = None) -> int:
    return C.bench_main(argv, doc=__doc__, title="distlock metrics overhead", figures=FIGURES,
                        full=FULL, quick=QUICK, options=[], run=_run,
                        versions=[("prometheus_client", "prometheus_client")])


if __name__ == "__main__":
    sys.exit(main())
