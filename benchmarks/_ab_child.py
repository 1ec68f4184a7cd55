#!/usr/bin/env python
"""One side of one round of ``benchmarks/ab.py``: one figure, against one tree's distlock.

Run by ``ab.py``, once per round, figure and side::

    python benchmarks/_ab_child.py --tree ROOT --url URL --figure F --side S --round R [knobs]

``ROOT`` (the current work tree, or a detached worktree of the baseline revision) goes first on
``sys.path`` and on ``PYTHONPATH`` (and in ``DISTLOCK_AB_TREE``) before anything imports
distlock, so that this process and the worker processes it spawns import that tree's
``distlock``; both check ``distlock.__file__``. The timing harness is always the tree of this
file's own ``benchmarks._common`` (loaded by path, since ROOT has a ``benchmarks`` package of
its own), so both sides are measured by the same code. It touches only distlock's public
``DistLock`` / ``DistRLock`` (``name``, ``client=``, ``acquire(timeout=)``, ``release()``),
present in both trees, and the private names ``benchmarks._internals`` finds in either package
layout (``_common`` imports its ``RedisServer``, never used here).

Prints one JSON object on stdout: ``metrics`` (flat name -> number, what ``ab.py`` compares)
and ``detail`` (every sample). Lock names start with ``ab-<side>:``; the keys they leave are
deleted before the process exits.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import sys
import time
from typing import Any, Callable, Dict, List, Optional

TREE_ENV = "DISTLOCK_AB_TREE"
HERE = os.path.dirname(os.path.abspath(__file__))


def _inside(path: str, root: str) -> bool:
    path, root = os.path.realpath(path), os.path.realpath(root)
    return os.path.commonpath([path, root]) == root


def _use_tree() -> str:
    """Put the tree under test first on sys.path and PYTHONPATH (for spawned workers, which
    also inherit DISTLOCK_AB_TREE), import its distlock and check where it came from."""
    tree = os.environ.get(TREE_ENV)
    if not tree:
        pre = argparse.ArgumentParser(add_help=False)
        pre.add_argument("--tree")
        tree = pre.parse_known_args()[0].tree
    if not tree or not os.path.isdir(os.path.join(tree, "distlock")):
        raise SystemExit(f"_ab_child: --tree must be a source tree with a distlock/ package, not {tree!r}")
    tree = os.path.realpath(tree)
    if "distlock" in sys.modules and not _inside(sys.modules["distlock"].__file__ or "", tree):
        raise SystemExit("_ab_child: distlock was imported before the tree was chosen")
    if sys.path[:1] != [tree]:
        sys.path.insert(0, tree)
    os.environ[TREE_ENV] = tree
    old = os.environ.get("PYTHONPATH", "")
    if old.split(os.pathsep)[:1] != [tree]:
        os.environ["PYTHONPATH"] = tree + (os.pathsep + old if old else "")
    import distlock

    where = distlock.__file__ or ""
    assert _inside(where, tree), f"distlock came from {where}, not from the tree {tree}"
    return tree


def _load_benchmarks_package() -> None:
    """This file's own ``benchmarks`` package under its usual name, whatever the tree under test
    has, so that spawned workers unpickle ``benchmarks._common`` functions from it too."""
    known = sys.modules.get("benchmarks")
    if known is not None:
        if not _inside(getattr(known, "__file__", None) or "", HERE):
            raise SystemExit("_ab_child: another benchmarks package was imported first")
        return
    spec = importlib.util.spec_from_file_location(
        "benchmarks", os.path.join(HERE, "__init__.py"), submodule_search_locations=[HERE])
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["benchmarks"] = module
    spec.loader.exec_module(module)


TREE = _use_tree()  # at import: this process, and spawned workers re-running this file
_load_benchmarks_package()

import redis  # noqa: E402

from benchmarks import _common as C  # noqa: E402

assert _inside(C.__file__ or "", HERE), f"benchmark helpers came from {C.__file__}"

FIGURES = ("uncontended", "handoff", "contended")


# --- the factories: bench_locks' own (module-level, so spawned workers can unpickle them) ----

from benchmarks.bench_locks import make_distlock, make_distrlock, make_redis_py  # noqa: E402

# --- figures ------------------------------------------------------------------------------------

def uncontended(client: redis.Redis[Any], args: argparse.Namespace, prefix: str) -> Dict[str, Any]:
    """Floor (2 x EVALSHA 'return 1') vs DistLock vs DistRLock acquire+release, interleaved."""
    script = client.register_script("return 1")

    def floor() -> None:
        script()
        script()

    candidates: Dict[str, Callable[[], object]] = {"floor": floor}
    for label, factory in (("DistLock", make_distlock), ("DistRLock", make_distrlock)):
        handle = factory(client, f"{prefix}uncontended:{label}")
        candidates[label] = C.cycle(handle.acquire_default, handle.release)
    ops = {name: candidates[name] for name in C.round_robin(list(candidates), args.round)}
    cpu: Dict[str, List[float]] = {}
    with C.pinned(client) as pin:
        wall = C.interleaved(ops, rounds=args.unc_rounds, per_round=args.unc_ops,
                             max_seconds=args.unc_max_s, cpu=cpu)
    wall_vs = C.per_round_ratios(wall, "floor")
    cpu_vs = C.per_round_ratios(cpu, "floor")
    metrics: Dict[str, float] = {"floor us/pair": C.median(wall["floor"]),
                                 "floor CPU us/pair": C.median(cpu["floor"])}
    for label in ("DistLock", "DistRLock"):
        metrics[f"{label} wall/floor"] = C.median(wall_vs[label])
        metrics[f"{label} CPU/floor"] = C.median(cpu_vs[label])
        metrics[f"{label} us/op"] = C.median(wall[label])
        metrics[f"{label} CPU us/op"] = C.median(cpu[label])
    return {"metrics": metrics,
            "detail": {"mini_rounds": len(wall["floor"]), "ops_per_mini_round": args.unc_ops,
                       "pinned": pin, "per_round_us": wall, "per_round_cpu_us": cpu}}


def handoff(client: redis.Redis[Any], args: argparse.Namespace, prefix: str) -> Dict[str, Any]:
    """DistLock release here -> a blocked waiter in another process returns, or in another
    thread of this process; and the pub/sub floor (PUBLISH -> subscribed waiter + 1 EVALSHA),
    in an order that rotates by round."""
    runs: Dict[str, Dict[str, Any]] = {}
    order = C.round_robin(["DistLock", "floor", "in-process"], args.round)
    for which in order:
        if which == "DistLock":
            runs[which] = C.handoff_latency(client, args.url, make_distlock, f"{prefix}handoff",
                                            samples=args.samples, max_seconds=args.handoff_max_s)
        elif which == "in-process":  # two threads of this process take turns
            runs[which] = C.handoff_latency_local(client, make_distlock, f"{prefix}handoff-local",
                                                  samples=args.samples, max_seconds=args.handoff_max_s)
        else:
            runs[which] = C.handoff_latency(client, args.url, C.make_hint_holder,
                                            f"{prefix}handoff-floor", samples=args.samples,
                                            max_seconds=args.handoff_max_s,
                                            waiter_factory=C.make_hint_waiter)
    lat = {which: [x * 1000.0 for x in res["latencies"]] for which, res in runs.items()}
    lock_med, floor_med = C.median(lat["DistLock"]), C.median(lat["floor"])
    metrics = {"DistLock median ms": lock_med, "DistLock p90 ms": C.percentile(lat["DistLock"], 90),
               "floor median ms": floor_med,
               "DistLock/floor": lock_med / floor_med if floor_med else math.nan,
               "DistLock samples": float(len(lat["DistLock"])),
               "in-process median ms": C.median(lat["in-process"]),
               "in-process/floor": C.median(lat["in-process"]) / floor_med if floor_med else math.nan,
               "acquire timeouts": float(sum(res["failures"] for res in runs.values()))}
    detail = {"order": order, **{which: {"latencies_ms": lat[which],
                                          **{k: v for k, v in res.items() if k != "latencies"}}
                                  for which, res in runs.items()}}
    return {"metrics": metrics, "detail": detail}


def contended(client: redis.Redis[Any], args: argparse.Namespace, prefix: str) -> Dict[str, Any]:
    """``procs`` processes per library doing a lock-protected GET/SET of a counter for
    ``seconds``; DistLock, DistRLock and redis-py's Lock, in an order that rotates by round."""
    factories = {"DistLock": make_distlock, "DistRLock": make_distrlock, "redis-py": make_redis_py}
    order = C.round_robin(list(factories), args.round)
    results = C.contended_throughput(
        client, args.url,
        {label: (factories[label], f"{prefix}contended:{label}", f"{prefix}counter:{label}")
         for label in order},
        procs=args.procs, seconds=args.seconds, rounds=args.contended_rounds)
    per_round = {label: res["per_round_ops"] for label, res in results.items()}
    vs_redis = C.per_round_ratios(per_round, "redis-py")
    metrics: Dict[str, float] = {}
    for label in ("DistLock", "DistRLock"):
        metrics[f"{label} ops/s"] = results[label]["ops_per_s"]
        metrics[f"{label}/redis-py"] = C.median(vs_redis[label])
    metrics["redis-py ops/s"] = results["redis-py"]["ops_per_s"]
    metrics["lost updates"] = float(sum(res["lost"] for res in results.values()))
    metrics["acquire timeouts"] = float(sum(res["timeouts"] for res in results.values()))
    metrics["release errors"] = float(sum(res["release_errors"] for res in results.values()))
    for label in ("DistLock", "DistRLock"):
        metrics[f"{label} EVALSHA/op"] = results[label]["scripts_per_op"]
    return {"metrics": metrics, "detail": {"order": order, "results": results}}


