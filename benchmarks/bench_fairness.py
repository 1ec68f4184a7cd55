#!/usr/bin/env python
"""The default lock's yield rule: fairness against throughput, by ``barge_limit``.

A default ``DistLock`` lets a releasing process take the lock straight back (barging): that is
what makes it fast under contention, and what can leave another process waiting. The yield
rule bounds it with one setting, ``distlock.configure(barge_limit=SECONDS)``: how long a waiter
may be passed over before the next release is kept for it (``math.inf``: the rule is off). This
script draws the curve the setting moves along, against one freshly started private
redis-server on 127.0.0.1:

- for each ``barge_limit`` (default 0, 2, 5, 10, 20, 50, 100, 200 ms and inf), a ``DistLock``
  whose worker processes call ``configure(barge_limit=...)`` before they build it, is one
  candidate of ``_common.contended_throughput``; redis-py's ``Lock`` is one more, and all of
  them run in the same interleaved round-robin rounds, so each ratio to redis-py comes from the
  same rounds;
- once with 4 processes per candidate, once with 16; per run and candidate: fairness (per
  round, the least process' increments over the mean of the processes; the median over the
  rounds) and ops/s (the median over the rounds; the ratio to redis-py's, round by round).

Usage::

    python benchmarks/bench_fairness.py [--quick] [--json out.json] [--limits 0,0.01,inf]
                                        [--rounds N] [--seconds S] [curve]

The table (one line per ``barge_limit``, then redis-py) goes to stdout, progress to stderr;
``--json`` has every row with its rounds. ``--quick`` (3 limits, 2 and 4 processes, short
rounds) is a smoke run whose numbers mean little.
"""

from __future__ import annotations

import argparse
import functools
import inspect
import math
import os
import sys
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

if __package__ in (None, ""):  # run as a script: make ``benchmarks`` and ``distlock`` importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import distlock  # noqa: E402
from benchmarks import _common as C  # noqa: E402
from benchmarks._internals import settings_module as _config
from benchmarks.bench_locks import REDIS_PY, make_distlock, make_redis_py  # noqa: E402

FIGURES = ("curve",)
LIMITS = (0.0, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, math.inf)


# --- the candidates -----------------------------------------------------------------------------

def make_with_limit(limit: float, client: Any, name: str) -> C.LockHandle:
    """A default DistLock in a process whose yield rule is ``barge_limit=limit``: each worker
    is a process of its own, so the process-wide setting is this candidate's alone. Taken
    through ``functools.partial(make_with_limit, limit)``, which pickles by reference."""
    distlock.configure(barge_limit=limit)
    return make_distlock(client, name)


def limit_text(limit: float) -> str:
    """``limit`` for the table, marked when it is the library's default."""
    text = "inf (rule off)" if math.isinf(limit) else f"{limit * 1000:g} ms"
    return text + " (default)" if limit == getattr(_config, "DEFAULT_BARGE_LIMIT", None) else text


