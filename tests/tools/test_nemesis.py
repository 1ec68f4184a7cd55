"""``python -m distlock.testing.nemesis``: a short schedule of every nemesis on every topology
(one server, Sentinel with and without ``min_replicas``, Redis Cluster, Redlock), checked by
``check_history`` against what docs/safety.rst promises on each.

On one server, under every nemesis, a restart without persistence included, no two processes,
threads or tasks believe they hold one name at once: the session stops believing when the
server's FIN arrives, before the fresh server can grant anything (docs/safety.rst, "A broken
connection suspends belief"). Sentinel and Cluster add a failover (their replicas are
asynchronous: without ``min_replicas`` two holders are documented, and counted), and Cluster a
reshard that migrates the keys (no two holders). The election workload (``DistElection``) runs
a few phases of its own, on one server, Sentinel and Cluster: a leadership is checked as a hold
(no two leaders believe at once, epochs increase in the order leaderships began, no stale
write), and Redlock is refused.

Only the nemesis' own servers and proxies on 127.0.0.1 get traffic; each phase is bounded.
"""

from __future__ import annotations

import subprocess
import sys
from typing import Any, List, Tuple

import pytest

from distlock.testing.history import Report
from distlock.testing.nemesis import (
    DOCUMENTED_OVERLAPS,
    NEMESES,
    PROMISES_TOKENS,
    TOPOLOGIES,
    WORKLOADS,
    Phase,
    applies,
    failed,
    format_rows,
    run_phase,
    supports,
)

pytestmark = [pytest.mark.real_redis, pytest.mark.slow]

LEASE = 0.4
SECONDS = 2.0


SHELLS = ("threads", "asyncio")


def schedule() -> List[Tuple[str, str, str]]:
    """(topology, nemesis, shell): every nemesis on every topology it applies to, once, in one
    shell, the shells taking turns (and starting one apart from one topology to the next, so
    that each nemesis meets both shells across the topologies). The two shells keep their
    holds in one session and one watchdog: what a nemesis does to belief is the same in both,
    and the command runs both by default (docs/safety.rst shows such runs). This keeps CI's
    schedule under its 8 minutes: a Sentinel failover alone takes 20 s or more."""
    found = []
    for offset, topology in enumerate(TOPOLOGIES):
        nemeses = [n for n in NEMESES if applies(n, topology)]
        found += [(topology, nemesis, SHELLS[(offset + i) % 2]) for i, nemesis in enumerate(nemeses)]
    return found


#: The phase length per topology: a restarted Redlock master votes once INFO's whole-second
#: uptime reaches the lease, about a second after a restart, which a 2 s phase leaves too
#: little room after on a loaded machine.
SECONDS_ON = {"redlock": 3.0}


@pytest.mark.parametrize("topology, nemesis, shell", schedule())
def test_a_short_schedule_keeps_what_safety_promises(topology: str, nemesis: str, shell: str,
                                                     url: str) -> None:
    """What docs/safety.rst promises, topology by topology (``failed``): no two beliefs at
    once, except where the table documents them (a failover whose grants waited for no
    replica: counted and printed); increasing tokens and no stale write wherever tokens are
    promised (all but Redlock, whose token is the largest of its quorum's counters: printed,
    not asserted). Every fault heals and the lock is taken again after it."""
    # ``url``: the test server is real (the nemesis starts servers of its own from the same
    # binary); this test skips where there is none
    _run_and_check(topology, nemesis, shell, "lock")


#: (topology, nemesis, shell) of the election workload's phases: a few, on each topology an
#: election runs on, a fault aimed at a leader among them (``_nemesis_faults._holder`` reads a
#: leader's pid before its value), well under a minute in all.
ELECTIONS = [("server", "partition", "threads"), ("server", "restart", "asyncio"),
             ("sentinel", "kill", "asyncio"), ("cluster", "reshard", "threads")]


@pytest.mark.parametrize("topology, nemesis, shell", ELECTIONS)
def test_elections_keep_one_believed_leader_and_increasing_epochs(topology: str, nemesis: str,
                                                                  shell: str, url: str) -> None:
    """The election workload: workers campaign with a short timeout, write with the epoch
    while they lead, and resign. A leadership is a hold: no two leaders believe at once, its
    epochs increase in the order leaderships began (``token_regressions``), and the fenced
    store takes no write out of order."""
    report = _run_and_check(topology, nemesis, shell, "election")
    assert report.token_regressions == [] and report.stale_writes == [], report


def _run_and_check(topology: str, nemesis: str, shell: str, workload: str) -> Report:
    phase = Phase(nemesis, processes=3, threads=2, names=2, lease=LEASE,
                  seconds=SECONDS_ON.get(topology, SECONDS), shell=shell, topology=topology,
                  workload=workload)
    label = phase.label
    report = run_phase(phase)
    print(format_rows([(label, nemesis, report)]))
    assert report.holds > 0 and report.writes > 0
    assert not failed(label, report, nemesis), report
    if (topology, nemesis) not in DOCUMENTED_OVERLAPS:
        assert report.overlaps == [], report
    if topology in PROMISES_TOKENS:
        assert report.token_regressions == [] and report.stale_writes == [], report
    if nemesis != "none":
        (fault, recovery), = report.recoveries
        assert fault.kind == nemesis and recovery is not None  # the lock was taken again
    return report


