"""``python -m distlock.testing.nemesis``: worker processes contend for a few names while a nemesis
breaks things, every belief and fenced write is recorded, and ``check_history`` reads the record.

Each phase starts a private server, K worker processes (``_nemesis_worker``) of T threads, or of
T tasks with ``--shell asyncio``, each process behind a ``FaultProxy`` of its own (so that one
holder can be cut off alone), and lets them run while one nemesis acts in the middle. A
fault aimed at one worker is aimed at a holder: the worker whose pid a lock's hash names
(``:i``) when the fault starts.

- ``none``: nothing (the baseline);
- ``partition``: a holder's proxies blackhole both ways for two leases, then heal;
- ``pause``: a holder is stopped (SIGSTOP) for two leases, then continued (a GC pause);
- ``kill``: a holder is killed (SIGKILL);
- ``restart``: the server is killed and started again, empty (no persistence);
- ``restart-persisted`` (one server only): the same, with ``appendonly yes`` and ``appendfsync
  always``: the server comes back with every hold it had acknowledged;
- ``delay``: every proxy delays every chunk by a fifth of a lease, for two leases;
- ``drop-replies``: a holder's requests reach the server, their replies are lost, for two
  leases;
- ``minority-down`` (Redlock only): one of the three masters is killed, and two leases later
  started again, empty, on its port (it sits out a lease before it votes again:
  docs/guides/redlock.rst);
- ``failover`` (Sentinel, Cluster): the master (under Cluster, the master of the first name's
  slot) is paused (SIGSTOP) until a replica of it is promoted, then continued: for a moment it
  is a second master, and the clients whose connections to it stayed open talk to it until it
  is demoted (the split brain of docs/safety.rst). The fault heals when the old master is a
  replica of the new one again (the sentinels wait 8 s before they demote it; a cluster node
  learns the new epoch from its peers at once);
- ``reshard`` (Cluster only): the first name's slot moves, with its keys, to another master
  (as ``redis-cli --cluster reshard`` moves it), while it is held and waited for.

A phase lasts ``--seconds``, and at least ``after_heal`` (four leases, 2 s or more) after its
fault healed: the workers are told when to stop once the fault is over. Its fault starts once a
first hold has been recorded, and the phase goes on for a lease after the first hold that began
after the heal has been recorded (each wait at most ``HOLD_BOUND``): on a loaded machine the
workers may be slow to start, or to take the lock again, and a phase that ended first would
prove nothing.

Five topologies (``--topology``): ``server``, one private server; ``sentinel``, a master, two
replicas and three sentinels (``distlock.testing.sentinel``), whose workers' locks wait for no
replica; ``sentinel-acked``, the same with ``min_replicas=2``, every replica; ``cluster``, three
masters and three replicas (``distlock.testing.cluster``); ``redlock``, three independent
masters. Each worker reaches each data node through a proxy of its own, so a partition cuts one
worker off from every node. Sentinel and Cluster name the nodes' own addresses, which would
bypass the proxies: each worker maps them to its own proxies (its Sentinel's
``discover_master``; its cluster client's ``address_remap``, which distlock applies to MOVED and
ASK replies too), and reaches the sentinels directly. Under ``redlock``, ``restart`` restarts
every master at once, empty; under Sentinel, the master, and under Cluster, the first name's
master, each empty and fast enough that no failover starts.

Two workloads (``--workload``; both by default): ``lock``, the workers take ``DistLock`` holds;
``election``, they campaign (``DistElection``, a lease's timeout), write with the epoch while
they lead, and resign. A leadership is the exclusive hold of its name, recorded and checked as
one: no two leaders believe at once, epochs increase in the order leaderships began, the store
takes no write out of order. An election refuses a Redlock quorum (its tokens are no epochs),
so ``election`` runs on every topology but ``redlock`` (``supports``).

Each phase prints one row: the holds, the writes, the belief overlaps, the tokens that went
backwards, the stale writes the fenced store took, and the longest time from a fault's healing
to the next hold. The exit status is 1 if a phase broke what docs/safety.rst promises on its
topology (``failed``): an overlap, except where the table documents one (``DOCUMENTED_OVERLAPS``:
a Sentinel failover without ``min_replicas``); a regression or a stale write where the topology
promises increasing tokens (``PROMISES_TOKENS``: not Redlock, whose token is the largest of its
quorum's counters). Only servers and proxies started here, on 127.0.0.1, get any traffic; every
wait is bounded.
"""

from __future__ import annotations