def parse_limits(text: str) -> Tuple[float, ...]:
    """``--limits``: comma-separated seconds, ``inf`` (or ``none``) for the rule off."""
    try:
        limits = tuple(math.inf if part.strip().lower() in ("inf", "none") else float(part)
                       for part in text.split(",") if part.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a list of seconds: {text!r}") from None
    if not limits or any(math.isnan(x) or x < 0 for x in limits):
        raise argparse.ArgumentTypeError(f"limits must be seconds >= 0 or inf: {text!r}")
    return limits


# --- knobs --------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Knobs:
    limits: Tuple[float, ...] = LIMITS
    procs: Tuple[int, ...] = (4, 16)
    seconds: float = 1.0
    rounds: int = 5


FULL = Knobs()
QUICK = Knobs(limits=(0.0, 0.01, math.inf), procs=(2, 4), seconds=0.3, rounds=2)


# --- the curve ----------------------------------------------------------------------------------

def curve(client: Any, url: str, k: Knobs) -> List[C.Row]:
    """One ``contended_throughput`` run per process count, every limit and redis-py in its
    rounds; rows of fairness and of ops/s (with the ratio to redis-py per round) per run."""
    if "barge_limit" not in inspect.signature(distlock.configure).parameters:
        raise SystemExit("this distlock has no configure(barge_limit=...): nothing to measure")
    candidates: Dict[str, C.LockFactory] = {
        f"DistLock, barge_limit={limit_text(limit)}": functools.partial(make_with_limit, limit)
        for limit in k.limits}
    candidates[REDIS_PY] = make_redis_py
    labels = list(candidates)
    limits = dict(zip(labels, [limit_text(limit) for limit in k.limits] + [REDIS_PY]))
    rows: List[C.Row] = []
    for procs in k.procs:
        C.eprint(f"curve: {len(labels)} candidates x {k.rounds} rounds x {procs} processes x "
                 f"{k.seconds:g} s, round-robin")
        results = C.contended_throughput(
            client, url,
            {label: (factory, f"bench:fairness:{procs}:{i}", f"bench:fairness:counter:{procs}:{i}")
             for i, (label, factory) in enumerate(candidates.items())},
            procs=procs, seconds=k.seconds, rounds=k.rounds)
        ops, lost = C.contended_rows(results, labels, (), f"contended ops/s, {procs} processes",
                                     REDIS_PY, lost_figure=f"contended lost updates, {procs} processes")
        run = C.fairness_rows(results, labels, f"fairness, {procs} processes", {}) + ops + lost
        for row in run:  # what curve_table sorts the rows into columns and lines by
            row.data["procs"] = procs
            row.data["barge_limit"] = limits[row.impl]
        rows += run
    return rows


def curve_table(rows: Sequence[C.Row]) -> str:
    """One line per candidate (each limit, then redis-py): fairness and ops/s with the ratio to
    redis-py, for each process count; lost updates, if any, below."""
    procs = sorted({int(r.data["procs"]) for r in rows})
    labels = list(dict.fromkeys(r.impl for r in rows))
    by = {(r.figure, r.impl): r for r in rows}
    limit_of = {r.impl: str(r.data["barge_limit"]) for r in rows}
    header = ["barge_limit"]
    for p in procs:
        header += [f"fairness ({p})", f"worst ({p})", f"ops/s ({p})", f"vs redis-py ({p})"]
    body = []
    for label in labels:
        cells = [limit_of[label]]
        for p in procs:
            fair = by.get((f"fairness, {p} processes", label))
            ops = by.get((f"contended ops/s, {p} processes", label))
            worst = min(fair.data["per_round_fairness"], default=math.nan) if fair else math.nan
            cells += [C.num_text(fair.value if fair else None), C.num_text(worst),
                      C.num_text(ops.value if ops else None), C.ratio_text(ops.vs_redis_py if ops else None)]
        body.append(cells)
    out = C.text_table(header, body, right=set(range(1, len(header))), grouped=False)
    lost = [r for r in rows if r.figure.startswith("contended lost updates") and r.value]
    for r in lost:
        out += f"\nLOST UPDATES: {r.impl}, {r.figure}: {r.value:.0f} ({r.note})"
    return (out + "\n\nfairness: min/mean of the processes' increments per round, median over the "
            "rounds (worst: the lowest round); ops/s: median over the rounds, the ratio to "
            "redis-py's taken round by round")


# --- main ---------------------------------------------------------------------------------------

def _run(client: Any, url: str, knobs: Knobs, figures: List[str]) -> List[C.Row]:
    return curve(client, url, knobs) if "curve" in figures else []


def main(argv: Optional[List[str]] = None) -> int:
    return C.bench_main(
        argv, doc=__doc__, title="distlock yield rule: fairness against throughput", figures=FIGURES,
        full=FULL, quick=QUICK,
        options=(C.Option("--limits", "limits", parse_limits, None,
                          "comma-separated barge_limit values in seconds, inf for the rule off "
                          "(default 0,0.002,0.005,0.01,0.02,0.05,0.1,0.2,inf; quick 0,0.01,inf)"),
                 C.Option("--rounds", "rounds", int, 1, "interleaved rounds per run (5; quick 2)"),
                 C.Option("--seconds", "seconds", float, 0.1, "seconds per round (1; quick 0.3)")),
        run=_run, versions=(("redis-py", "redis"),), table=curve_table)


if __name__ == "__main__":
    sys.exit(main())
