"""``python -m distlock.testing.nemesis`` on the single-server topology, in both shells: a short
schedule of every nemesis, checked by ``check_history``.

What docs/safety.rst promises on one server: tokens increase in grant order and the fenced store
takes no stale write under every nemesis; no two processes, threads or tasks believe they hold
one name at once under every nemesis, a restart without persistence included: the session stops
believing when the server's FIN arrives, before the fresh server can grant anything
(docs/safety.rst, "A broken connection suspends belief").

Only the nemesis' own servers and proxies on 127.0.0.1 get traffic; each phase is bounded.
"""

from __future__ import annotations

import subprocess
import sys
from typing import Any, List, Tuple

import pytest

from distlock.testing.nemesis import (
    DOCUMENTED_OVERLAPS,
    NEMESES,
    Phase,
    applies,
    failed,
    format_rows,
    run_phase,
)

pytestmark = [pytest.mark.real_redis, pytest.mark.slow]

LEASE = 0.4
SECONDS = 2.0
#: A restarted master votes once INFO's whole-second uptime reaches the lease: about a second
#: after a restart, which a 2 s phase leaves too little room after on a loaded machine.
REDLOCK_SECONDS = 3.0


@pytest.mark.parametrize("shell", ["threads", "asyncio"])
@pytest.mark.parametrize("nemesis", [n for n in NEMESES if applies(n, "server")])
def test_a_short_schedule_keeps_what_safety_promises(nemesis: str, shell: str,
                                                     url: str) -> None:
    # ``url``: the test server is real (the nemesis starts servers of its own from the same
    # binary); this test skips where there is none
    report = run_phase(Phase(nemesis, processes=3, threads=2, names=2, lease=LEASE,
                             seconds=SECONDS, shell=shell))
    print(format_rows([(f"server/{shell}", nemesis, report)]))
    assert report.holds > 0 and report.writes > 0
    assert report.token_regressions == [], report
    assert report.stale_writes == [], report
    assert report.overlaps == [], report
    if nemesis != "none":
        (fault, recovery), = report.recoveries
        assert fault.kind == nemesis and recovery is not None  # the lock was taken again


@pytest.mark.parametrize("shell", ["threads", "asyncio"])
@pytest.mark.parametrize("nemesis", [n for n in NEMESES if applies(n, "redlock")])
def test_a_short_redlock_schedule_keeps_what_safety_promises(nemesis: str, shell: str,
                                                             url: str) -> None:
    """Three masters. docs/safety.rst promises no two beliefs at once under every nemesis
    here, a minority of masters down and every master restarted empty included (a restarted
    master sits out a lease before it votes); it promises nothing of the tokens (each master
    counts on its own), so what the fenced store took is printed, not asserted."""
    report = run_phase(Phase(nemesis, processes=3, threads=2, names=2, lease=LEASE,
                             seconds=REDLOCK_SECONDS, shell=shell, topology="redlock"))
    print(format_rows([(f"redlock/{shell}", nemesis, report)]))
    assert report.holds > 0 and report.writes > 0
    assert report.overlaps == [], report
    assert not failed(f"redlock/{shell}", report)
    if nemesis != "none":
        (fault, recovery), = report.recoveries
        assert fault.kind == nemesis and recovery is not None


def _sentinel_schedule() -> List[Tuple[str, str, str]]:
    """(topology, nemesis, shell): every nemesis on both Sentinel topologies, in one shell
    each, the shells taking turns (a Sentinel set takes seconds to start, and the two shells
    share the session and its watchdog: the single-server schedule covers both shells under
    every nemesis); the failover, the fault only Sentinel has, in both."""
    schedule = []
    for topology in ("sentinel", "sentinel-acked"):
        nemeses = [n for n in NEMESES if applies(n, topology)]
        for i, nemesis in enumerate(nemeses):
            shells = ["threads", "asyncio"] if nemesis == "failover" else [SHELLS[i % 2]]
            schedule += [(topology, nemesis, shell) for shell in shells]
    return schedule


SHELLS = ("threads", "asyncio")