import argparse
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from ._nemesis_faults import act
from .cluster import Cluster
from .history import History, Report, check_history
from .proxy import FaultProxy
from .sentinel import SentinelSet
from .server import RedisServer
from .timeline import write_timeline

__all__ = ["NEMESES", "TOPOLOGIES", "WORKLOADS", "PROMISES_TOKENS", "DOCUMENTED_OVERLAPS", "Phase",
           "applies", "supports", "run_phase", "after_heal", "failed", "main"]

NEMESES = ("none", "partition", "pause", "kill", "restart", "restart-persisted", "delay",
           "drop-replies", "minority-down", "failover", "reshard")
TOPOLOGIES = ("server", "sentinel", "sentinel-acked", "cluster", "redlock")
#: What the workers contend with: ``DistLock``, or ``DistElection`` (``supports``)
WORKLOADS = ("lock", "election")
#: The topologies whose tokens increase in grant order (docs/safety.rst): there a token that
#: went backwards, or a stale write the fenced store took, is a failure.
PROMISES_TOKENS = ("server", "sentinel", "sentinel-acked", "cluster")
#: (topology, nemesis) where docs/safety.rst says two holders can believe at once: a failover
#: whose grants waited for no replica. There overlaps are counted, not a failure.
DOCUMENTED_OVERLAPS = (("sentinel", "failover"), ("cluster", "failover"))
#: How many masters the ``redlock`` topology runs (a minority of them is one).
REDLOCK_MASTERS = 3
#: How long a phase waits at most for its first hold, and for the first after its fault healed
#: (seconds)
HOLD_BOUND = 30.0


def applies(nemesis: str, topology: str) -> bool:
    """Whether ``nemesis`` can act on ``topology``: ``minority-down`` needs masters to take a
    minority of (Redlock), ``failover`` a replica to promote (Sentinel, Cluster), ``reshard``
    slots (Cluster), ``restart-persisted`` one server with an append-only file; every other
    nemesis acts on every topology."""
    if nemesis == "minority-down":
        return topology == "redlock"
    if nemesis == "failover":
        return topology.startswith("sentinel") or topology == "cluster"
    if nemesis == "reshard":
        return topology == "cluster"
    if nemesis == "restart-persisted":
        return topology == "server"
    return True


def supports(workload: str, topology: str) -> bool:
    """Whether ``workload`` runs on ``topology``: an election's epochs must strictly increase,
    which a Redlock quorum's tokens do not, so ``DistElection`` refuses one (TypeError)."""
    return not (workload == "election" and topology == "redlock")


class Phase:
    """One nemesis against K processes of T threads (or tasks), for ``seconds``."""

    def __init__(self, nemesis: str, processes: int = 3, threads: int = 2, names: int = 2,
                 lease: float = 0.5, seconds: float = 4.0, shell: str = "threads",
                 topology: str = "server", workload: str = "lock") -> None:
        if nemesis not in NEMESES:
            raise ValueError(f"nemesis must be one of {', '.join(NEMESES)}, not {nemesis!r}")
        if shell not in ("threads", "asyncio"):
            raise ValueError(f"shell must be 'threads' or 'asyncio', not {shell!r}")
        if topology not in TOPOLOGIES:
            raise ValueError(f"topology must be one of {', '.join(TOPOLOGIES)}, not {topology!r}")
        if not applies(nemesis, topology):
            raise ValueError(f"{nemesis} does not apply to {topology}: minority-down needs "
                             "redlock (a minority of masters), failover a sentinel topology or "
                             "cluster, reshard cluster, restart-persisted server")
        if workload not in WORKLOADS:
            raise ValueError(f"workload must be one of {', '.join(WORKLOADS)}, not {workload!r}")
        if not supports(workload, topology):
            raise ValueError(f"the {workload} workload does not run on {topology}: an election's "
                             "epochs must strictly increase, and a Redlock quorum's tokens do not")
        for what, value in (("processes", processes), ("threads", threads), ("names", names)):
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"{what} must be an int, not {type(value).__name__}")
            if value < 1:
                raise ValueError(f"{what} must be at least 1, not {value}")
        if not lease > 0 or not seconds > 0:
            raise ValueError("lease and seconds must be > 0")
        if nemesis != "none" and seconds < 4 * lease:
            raise ValueError(f"{nemesis} needs seconds >= 4 leases ({4 * lease:g})")
        self.nemesis = nemesis
        self.processes = processes
        self.threads = threads
        self.names = [f"nemesis:{i}" for i in range(names)]
        self.lease = float(lease)
        self.seconds = float(seconds)
        self.shell = shell
        self.topology = topology
        self.workload = workload

    @property
    def label(self) -> str:
        """What its row says in the topology column: ``server/threads``, say, and
        ``server/threads/election`` for the election workload."""
        kind = "" if self.workload == "lock" else f"/{self.workload}"
        return f"{self.topology}/{self.shell}{kind}"


