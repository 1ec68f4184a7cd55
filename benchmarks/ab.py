#!/usr/bin/env python
"""This tree's DistLock/DistRLock against a baseline revision's, in interleaved rounds of one run.

A single run of a benchmark swings too much on a small, noisy machine to compare two commits
run at different times (the contended figure alone moves 0.86-1.13x from run to run). This
tool measures both in one run instead: it checks out ``--base REV`` in a detached git worktree
in a temporary directory, starts one private redis-server on 127.0.0.1, and in each round runs,
for each figure, one child process per side (``benchmarks/_ab_child.py``, which imports the
distlock of its side's tree and this tree's benchmark helpers), the side that goes first
alternating from round to round. Per figure it reports, for each side, the median over rounds
of every per-round figure, and the median of the per-round "current / base" ratios.

- uncontended: acquire + release wall time as a ratio to the floor (two EVALSHA of
  ``return 1`` through the same redis-py client, interleaved with the locks in the same
  process), and the client's CPU time (``time.process_time()``) per acquire + release as a
  ratio to the floor's;
- handoff: DistLock, from ``release()`` here to the return of a blocked ``acquire()`` in another
  process, and in another thread of this process (median ms), and their ratios to the pub/sub
  floor (PUBLISH -> subscribed waiter + one EVALSHA) measured in the same child;
- contended: 4 processes doing a lock-protected GET/SET for 1 s, DistLock, DistRLock and
  redis-py's Lock in the same child: ops/s, the ratio to redis-py, and lost updates (must be 0).

Usage::

    python benchmarks/ab.py --base REV [--rounds N] [--quick] [--json out.json] [figure ...]

The table goes to stdout, progress to stderr. The default run takes about 6-7 minutes and stops
starting rounds when the next one would not fit in ``--max-minutes`` (7.5); ``--quick`` (2
rounds, small samples, about a minute) only checks that everything runs. The current side is
the work tree as it is, uncommitted changes included. The worktree and the server are removed
at the end, also after an error or Ctrl-C.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, replace
from typing import Any, Dict, List, Optional, Sequence, Tuple

if __package__ in (None, ""):  # run as a script: make ``benchmarks`` and ``distlock`` importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import _common as C  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
CHILD = os.path.join(HERE, "_ab_child.py")
FIGURES = ("uncontended", "handoff", "contended")
SIDES = ("base", "current")

#: What the table shows, per figure: (metric, unit, which way is better). Every other metric a
#: child reports goes to the JSON only.
SHOWN: Dict[str, List[Tuple[str, str, str]]] = {
    "uncontended": [
        ("DistLock wall/floor", "x", "lower"), ("DistLock CPU/floor", "x", "lower"),
        ("DistRLock wall/floor", "x", "lower"), ("DistRLock CPU/floor", "x", "lower"),
        ("floor us/pair", "us", "info"), ("DistLock us/op", "us", "info"),
    ],
    "handoff": [
        ("DistLock median ms", "ms", "lower"), ("DistLock/floor", "x", "lower"),
        ("in-process median ms", "ms", "lower"), ("in-process/floor", "x", "lower"),
        ("floor median ms", "ms", "info"), ("DistLock p90 ms", "ms", "info"),
    ],
    "contended": [
        ("DistLock ops/s", "ops/s", "higher"), ("DistRLock ops/s", "ops/s", "higher"),
        ("DistLock/redis-py", "x", "higher"), ("DistRLock/redis-py", "x", "higher"),
        ("redis-py ops/s", "ops/s", "info"), ("lost updates", "", "zero"),
    ],
}
#: Counts that must stay 0 on both sides (else the run's exit status is 1).
MUST_BE_ZERO = ("lost updates", "acquire timeouts", "release errors")


@dataclass(frozen=True)
class Knobs:
    rounds: int = 6
    max_minutes: float = 7.5
    unc_rounds: int = 20  # uncontended: mini-rounds of floor / DistLock / DistRLock per child
    unc_ops: int = 100  # ... ops per candidate per mini-round (6,000 ops in all, ~3 s)
    unc_max_s: float = 5.0
    samples: int = 100  # handoff samples, DistLock and floor each
    handoff_max_s: float = 15.0
    procs: int = 4  # contended: processes per library
    seconds: float = 1.0  # ... seconds per library per round
    child_timeout_s: float = 180.0


FULL = Knobs()
QUICK = Knobs(rounds=2, max_minutes=1.4, unc_rounds=6, unc_ops=50, unc_max_s=1.5, samples=20,
              handoff_max_s=3.0, procs=2, seconds=0.5, child_timeout_s=60.0)


def _git(*args: str) -> str:
    done = subprocess.run(["git", "-C", REPO, *args], capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        raise RuntimeError(f"git {' '.join(args)} failed: {done.stderr.strip()}")
    return done.stdout.strip()


class Worktree:
    """A detached git worktree of ``rev`` in a fresh temporary directory; removed on exit."""

    def __init__(self, rev: str) -> None:
        self.sha = _git("rev-parse", "--verify", "--end-of-options", f"{rev}^{{commit}}")
        self.parent = tempfile.mkdtemp(prefix="distlock-ab-")
        self.path = os.path.join(self.parent, "base")
        self.added = False

    def __enter__(self) -> Worktree:
        try:
            _git("worktree", "add", "--detach", self.path, self.sha)
            self.added = True
        except BaseException:
            self.close()
            raise
        return self

    def close(self) -> None:
        if self.added:
            try:
                _git("worktree", "remove", "--force", self.path)
            except (RuntimeError, subprocess.TimeoutExpired) as exc:
                C.eprint(f"warning: {exc}; removing the directory and pruning instead")
                shutil.rmtree(self.path, ignore_errors=True)
                try:
                    _git("worktree", "prune")
                except (RuntimeError, subprocess.TimeoutExpired):
                    pass
            self.added = False
        shutil.rmtree(self.parent, ignore_errors=True)

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def run_child(tree: str, url: str, figure: str, side: str, rnd: int, k: Knobs) -> Dict[str, Any]:
    cmd = [sys.executable, CHILD, "--tree", tree, "--url", url, "--figure", figure, "--side", side,
           "--round", str(rnd), "--unc-rounds", str(k.unc_rounds), "--unc-ops", str(k.unc_ops),
           "--unc-max-s", str(k.unc_max_s), "--samples", str(k.samples),
           "--handoff-max-s", str(k.handoff_max_s), "--procs", str(k.procs),
           "--seconds", str(k.seconds)]
    env = {key: v for key, v in os.environ.items() if key not in ("PYTHONPATH", "DISTLOCK_AB_TREE")}
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=k.child_timeout_s,
                              cwd=tree, env=env)
    except subprocess.TimeoutExpired as exc:
        raise RuntimeError(f"{side} {figure} child did not finish in {k.child_timeout_s:g} s") from exc
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        tail = "\n".join(done.stderr.strip().splitlines()[-15:])
        raise RuntimeError(f"{side} {figure} child exited with {done.returncode}:\n{tail}")
    result: Dict[str, Any] = json.loads(lines[-1])
    return result


def _ratio(cur: Optional[float], base: Optional[float]) -> float:
    if cur is None or base is None or not base or math.isnan(cur) or math.isnan(base):
        return math.nan
    return cur / base


def summarize(rounds: List[Dict[str, Any]], figures: Sequence[str]) -> Dict[str, Dict[str, Any]]:
    """Per figure and metric: each side's per-round values and their median, and the per-round
    current/base ratios and their median."""
    out: Dict[str, Dict[str, Any]] = {}
    for figure in figures:
        per: Dict[str, Dict[str, List[Optional[float]]]] = {}
        for rnd in rounds:
            if figure not in rnd["results"]:
                continue
            for side in SIDES:
                for metric, value in rnd["results"][figure][side]["metrics"].items():
                    per.setdefault(metric, {s: [] for s in SIDES})[side].append(value)
        fig: Dict[str, Any] = {}
        for metric, values in per.items():
            ratios = [_ratio(c, b) for c, b in zip(values["current"], values["base"])]
            finite = [r for r in ratios if not math.isnan(r)]
            fig[metric] = {
                "base": values["base"], "current": values["current"], "current_over_base": ratios,
                "base_median": C.median([v for v in values["base"] if v is not None]),
                "current_median": C.median([v for v in values["current"] if v is not None]),
                "ratio_median": C.median(finite),
                "ratio_min": min(finite) if finite else math.nan,
                "ratio_max": max(finite) if finite else math.nan,
            }
        out[figure] = fig
    return out


def _fmt(value: Optional[float], unit: str) -> str:
    if value is None or math.isnan(value):
        return "-"
    if unit == "x":
        return f"{value:.3f}x"
    if abs(value) >= 100 or float(value).is_integer():
        return f"{value:,.0f}"
    return f"{value:.3f}" if abs(value) < 10 else f"{value:.1f}"


def format_summary(summary: Dict[str, Dict[str, Any]], figures: Sequence[str]) -> str:
    header = ("figure", "metric", "better", "base", "current", "cur/base", "min-max")
    body: List[Tuple[str, ...]] = []
    for figure in figures:
        for metric, unit, better in SHOWN[figure]:
            s = summary[figure].get(metric)
            if s is None:
                continue
            label = f"{metric} ({unit})" if unit not in ("x", "") else metric
            spread = (f"{s['ratio_min']:.2f}-{s['ratio_max']:.2f}"
                      if not math.isnan(s["ratio_min"]) else "")
            body.append((figure, label, better, _fmt(s["base_median"], unit),
                         _fmt(s["current_median"], unit),
                         "" if math.isnan(s["ratio_median"]) else f"{s['ratio_median']:.3f}", spread))
    return C.text_table(header, body, right={3, 4, 5, 6})


def _problems(rounds: List[Dict[str, Any]]) -> List[str]:
    found = []
    for rnd in rounds:
        for figure, sides in rnd["results"].items():
            for side, res in sides.items():
                for metric in MUST_BE_ZERO:
                    value = res["metrics"].get(metric)
                    if value:
                        found.append(f"round {rnd['round']} {figure} {side}: {metric} = {value:g}")
    return found


def _on_sigterm(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("figures", nargs="*", metavar="figure",
                        help=f"figures to run (default: all): {', '.join(FIGURES)}")
    parser.add_argument("--base", required=True, metavar="REV", help="the baseline git revision")
    parser.add_argument("--rounds", type=int, help=f"rounds (default {FULL.rounds}; quick {QUICK.rounds})")
    parser.add_argument("--max-minutes", type=float,
                        help=f"start no round that would end later (default {FULL.max_minutes:g}; "
                             f"quick {QUICK.max_minutes:g})")
    parser.add_argument("--quick", action="store_true", help="a short smoke run (< 90 s)")
    parser.add_argument("--json", metavar="PATH", help="also write every sample as JSON")
    args = parser.parse_args(argv)
    unknown = [f for f in args.figures if f not in FIGURES]
    if unknown:
        parser.error(f"unknown figure(s) {', '.join(unknown)}; choose from {', '.join(FIGURES)}")
    figures = [f for f in FIGURES if f in args.figures] if args.figures else list(FIGURES)
    k = QUICK if args.quick else FULL
    if args.rounds:
        k = replace(k, rounds=max(1, args.rounds))
    if args.max_minutes:
        k = replace(k, max_minutes=max(0.5, args.max_minutes))

    signal.signal(signal.SIGTERM, _on_sigterm)
    started = time.monotonic()
    budget = k.max_minutes * 60.0
    rounds: List[Dict[str, Any]] = []
    meta: Dict[str, Any] = {
        "command": " ".join([os.path.basename(sys.executable), *sys.argv]),
        "base_rev": args.base, "current_head": _git("rev-parse", "HEAD"),
        "current_dirty": bool(_git("status", "--porcelain", "--", "distlock")),
        "figures": figures, "quick": args.quick, "knobs": asdict(k),
        "python": platform.python_version(), "platform": platform.platform(), "cpus": os.cpu_count(),
    }
    server = None
    try:
        with Worktree(args.base) as wt:
            meta["base_sha"] = wt.sha
            trees = {"base": wt.path, "current": REPO}
            dirty = ", distlock/ modified" if meta["current_dirty"] else ""
            C.eprint(f"base {wt.sha[:10]} in worktree {wt.path}; current: {REPO} "
                     f"(HEAD {meta['current_head'][:10]}{dirty})")
            server = C.start_server()
            client = C.connect(server.url)
            meta.update(C.server_meta(client))
            C.eprint(f"redis-server {meta['redis_version']} at {server.url}")
            for rnd in range(k.rounds):
                elapsed = time.monotonic() - started
                if rounds and elapsed + elapsed / len(rounds) > budget:
                    C.eprint(f"stopping after {len(rounds)} rounds: another would pass "
                             f"--max-minutes {k.max_minutes:g}")
                    break
                order = list(SIDES) if rnd % 2 == 0 else list(reversed(SIDES))
                record: Dict[str, Any] = {"round": rnd, "order": order, "results": {}}
                for figure in figures:
                    C.eprint(f"round {rnd + 1}/{k.rounds} {figure}: {order[0]}, then {order[1]}")
                    record["results"][figure] = {
                        side: run_child(trees[side], server.url, figure, side, rnd, k) for side in order}
                rounds.append(record)
            leftover = [key for side in SIDES for key in client.scan_iter(match=f"*ab-{side}:*")]
            if leftover:
                client.delete(*leftover)
            meta["keys_left_and_deleted"] = len(leftover)
            client.close()
    except KeyboardInterrupt:
        C.eprint("interrupted; the worktree and the server are removed")
        return 130
    except (RuntimeError, TimeoutError, OSError) as exc:
        C.eprint(f"error: {exc}")
        return 2
    finally:
        if server is not None:
            server.stop()
    meta["rounds_done"] = len(rounds)
    meta["seconds"] = round(time.monotonic() - started, 1)
    summary = summarize(rounds, figures)
    problems = _problems(rounds)
    print(f"distlock A/B: current ({meta['current_head'][:10]}"
          f"{' + uncommitted distlock/' if meta['current_dirty'] else ''}) vs base "
          f"{args.base} ({meta['base_sha'][:10]}); {len(rounds)} rounds, sides alternating first; "
          f"redis {meta['redis_version']}, Python {meta['python']}, {meta['cpus']} CPUs; "
          f"{meta['seconds']} s{' (--quick: numbers are not meaningful)' if args.quick else ''}")
    print("base / current: median over rounds; cur/base: median of the per-round current/base "
          "ratios (min-max over rounds)")
    print(format_summary(summary, figures))
    for problem in problems:
        print(f"PROBLEM: {problem}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(C.json_clean({"meta": meta, "summary": summary, "rounds": rounds}), fh, indent=2)
            fh.write("\n")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
