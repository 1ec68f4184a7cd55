"""Observability: in-process metrics, the Prometheus collector, OpenTelemetry spans, logging.

Every primitive records into the series of its (kind, name group); ``distlock.metrics()``
returns them as plain data. These tests read the figures after real operations on the test
server, so they check what is counted, not how fast anything is.
"""

from __future__ import annotations

import logging
import subprocess
import sys
import textwrap
import threading
from typing import Any, Dict, Iterator

import pytest
import redis
from _support import until

import distlock
from distlock import (
    DistBarrier,
    DistBoundedSemaphore,
    DistCondition,
    DistEvent,
    DistLock,
    DistReadWriteLock,
    DistRLock,
    DistSemaphore,
    LockLostError,
)
from distlock._session import metrics as _metrics
from distlock._session import telemetry as _telemetry


@pytest.fixture(autouse=True)
def fresh_metrics() -> Iterator[None]:
    _metrics.reset()
    yield
    _metrics.reset()


def _series(kind: str, group: str) -> Dict[str, Any]:
    for row in distlock.metrics()["series"]:
        if row["kind"] == kind and row["group"] == group:
            return row
    raise AssertionError(f"no series {kind}/{group}: {distlock.metrics()['series']}")


def test_outcomes_waits_holds_and_handoffs_of_a_lock(client: Any, backend: Any) -> None:
    mine, theirs = DistLock("orders:1", client=client), DistLock("orders:1", client=backend.client())
    for _ in range(3):
        with mine:
            pass
    mine.acquire()
    assert not theirs.acquire(blocking=False)           # refused
    assert not theirs.acquire(timeout=0.2)              # timeout, after waiting
    releaser = threading.Timer(0.3, mine.release)
    releaser.start()
    assert theirs.acquire(timeout=10)                   # acquired after waiting, woken by a hint
    theirs.release()
    releaser.join(10)  # the hand-off can come before the release records its hold's length
    row = _series("lock", "orders")
    assert row["acquire"] == {"acquired": 5, "timeout": 1, "refused": 1, "error": 0}
    assert row["waited"] == 2
    assert row["hinted"] == 1
    assert row["wait_seconds"]["count"] == 7
    assert row["hold_seconds"]["count"] == 5
    assert sum(row["hold_seconds"]["counts"]) == 5
    assert row["wait_seconds"]["sum"] >= 0.2 + 0.3 * 0.5  # the timed-out wait and the hand-off
    assert row["lost"] == 0


def test_an_unreachable_server_is_an_error() -> None:
    lock = DistLock("errors:1", client=redis.Redis(host="127.0.0.1", port=1, socket_connect_timeout=1))
    with pytest.raises(redis.ConnectionError):
        lock.acquire(timeout=1)
    assert _series("lock", "errors")["acquire"]["error"] == 1


def test_lost_leases_and_renewals(client: Any) -> None:
    distlock.configure(lease=1.0, renew_interval=0.2)
    lock = DistRLock("jobs:renewed", client=client)
    lost = threading.Event()
    lock.on_lost(lambda _lock: lost.set())
    lock.acquire()
    until(lambda: _series("rlock", "jobs")["renewals"] >= 2)
    assert _series("rlock", "jobs")["renew_seconds"]["count"] >= 2
    client.delete("distlock:{jobs:renewed}")            # someone broke it
    assert lost.wait(10)
    with pytest.raises(LockLostError):
        lock.release()
    row = _series("rlock", "jobs")
    assert row["lost"] == 1
    assert row["renew_failures"] >= 1
    assert row["hold_seconds"]["count"] == 1


PRIMITIVES = {
    "lock": lambda c: _lock_once(DistLock("k:lock", client=c)),
    "rlock": lambda c: _lock_once(DistRLock("k:rlock", client=c)),
    "read": lambda c: _lock_once(DistReadWriteLock("k:rw", client=c).read_lock()),
    "write": lambda c: _lock_once(DistReadWriteLock("k:rw", client=c).write_lock()),
    "semaphore": lambda c: _lock_once(DistSemaphore("k:sem", 2, client=c)),
    "bounded_semaphore": lambda c: _lock_once(DistBoundedSemaphore("k:bsem", 2, client=c)),
    "event": lambda c: DistEvent("k:event", client=c).wait(0.05),
    "condition": lambda c: _cond_once(DistCondition("k:cond", client=c)),
    "barrier": lambda c: DistBarrier("k:barrier", 1, client=c).wait(5),
}


def _lock_once(lock: Any) -> None:
    with lock:
        pass


def _cond_once(cond: Any) -> None:
    with cond:
        cond.wait(0.05)


@pytest.mark.parametrize("kind", list(PRIMITIVES))
def test_every_primitive_records_its_acquires_and_waits(client: Any, kind: str) -> None:
    PRIMITIVES[kind](client)
    row = _series(kind, "k")
    assert sum(row["acquire"].values()) >= 1
    assert row["wait_seconds"]["count"] == sum(row["acquire"].values())