class _Workers:
    """The server, the workers and their proxies of one phase; all ended by ``close``."""

    def __init__(self, phase: Phase, workdir: str) -> None:
        self.phase = phase
        #: when the workers' run ends (``tell``)
        self.until = 0.0
        #: the data nodes' own addresses, and the worker a fault was aimed at (``_nemesis_faults``)
        self.nodes: List[Tuple[str, int]] = []
        self.victim = 0
        self.servers: List[RedisServer] = []
        self.sentinel: Optional[SentinelSet] = None
        self.cluster: Optional[Cluster] = None
        #: per worker, its proxies: one per server
        self.proxies: List[List[FaultProxy]] = []
        self.procs: List[subprocess.Popen[bytes]] = []
        self.logs: List[str] = []
        self.history_path = os.path.join(workdir, "history.jsonl")
        self.history = History(self.history_path)
        try:
            if phase.topology.startswith("sentinel"):
                self.sentinel = SentinelSet.start()
                nodes = [node.addr for node in self.sentinel.nodes]
            elif phase.topology == "cluster":
                self.cluster = Cluster.start()
                nodes = list(self.cluster.addrs)
            else:
                # restart-persisted: every write in the append-only file before it is
                # acknowledged, so that a SIGKILL loses nothing
                aof = ["--appendonly", "yes", "--appendfsync", "always"] \
                    if phase.nemesis == "restart-persisted" else []
                for _ in range(REDLOCK_MASTERS if phase.topology == "redlock" else 1):
                    self.servers.append(RedisServer(extra_args=aof, die_with_parent=True))
                nodes = [("127.0.0.1", server.port) for server in self.servers]
            self.nodes = nodes
            if phase.topology == "redlock":
                # a master votes once it has been up for a try's lease, as ``INFO``'s whole
                # seconds tell: wait that out, or the first second of the run grants nothing
                time.sleep(phase.lease + 1.0)
            for _ in range(phase.processes):
                proxies: List[FaultProxy] = []
                self.proxies.append(proxies)
                for host, port in nodes:
                    proxies.append(FaultProxy(host, port))
                config: Dict[str, Any] = {
                    "urls": [p.url for p in proxies], "names": phase.names,
                    "threads": phase.threads, "lease": phase.lease, "seconds": phase.seconds,
                    "shell": phase.shell, "workload": phase.workload,
                    "history": self.history_path,
                    "store": os.path.join(workdir, "store")}
                if self.sentinel is not None or self.cluster is not None:
                    config["remap"] = [[h, p, proxy.host, proxy.port]
                                       for (h, p), proxy in zip(nodes, proxies)]
                    config["cluster"] = self.cluster is not None
                if self.sentinel is not None:
                    config["sentinels"] = [list(a) for a in self.sentinel.sentinel_addrs]
                    if phase.topology == "sentinel-acked":
                        config["min_replicas"] = SentinelSet.REPLICAS
                log = open(os.path.join(workdir, f"worker-{len(self.procs)}.log"), "wb")
                self.logs.append(log.name)
                with log:  # the worker keeps its own descriptor: distlock's warnings go there
                    proc = subprocess.Popen(
                        [sys.executable, "-m", "distlock.testing._nemesis_worker",
                         json.dumps(config)],
                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log)
                self.procs.append(proc)
            for proc in self.procs:
                assert proc.stdout is not None
                ready = select.select([proc.stdout], [], [], 60)[0]
                if not ready or proc.stdout.readline().strip() != b"ready":
                    raise RuntimeError(f"a nemesis worker did not start (status {proc.poll()})")
            # one end for all: a worker that was slow to start must not end early
            self.tell(time.monotonic() + phase.seconds)
        except BaseException:
            self.close()
            raise

    def tell(self, until: float) -> None:
        """Tell every worker its run ends at ``until`` (time.monotonic(), one clock for the
        host; ``inf``: not before it is told again). A worker the nemesis killed or paused
        reads it when it can, or never."""
        self.until = until
        line = f"{until!r}\n".encode()
        for proc in self.procs:
            try:
                assert proc.stdin is not None
                proc.stdin.write(line)
                proc.stdin.flush()
            except (OSError, ValueError):
                pass

    def wait(self, timeout: float, killed: Optional[int]) -> None:
        """Wait for the workers to finish their run; a worker that failed (other than the one
        the nemesis killed) is an error, with the tail of its log."""
        for proc in self.procs:
            try:
                assert proc.stdin is not None
                proc.stdin.close()  # told everything: its end of the run is fixed now
            except (OSError, ValueError):
                pass
        deadline = time.monotonic() + timeout
        for i, proc in enumerate(self.procs):
            try:
                status = proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                # its stacks into its log before it goes: its threads' (SIGUSR1,
                # faulthandler), then its tasks' (SIGUSR2, asyncio workers; after the loop
                # closed, SIGUSR2 would end the worker, hence second)
                for sig in (signal.SIGUSR1, signal.SIGUSR2):
                    proc.send_signal(sig)
                    time.sleep(0.3)
                proc.kill()
                proc.wait(10)
                status = None
            if status != 0 and i != killed:
                with open(self.logs[i], encoding="utf-8", errors="replace") as fh:
                    tail = fh.read()[-12000:]
                raise RuntimeError(f"nemesis worker {i} "
                                   f"{'hung' if status is None else f'exited with {status}'}:"
                                   f"\n{tail}")

    def close(self) -> None:
        try:
            for proc in self.procs:
                if proc.poll() is None:
                    try:
                        proc.send_signal(signal.SIGCONT)
                        proc.kill()
                    except OSError:
                        pass
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    pass  # SIGKILLed: the kernel ends it; nothing more to do from here
                for pipe in (proc.stdin, proc.stdout):
                    if pipe is not None and not pipe.closed:
                        pipe.close()
        finally:
            try:
                for proxies in self.proxies:
                    for proxy in proxies:
                        proxy.close()
            finally:
                for server in self.servers:
                    server.stop()
                if self.sentinel is not None:
                    self.sentinel.close()
                if self.cluster is not None:
                    self.cluster.close()


