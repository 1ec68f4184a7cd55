"""``python -m distlock.testing.nemesis``: worker processes contend for a few names while a nemesis
breaks things, every belief and fenced write is recorded, and ``check_history`` reads the record.

Each phase starts a private server, K worker processes (``_nemesis_worker``) of T threads, or of
T tasks with ``--shell asyncio``, each process behind a ``FaultProxy`` of its own (so that one
holder can be cut off alone), and lets them run while one nemesis acts in the middle:

- ``none``: nothing (the baseline);
- ``partition``: one worker's proxy blackholes both ways for two leases, then heals;
- ``pause``: one worker is stopped (SIGSTOP) for two leases, then continued (a GC pause);
- ``kill``: one worker is killed (SIGKILL);
- ``restart``: the server is killed and started again, empty (no persistence);
- ``delay``: every proxy delays every chunk by a fifth of a lease, for two leases;
- ``drop-replies``: one worker's requests reach the server, their replies are lost, for two
  leases.

Each phase prints one row: the holds, the writes, the belief overlaps, the tokens that went
backwards, the stale writes the fenced store took, and the longest time from a fault's healing
to the next hold. The exit status is 1 if a phase found an overlap, a regression or a stale
write. Only servers and proxies started here, on 127.0.0.1, get any traffic; every wait is
bounded. This covers the single-server topology.
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
from typing import Callable, List, Optional, Sequence, Tuple

from .history import History, Report, check_history
from .proxy import FaultProxy
from .server import RedisServer

__all__ = ["NEMESES", "Phase", "run_phase", "main"]

NEMESES = ("none", "partition", "pause", "kill", "restart", "delay", "drop-replies")


class Phase:
    """One nemesis against K processes of T threads (or tasks), for ``seconds``."""

    def __init__(self, nemesis: str, processes: int = 3, threads: int = 2, names: int = 2,
                 lease: float = 0.5, seconds: float = 4.0, shell: str = "threads") -> None:
        if nemesis not in NEMESES:
            raise ValueError(f"nemesis must be one of {', '.join(NEMESES)}, not {nemesis!r}")
        if shell not in ("threads", "asyncio"):
            raise ValueError(f"shell must be 'threads' or 'asyncio', not {shell!r}")
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


class _Workers:
    """The server, the workers and their proxies of one phase; all ended by ``close``."""

    def __init__(self, phase: Phase, workdir: str) -> None:
        self.phase = phase
        self.server = RedisServer(die_with_parent=True)
        self.proxies: List[FaultProxy] = []
        self.procs: List[subprocess.Popen[bytes]] = []
        self.logs: List[str] = []
        self.history_path = os.path.join(workdir, "history.jsonl")
        self.history = History(self.history_path)
        try:
            for _ in range(phase.processes):
                proxy = FaultProxy("127.0.0.1", self.server.port)
                self.proxies.append(proxy)
                config = {"url": proxy.url, "names": phase.names, "threads": phase.threads,
                          "lease": phase.lease, "seconds": phase.seconds, "shell": phase.shell,
                          "history": self.history_path, "store": os.path.join(workdir, "store")}
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
            until = f"{time.monotonic() + phase.seconds!r}\n".encode()
            for proc in self.procs:
                assert proc.stdin is not None
                proc.stdin.write(until)
                proc.stdin.close()
        except BaseException:
            self.close()
            raise

    def wait(self, timeout: float, killed: Optional[int]) -> None:
        """Wait for the workers to finish their run; a worker that failed (other than the one
        the nemesis killed) is an error, with the tail of its log."""
        deadline = time.monotonic() + timeout
        for i, proc in enumerate(self.procs):
            try:
                status = proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
                status = None
            if status != 0 and i != killed:
                with open(self.logs[i], encoding="utf-8", errors="replace") as fh:
                    tail = fh.read()[-2000:]
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
                for proxy in self.proxies:
                    proxy.close()
            finally:
                self.server.stop()


def _act(nemesis: str, workers: _Workers, lease: float) -> Tuple[float, float, str]:
    """Do ``nemesis`` now; return (start, end, detail) of the fault."""
    span = 2 * lease
    victim = 0
    start = time.monotonic()
    if nemesis == "partition":
        workers.proxies[victim].blackhole()
        time.sleep(span)
        workers.proxies[victim].heal()
    elif nemesis == "drop-replies":
        workers.proxies[victim].drop_replies()
        time.sleep(span)
        workers.proxies[victim].heal()
    elif nemesis == "delay":
        for proxy in workers.proxies:
            proxy.delay(lease * 1000 / 5)
        time.sleep(span)
        for proxy in workers.proxies:
            proxy.heal()
    elif nemesis == "pause":
        workers.procs[victim].send_signal(signal.SIGSTOP)
        time.sleep(span)
        workers.procs[victim].send_signal(signal.SIGCONT)
    elif nemesis == "kill":
        workers.procs[victim].kill()
    elif nemesis == "restart":
        workers.server.restart()
    return start, time.monotonic(), f"worker {victim}" if nemesis not in (
        "delay", "restart") else "all"


def run_phase(phase: Phase) -> Report:
    """Run one phase (see the module's docstring) and check its history."""
    with tempfile.TemporaryDirectory(prefix="distlock-nemesis-") as workdir:
        workers = _Workers(phase, workdir)
        try:
            if phase.nemesis != "none":
                time.sleep(min(phase.lease, phase.seconds / 4))
                start, end, detail = _act(phase.nemesis, workers, phase.lease)
                workers.history.fault(phase.nemesis, start, end, detail)
            workers.wait(phase.seconds + 30 * phase.lease + 10,
                         0 if phase.nemesis == "kill" else None)
        finally:
            workers.close()
        return check_history(workers.history)


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
        description="Contend for locks under faults, record every belief and fenced write, "
                    "and check the record.")
    parser.add_argument("--nemesis", action="append", choices=NEMESES,
                        help="a nemesis to run (repeat it; default: all)")
    parser.add_argument("--shell", action="append", choices=("threads", "asyncio"),
                        help="which shell the workers use (repeat it; default: both)")
    parser.add_argument("--processes", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--names", type=int, default=2)
    parser.add_argument("--lease", type=float, default=0.5)
    parser.add_argument("--seconds", type=float, default=3.0, help="each phase's length")
    parser.add_argument("--minutes", type=float, default=None,
                        help="run the schedule again and again for this long (a release run)")
    args = parser.parse_args(argv)
    nemeses = args.nemesis or list(NEMESES)
    shells = args.shell or ["threads", "asyncio"]
    try:
        phases = [Phase(n, args.processes, args.threads, args.names, args.lease,
                        args.seconds, s) for s in shells for n in nemeses]
    except (TypeError, ValueError) as exc:
        parser.error(str(exc))
    rows: List[Tuple[str, str, Report]] = []
    until = None if args.minutes is None else time.monotonic() + 60 * args.minutes
    while True:
        for phase in phases:
            rows.append((f"server/{phase.shell}", phase.nemesis, run_phase(phase)))
        if until is None or time.monotonic() >= until:
            break
    out(format_rows(rows))
    failed = [r for r in rows if not r[2].ok]
    for topology, nemesis, report in failed:
        out(f"FAILED {topology} {nemesis}: {report}")
        for a, b in report.overlaps[:5]:
            out(f"  overlap on {a.name}: {a.who} token {a.token} [{a.start:.3f}, {a.end}] ({a.cause}) and "
                f"{b.who} token {b.token} [{b.start:.3f}, {b.end}] ({b.cause})")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