@pytest.mark.parametrize("topology, nemesis, shell", _sentinel_schedule())
def test_a_short_sentinel_schedule_keeps_what_safety_promises(topology: str, nemesis: str,
                                                              shell: str, url: str) -> None:
    """A master, two replicas, three sentinels. docs/safety.rst promises increasing tokens and
    no stale write under every nemesis, and no two beliefs at once under every nemesis but a
    failover whose grants waited for no replica: there the old master, continued, grants to
    the clients still connected to it until the sentinels demote it (``DOCUMENTED_OVERLAPS``:
    counted and printed). With ``min_replicas`` equal to the replicas (``sentinel-acked``) no
    overlap at all: the old master has no replica left to acknowledge its grants."""
    label = f"{topology}/{shell}"
    report = run_phase(Phase(nemesis, processes=3, threads=2, names=2, lease=LEASE,
                             seconds=SECONDS, shell=shell, topology=topology))
    print(format_rows([(label, nemesis, report)]))
    assert report.holds > 0 and report.writes > 0
    assert report.token_regressions == [] and report.stale_writes == [], report
    assert not failed(label, report, nemesis), report
    if (topology, nemesis) not in DOCUMENTED_OVERLAPS:
        assert report.overlaps == [], report
    if nemesis != "none":
        (fault, recovery), = report.recoveries
        assert fault.kind == nemesis and recovery is not None


def test_what_fails_a_row_follows_what_each_topology_promises() -> None:
    from distlock.testing.history import Hold, Report, Write

    stale = Report(holds=2, writes=2, stale_writes=[Write("n", 1, 0.0, True)])
    assert failed("server/threads", stale) and failed("server", stale)
    assert failed("sentinel/threads", stale, "failover")
    assert not failed("redlock/asyncio", stale)  # Redlock promises no token order
    a = Hold("n", 1, 0.0, 2.0, "released", "p1")
    b = Hold("n", 2, 1.0, 3.0, "released", "p2")
    overlap = Report(holds=2, writes=2, overlaps=[(a, b)])
    assert not failed("sentinel/asyncio", overlap, "failover")  # documented: counted
    assert failed("sentinel-acked/asyncio", overlap, "failover")
    assert failed("sentinel/threads", overlap, "partition") and failed("sentinel", overlap)


def test_the_command_prints_its_table_and_refuses_bad_input(url: str, tmp_path: Any) -> None:
    drawn = tmp_path / "timelines"
    result = subprocess.run(
        [sys.executable, "-m", "distlock.testing.nemesis", "--nemesis", "none", "--shell",
         "threads", "--topology", "server", "--processes", "2", "--threads", "1", "--seconds", "1",
         "--lease", "0.3", "--timeline", str(drawn)],
        capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    header, row = result.stdout.strip().splitlines()
    assert header.split()[:3] == ["topology", "nemesis", "holds"]
    assert row.split()[:2] == ["server/threads", "none"] and int(row.split()[2]) > 0
    (page,) = drawn.iterdir()  # one picture per phase
    assert page.name == "server-threads-none-1.html"
    assert page.read_text(encoding="utf-8").count('class="hold') == int(row.split()[2])
    bad = subprocess.run([sys.executable, "-m", "distlock.testing.nemesis", "--processes", "0"],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "processes must be at least 1" in bad.stderr
    bad = subprocess.run([sys.executable, "-m", "distlock.testing.nemesis", "--nemesis",
                          "minority-down", "--topology", "server"],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "minority-down needs --topology redlock" in bad.stderr


def test_a_phase_refuses_bad_input() -> None:
    with pytest.raises(ValueError, match="nemesis must be one of"):
        Phase("flood")
    with pytest.raises(ValueError, match="shell must be"):
        Phase("none", shell="trio")
    with pytest.raises(TypeError, match="threads must be an int"):
        Phase("none", threads=2.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="needs seconds >= 4 leases"):
        Phase("pause", lease=1.0, seconds=2.0)
    with pytest.raises(ValueError, match="lease and seconds must be > 0"):
        Phase("none", lease=0)
    with pytest.raises(ValueError, match="topology must be one of"):
        Phase("none", topology="etcd")
    with pytest.raises(ValueError, match="minority-down does not apply to server"):
        Phase("minority-down", topology="server")
    with pytest.raises(ValueError, match="failover does not apply to redlock"):
        Phase("failover", topology="redlock")