def run_phase(phase: Phase, timeline: Optional[str] = None) -> Report:
    """Run one phase (see the module's docstring) and check its history; with ``timeline``, a
    path, draw the history there too (``distlock.testing.timeline``)."""
    with tempfile.TemporaryDirectory(prefix="distlock-nemesis-") as workdir:
        workers = _Workers(phase, workdir)
        try:
            if phase.nemesis != "none":
                time.sleep(min(phase.lease, phase.seconds / 4))
                # the lock must be seen taken again after the fault healed, however long the
                # fault takes (a failover: seconds): the run goes on until it is over
                planned = workers.until
                workers.tell(float("inf"))
                _hold_recorded(workers.history, float("-inf"), HOLD_BOUND)
                start, end, detail = act(phase.nemesis, workers, phase.lease)
                workers.history.fault(phase.nemesis, start, end, detail)
                seen = _hold_recorded(workers.history, end, HOLD_BOUND)
                workers.tell(max(planned, end + after_heal(phase.lease),
                                 (seen or time.monotonic()) + phase.lease))
            workers.wait(max(0.0, workers.until - time.monotonic()) + 30 * phase.lease + 10,
                         workers.victim if phase.nemesis == "kill" else None)
        finally:
            workers.close()
        if timeline is not None:
            write_timeline(workers.history, timeline,
                           f"{phase.label} {phase.nemesis}: {phase.processes} processes x "
                           f"{phase.threads}, lease {phase.lease:g} s")
        return check_history(workers.history)


def _hold_recorded(history: History, since: float, bound: float) -> Optional[float]:
    """Wait until ``history`` has recorded a hold that began at ``since`` or later (a hold is
    recorded when it ends), at most ``bound`` seconds; return when it was seen, or None."""
    deadline = time.monotonic() + bound
    while True:
        if any(hold.start >= since for hold in history.holds()):
            return time.monotonic()
        if time.monotonic() >= deadline:
            return None
        time.sleep(0.05)


def after_heal(lease: float) -> float:
    """How long a phase goes on at least after its fault healed (seconds): four leases, and
    at least two seconds, room for every waiter to take the lock again (docs/safety.rst)."""
    return max(2.0, 4 * lease)


def failed(topology: str, report: Report, nemesis: Optional[str] = None) -> bool:
    """Whether ``report`` breaks what docs/safety.rst promises on ``topology`` (``server``,
    ``redlock``...; a row's label, ``redlock/asyncio``, is taken too) under ``nemesis``: no
    belief overlaps, except where the table documents them (``DOCUMENTED_OVERLAPS``); no token
    regression and no stale write where tokens are promised to increase."""
    topology = topology.split("/")[0]
    if report.overlaps and (topology, nemesis) not in DOCUMENTED_OVERLAPS:
        return True
    if topology in PROMISES_TOKENS:
        return bool(report.token_regressions or report.stale_writes)
    return False


