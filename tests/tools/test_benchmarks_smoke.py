"""The benchmark script runs end to end (a tiny --quick run of one cheap figure).

Only that it runs, prints its table and exits 0 is checked: performance is measured by the
benchmark itself, never asserted by a test.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from distlock.testing.server import redis_server_binary

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "benchmarks", "bench_locks.py")


@pytest.mark.real_redis
@pytest.mark.slow
def test_bench_locks_quick_uncontended_prints_a_table() -> None:
    if redis_server_binary() is None:
        pytest.skip("the benchmark starts its own redis-server, and there is none on PATH")
    proc = subprocess.run(
        [sys.executable, SCRIPT, "--quick", "--rounds", "2", "--ops", "5", "uncontended"],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert "figure" in out and "implementation" in out
    assert "floor" in out
    assert "uncontended acquire+release" in out
    for label in ("DistLock", "DistRLock", "redis-py Lock"):
        assert label in out, out


@pytest.mark.real_redis
@pytest.mark.slow
def test_bench_metrics_quick_prints_the_overhead() -> None:
    if redis_server_binary() is None:
        pytest.skip("the benchmark starts its own redis-server, and there is none on PATH")
    proc = subprocess.run(
        [sys.executable, os.path.join(ROOT, "benchmarks", "bench_metrics.py"), "--quick", "recording"],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "metrics recording" in proc.stdout and "share of DistLock acquire+release" in proc.stdout


@pytest.mark.real_redis
@pytest.mark.slow
def test_bench_asyncio_quick_prints_every_figure() -> None:
    if redis_server_binary() is None:
        pytest.skip("the benchmark starts its own redis-server, and there is none on PATH")
    proc = subprocess.run(
        [sys.executable, os.path.join(ROOT, "benchmarks", "bench_asyncio.py"), "--quick",
         "--rounds", "2", "--ops", "5", "--tasks", "20"],
        cwd=ROOT, capture_output=True, text=True, timeout=180,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    for figure in ("floor", "uncontended acquire+release", "handoff median",
                   "in-process handoff median", "contended ops/s",
                   "contended lost updates", "waiting 20 tasks: connections",
                   "waiting 20 tasks: commands/s"):
        assert figure in out, out
    for label in ("DistLock", "DistLock fair", "DistRLock", "redis-py asyncio Lock", "pottery AIORedlock"):
        assert label in out, out


@pytest.mark.real_redis
@pytest.mark.slow
def test_bench_cluster_quick_prints_every_figure() -> None:
    import shutil

    if redis_server_binary() is None or shutil.which("redis-cli") is None:
        pytest.skip("the benchmark starts its own redis-server and cluster (redis-cli creates it)")
    proc = subprocess.run(
        [sys.executable, os.path.join(ROOT, "benchmarks", "bench_cluster.py"), "--quick"],
        cwd=ROOT, capture_output=True, text=True, timeout=180,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    for figure in ("round trips per acquire+release, DistLock",
                   "Redis commands per acquire+release, DistRLock",
                   "spread of 10,000 names over 3 masters", "hand-off median: cluster DistLock",
                   "hand-off median: single-server floor", "watchdog round trips per round",
                   "watchdog commands per round", "keys left after releasing everything"):
        assert figure in out, out


@pytest.mark.real_redis
@pytest.mark.slow
def test_bench_failover_quick_prints_every_figure() -> None:
    if redis_server_binary() is None:
        pytest.skip("the benchmark starts its own redis-servers, and there is none on PATH")
    proc = subprocess.run(
        [sys.executable, os.path.join(ROOT, "benchmarks", "bench_failover.py"), "--quick",
         "--rounds", "3", "--ops", "5"],
        cwd=ROOT, capture_output=True, text=True, timeout=180,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for label in ("uncontended acquire+release", "DistLock, one server", "DistLock min_replicas=0",
                  "DistLock min_replicas=2", "DistRLock min_replicas=1", "Redlock on 3 masters",
                  "Redlock on 5 masters", "5 masters in turn", "round trips per acquire+release",
                  "asyncio DistLock, Redlock on 5 masters"):
        assert label in proc.stdout, proc.stdout