RUNNERS: Dict[str, Callable[[redis.Redis[Any], argparse.Namespace, str], Dict[str, Any]]] = {
    "uncontended": uncontended, "handoff": handoff, "contended": contended}


def _delete_keys(client: redis.Redis[Any], prefix: str) -> int:
    """Every key whose name contains ``prefix`` (distlock puts its own prefix in front)."""
    keys = list(client.scan_iter(match=f"*{prefix}*", count=1000))
    return int(client.delete(*keys)) if keys else 0


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description="one side of one round of benchmarks/ab.py")
    parser.add_argument("--tree", required=True, help="source tree whose distlock is measured")
    parser.add_argument("--url", required=True, help="the private redis-server, redis://127.0.0.1:PORT/0")
    parser.add_argument("--figure", required=True, choices=FIGURES)
    parser.add_argument("--side", required=True, help="label for key names, e.g. base or current")
    parser.add_argument("--round", type=int, default=0, help="rotates the order of candidates")
    parser.add_argument("--unc-rounds", type=int, default=15)
    parser.add_argument("--unc-ops", type=int, default=100)
    parser.add_argument("--unc-max-s", type=float, default=5.0)
    parser.add_argument("--samples", type=int, default=100)
    parser.add_argument("--handoff-max-s", type=float, default=15.0)
    parser.add_argument("--procs", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=1.0)
    parser.add_argument("--contended-rounds", type=int, default=1)
    args = parser.parse_args(argv)
    if not args.url.startswith("redis://127.0.0.1:"):
        parser.error("--url must be a private server on 127.0.0.1")
    if os.path.realpath(args.tree) != TREE:
        parser.error(f"--tree {args.tree} is not the tree already imported ({TREE})")


    prefix = f"ab-{args.side}:"
    client = C.connect(args.url)
    started = time.monotonic()
    try:
        result = RUNNERS[args.figure](client, args, prefix)
    finally:
        deleted = _delete_keys(client, prefix)
        client.close()
    out = {"figure": args.figure, "side": args.side, "round": args.round, "tree": TREE,
           "distlock_file": sys.modules["distlock"].__file__, "seconds": round(time.monotonic() - started, 2),
           "keys_deleted": deleted, **result}
    sys.stdout.write(json.dumps(C.json_clean(out)) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