def _row(cells: Sequence[str], widths: Sequence[int]) -> str:
    return "  ".join(c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in
                     enumerate(zip(cells, widths)))


HEADER = ("topology", "nemesis", "holds", "writes", "overlaps", "regressions", "stale writes",
          "longest recovery")


def format_rows(rows: List[Tuple[str, str, Report]]) -> str:
    """The table the command prints: one row per (topology, nemesis)."""
    cells = [HEADER]
    for topology, nemesis, report in rows:
        longest = report.longest_recovery
        cells.append((topology, nemesis, str(report.holds), str(report.writes),
                      str(len(report.overlaps)), str(len(report.token_regressions)),
                      str(len(report.stale_writes)),
                      "-" if longest is None else f"{longest:.3f} s"))
    widths = [max(len(row[i]) for row in cells) for i in range(len(HEADER))]
    return "\n".join(_row(row, widths) for row in cells)


def main(argv: Optional[List[str]] = None,
         out: Callable[[str], None] = print) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m distlock.testing.nemesis",
        description="Contend for locks (or leaderships) under faults, record every belief "
                    "and fenced write, and check the record.")
    parser.add_argument("--nemesis", action="append", choices=NEMESES,
                        help="a nemesis to run (repeat it; default: all)")
    parser.add_argument("--shell", action="append", choices=("threads", "asyncio"),
                        help="which shell the workers use (repeat it; default: both)")
    parser.add_argument("--topology", action="append", choices=TOPOLOGIES,
                        help="a topology to run on (repeat it; default: all)")
    parser.add_argument("--workload", action="append", choices=WORKLOADS,
                        help="what the workers contend with: lock, election (not on redlock); "
                             "repeat it; default: both")
    parser.add_argument("--processes", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--names", type=int, default=2)
    parser.add_argument("--lease", type=float, default=0.5)
    parser.add_argument("--seconds", type=float, default=3.0, help="each phase's length")
    parser.add_argument("--minutes", type=float, default=None,
                        help="run the schedule again and again for this long (a release run)")
    parser.add_argument("--timeline", metavar="DIR", default=None,
                        help="draw each phase's history into DIR, one HTML file per phase")
    args = parser.parse_args(argv)
    nemeses = args.nemesis or list(NEMESES)
    shells = args.shell or ["threads", "asyncio"]
    topologies = args.topology or list(TOPOLOGIES)
    workloads = args.workload or list(WORKLOADS)
    try:
        phases = [Phase(n, args.processes, args.threads, args.names, args.lease,
                        args.seconds, s, t, w) for t in topologies for w in workloads
                  for s in shells for n in nemeses if applies(n, t) and supports(w, t)]
    except (TypeError, ValueError) as exc:
        parser.error(str(exc))
    if not phases:
        parser.error("no nemesis given applies to a topology given (minority-down needs "
                     "--topology redlock, failover --topology sentinel or sentinel-acked), or "
                     "no workload given runs on one (--workload election: not on redlock)")
    if args.timeline is not None:
        os.makedirs(args.timeline, exist_ok=True)
    rows: List[Tuple[str, str, Report]] = []
    errors: List[str] = []
    until = None if args.minutes is None else time.monotonic() + 60 * args.minutes
    while True:
        for phase in phases:
            drawn = None
            if args.timeline is not None:
                drawn = os.path.join(args.timeline, f"{phase.label.replace('/', '-')}-"
                                                    f"{phase.nemesis}-{len(rows) + 1}.html")
            try:
                rows.append((phase.label, phase.nemesis, run_phase(phase, drawn)))
            except Exception as exc:  # noqa: BLE001 - one phase's error does not end the run
                errors.append(f"ERROR {phase.label} {phase.nemesis}: {exc!r}")
        if until is None or time.monotonic() >= until:
            break
    out(format_rows(rows))
    for error in errors:  # a worker that failed or hung, a topology that did not heal
        out(error)
    broken = [r for r in rows if failed(r[0], r[2], r[1])]
    for topology, nemesis, report in broken:
        out(f"FAILED {topology} {nemesis}: {report}")
        for a, b in report.overlaps[:5]:
            out(f"  overlap on {a.name}: {a.who} token {a.token} [{a.start:.3f}, {a.end}] ({a.cause}) and "
                f"{b.who} token {b.token} [{b.start:.3f}, {b.end}] ({b.cause})")
    return 1 if broken or errors else 0


if __name__ == "__main__":
    sys.exit(main())