def test_elections_run_on_every_topology_but_redlock() -> None:
    assert WORKLOADS == ("lock", "election")
    assert [t for t in TOPOLOGIES if supports("election", t)] == [
        "server", "sentinel", "sentinel-acked", "cluster"]
    assert all(supports("lock", t) for t in TOPOLOGIES)
    assert {t for t, _, _ in ELECTIONS} == {"server", "sentinel", "cluster"}
    assert all(t in PROMISES_TOKENS and applies(n, t) for t, n, _ in ELECTIONS)
    assert Phase("none", topology="cluster", workload="election").label == \
        "cluster/threads/election"
    assert Phase("none", shell="asyncio").label == "server/asyncio"
    with pytest.raises(ValueError, match="election workload does not run on redlock"):
        Phase("none", topology="redlock", workload="election")
    with pytest.raises(ValueError, match="workload must be one of"):
        Phase("none", workload="queue")


def test_the_schedule_runs_every_nemesis_on_every_topology_and_both_shells() -> None:
    runs = schedule()
    assert {(t, n) for t, n, _ in runs} == {(t, n) for t in TOPOLOGIES for n in NEMESES
                                            if applies(n, t)}
    assert len(runs) == len({(t, n) for t, n, _ in runs})  # each once
    for nemesis in NEMESES:
        shells = {s for _, n, s in runs if n == nemesis}
        assert shells == set(SHELLS) or len([n for _, n, _ in runs if n == nemesis]) == 1


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
    header, row, elected = result.stdout.strip().splitlines()  # both workloads by default
    assert header.split()[:3] == ["topology", "nemesis", "holds"]
    assert row.split()[:2] == ["server/threads", "none"] and int(row.split()[2]) > 0
    assert elected.split()[:2] == ["server/threads/election", "none"]
    assert int(elected.split()[2]) > 0
    pages = sorted(drawn.iterdir())  # one picture per phase
    assert [p.name for p in pages] == ["server-threads-election-none-2.html",
                                       "server-threads-none-1.html"]
    assert pages[1].read_text(encoding="utf-8").count('class="hold') == int(row.split()[2])
    bad = subprocess.run([sys.executable, "-m", "distlock.testing.nemesis", "--processes", "0"],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "processes must be at least 1" in bad.stderr
    bad = subprocess.run([sys.executable, "-m", "distlock.testing.nemesis", "--nemesis",
                          "minority-down", "--topology", "server"],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "minority-down needs --topology redlock" in bad.stderr
    bad = subprocess.run([sys.executable, "-m", "distlock.testing.nemesis", "--workload",
                          "election", "--topology", "redlock"],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "--workload election: not on redlock" in bad.stderr


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


def test_a_worker_whose_nemesis_died_mid_fault_ends_its_run(monkeypatch: pytest.MonkeyPatch) -> None:
    """While a fault lasts a worker's run has no end (``inf``) until the nemesis tells it one;
    a pipe that closes first (the nemesis died) ends it at once, so no worker outlives it."""
    import io
    import time
    from types import SimpleNamespace

    from distlock.testing import _nemesis_worker

    plan = SimpleNamespace(until=0.0)
    monkeypatch.setattr("sys.stdin", io.StringIO("12.5\ninf\n"))
    _nemesis_worker._follow(plan)  # type: ignore[arg-type]
    assert plan.until <= time.monotonic()
    monkeypatch.setattr("sys.stdin", io.StringIO("inf\n42.0\n"))
    _nemesis_worker._follow(plan)  # type: ignore[arg-type]
    assert plan.until == 42.0


def test_a_phase_that_errs_is_reported_and_the_run_goes_on(monkeypatch: pytest.MonkeyPatch) -> None:
    """A topology that does not heal in time (or a worker that failed) ends its phase with an
    error: the command says so, prints every other row, and exits 1."""
    from distlock.testing import nemesis
    from distlock.testing.history import Report

    calls: List[str] = []

    def run_phase(phase: Phase, timeline: Any = None) -> Report:
        calls.append(phase.shell)
        if phase.shell == "threads":
            raise TimeoutError("promotion of a replica: not within 60 s")
        return Report(holds=3, writes=9)

    monkeypatch.setattr(nemesis, "run_phase", run_phase)
    lines: List[str] = []
    assert nemesis.main(["--topology", "server", "--nemesis", "none", "--workload", "lock"],
                        out=lines.append) == 1
    assert calls == ["threads", "asyncio"]
    assert "server/asyncio" in lines[0] and "server/threads" not in lines[0]
    assert lines[1].startswith("ERROR server/threads none: TimeoutError(")
