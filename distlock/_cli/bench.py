"""``distlock demo`` and ``distlock bench``: the two commands that start servers of their own.

The demo's work (its worker processes, its private server, its table) is in ``demo``, imported
when the command runs; the benchmarks are ``benchmarks/bench_locks.py`` and
``benchmarks/bench_cluster.py`` of a source checkout, imported as ``benchmarks.<script>`` and
handed the command's other arguments as they are.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path

from .connect import check_url
from .exits import EXIT_REFUSED, EXIT_USAGE, Fail, one_line

__all__ = ["cmd_demo", "cmd_bench", "bench_script", "cluster_bench_script"]


def cmd_demo(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from .demo import run_demo

    if args.url is not None:
        check_url(args.url, parser)
    return run_demo(url=args.url, workers=args.workers, increments=args.increments)


def bench_script() -> Path:
    """Where ``benchmarks/bench_locks.py`` is in a source checkout (``distlock/_cli/`` is two
    levels below its root)."""
    return Path(__file__).resolve().parents[2] / "benchmarks" / "bench_locks.py"


def cluster_bench_script() -> Path:
    """Where ``benchmarks/bench_cluster.py`` (``distlock bench --cluster``) is in a source
    checkout."""
    return bench_script().parent / "bench_cluster.py"


def cmd_bench(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    script = "bench_cluster" if args.cluster else "bench_locks"
    path = cluster_bench_script() if args.cluster else bench_script()
    how = ("from a clone of the repository: pip install -e '.[bench]' && "
           f"python benchmarks/{script}.py [FIGURE...]")
    if not path.is_file():
        raise Fail(f"the benchmarks are not installed with the package; run them {how}",
                    EXIT_REFUSED)
    # Imported as benchmarks.<script> from the source tree, so that the worker processes it
    # spawns can import its functions by the same name.
    root = str(path.parent.parent)
    if root not in sys.path:
        sys.path.insert(0, root)
    try:
        module = importlib.import_module(f"benchmarks.{script}")
    except ImportError as exc:
        raise Fail(f"the benchmarks need the bench extra ({one_line(exc)}); run them {how}",
                    EXIT_REFUSED) from None
    if Path(getattr(module, "__file__", "") or "").resolve() != path:
        raise Fail(f"another 'benchmarks' package shadows {path}; run them {how}", EXIT_REFUSED)
    entry = getattr(module, "main", None)
    if not callable(entry):
        raise Fail(f"{path} has no main(); run it {how}", EXIT_REFUSED)
    try:
        result = entry(list(args.extra))
    except SystemExit as exc:  # its own argparse said no
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    return int(result or 0)