def test_groups_default_custom_bounded_and_never_raw_names(client: Any) -> None:
    for i in range(3):
        with DistLock(f"user:{i}:cart", client=client):
            pass
    assert _series("lock", "user")["acquire"]["acquired"] == 3
    assert all("cart" not in row["group"] for row in distlock.metrics()["series"])

    distlock.configure(metric_group=lambda name: name.rsplit(":", 1)[-1])
    with DistLock("user:9:cart", client=client):
        pass
    assert _series("lock", "cart")["acquire"]["acquired"] == 1

    _metrics.reset()
    distlock.configure(metric_group=lambda name: name)  # a rule that returns raw names
    for i in range(_metrics.MAX_GROUPS + 20):
        with DistLock(f"g{i}", client=client):
            pass
    snap = distlock.metrics()
    assert snap["groups"] == _metrics.MAX_GROUPS
    assert _series("lock", _metrics.OTHER)["acquire"]["acquired"] == 20
    assert len(snap["series"]) == _metrics.MAX_GROUPS + 1

    def broken(name: str) -> str:
        raise ZeroDivisionError("a bug in the user's rule")

    distlock.configure(metric_group=broken)
    with DistLock("x:1", client=client):  # the rule's bug never breaks an acquire
        pass


def test_configure_metric_group_must_be_callable() -> None:
    with pytest.raises(TypeError, match="metric_group must be callable"):
        distlock.configure(metric_group="orders")  # type: ignore[arg-type]


def test_prometheus_collector_exposes_every_family(client: Any) -> None:
    prometheus_client = pytest.importorskip("prometheus_client")
    from distlock.prometheus import DistlockCollector

    with DistLock("orders:7", client=client):
        pass
    registry = prometheus_client.CollectorRegistry()
    registry.register(DistlockCollector())
    text = prometheus_client.generate_latest(registry).decode()
    assert 'distlock_acquire_total{group="orders",kind="lock",outcome="acquired"} 1.0' in text
    for family in ("distlock_wait_seconds_bucket", "distlock_hold_seconds_count", "distlock_lost_total",
                   "distlock_renew_seconds_count", "distlock_renewals_total", "distlock_handoffs_total"):
        assert family in text, family
    assert 'le="+Inf"' in text
    assert "orders:7" not in text


def test_otel_spans_for_a_wait_and_a_lost_lease(client: Any, backend: Any) -> None:
    pytest.importorskip("opentelemetry.sdk")
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    _telemetry.PROVIDER = provider  # the global provider can be set once per process only
    try:
        holder, waiter = DistLock("orders:9", client=client), DistLock("orders:9", client=backend.client())
        with holder:
            assert not waiter.acquire(timeout=0.1)
        distlock.configure(lease=1.0, renew_interval=0.2)
        lost = DistLock("orders:10", client=client)
        lost.acquire()
        client.delete("distlock:{orders:10}")
        until(lambda: any(s.name == "distlock.lease_lost" for s in exporter.get_finished_spans()))
    finally:
        _telemetry.PROVIDER = None
    spans = {s.name: s for s in exporter.get_finished_spans()}
    wait = spans["distlock.wait"]
    assert wait.attributes["distlock.kind"] == "lock"
    assert wait.attributes["distlock.group"] == "orders"
    assert wait.attributes["distlock.outcome"] == "timeout"
    assert wait.attributes["distlock.waited_s"] >= 0.1
    event = spans["distlock.lease_lost"].events[0]
    assert event.name == "lease lost" and event.attributes["distlock.group"] == "orders"
    with pytest.raises(LockLostError):
        lost.release()


def test_a_lost_lease_is_a_warning_with_its_fields(client: Any, caplog: pytest.LogCaptureFixture) -> None:
    distlock.configure(lease=1.0, renew_interval=0.2)
    lock = DistLock("orders:11", client=client)
    lock.acquire()
    token = lock.token
    with caplog.at_level(logging.WARNING, logger="distlock"):
        client.delete("distlock:{orders:11}")
        until(lambda: any(getattr(r, "cause", None) for r in caplog.records))
    record = next(r for r in caplog.records if getattr(r, "cause", None))
    assert record.levelno == logging.WARNING
    assert record.lock_name == "orders:11"  # type: ignore[attr-defined]
    assert record.token == token  # type: ignore[attr-defined]
    assert record.owner  # type: ignore[attr-defined]
    # the renewal round, or the read-back when the watchdog's connection opened after the
    # deletion (renewal.check_round): either way the cause says what was found
    assert "found it gone or someone else's" in record.cause  # type: ignore[attr-defined]
    with pytest.raises(LockLostError):
        lock.release()


def test_nothing_of_the_extras_is_imported(url: str) -> None:
    """distlock imports neither prometheus_client nor opentelemetry (redis-py 8 imports the
    latter itself when it is installed: only what distlock adds counts), and records all the
    same."""
    code = textwrap.dedent(f"""
        import sys
        import redis
        before = set(sys.modules)
        import distlock
        with distlock.DistLock("orders:1", client=redis.Redis.from_url({url!r})):
            pass
        assert distlock.metrics()["series"][0]["acquire"]["acquired"] == 1
        bad = [m for m in set(sys.modules) - before
               if m.startswith(("prometheus_client", "opentelemetry"))]
        assert not bad, bad
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
