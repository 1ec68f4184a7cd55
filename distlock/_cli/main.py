"""The ``distlock`` command line (also ``python -m distlock``).

Subcommands: ``run`` (flock(1) across hosts; ``run --leader``: one leader at a time, ``leader``),
``status``, ``list``, ``top``, ``release --force``, ``demo`` and ``bench``. ``--url`` (or
``$DISTLOCK_URL``) names one server, or a Redis Cluster as
``redis+cluster://host:port[,host:port...]/``; on a cluster ``status``, ``list``, ``release`` and
``top`` SCAN every master and read each name on its slot's master (``servers.servers``). The exit
statuses, which follow sysexits(3) where one fits, are listed in ``exits``.
"""

from __future__ import annotations

import argparse
import math
import os
import signal
import sys
from typing import Callable, Dict, List, Optional, Sequence

import redis
from redis.exceptions import RedisClusterException

from .. import __version__
from .._core.errors import WrongKindError
from .._session.config import DEFAULT_URL
from .bench import cmd_bench, cmd_demo
from .connect import redact_url
from .exits import EXIT_CONFLICT, EXIT_SOFTWARE, EXIT_UNAVAILABLE, EXIT_WRONG_KIND, Fail, err, one_line
from .leader import cmd_leader
from .run import DEFAULT_KILL_AFTER, cmd_run
from .state import cmd_list, cmd_release, cmd_status
from .top import cmd_top

__all__ = ["main", "build_parser"]

#: ``distlock top``: the default and the shortest time between two refreshes.
DEFAULT_TOP_INTERVAL = 1.0
MIN_TOP_INTERVAL = 0.1


# --- argument types (argparse turns their ArgumentTypeError into exit 2) ----------------------

def _seconds(allow_zero: bool) -> Callable[[str], float]:
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
        if math.isnan(value) or math.isinf(value) or value < 0 or (value == 0 and not allow_zero):
            need = "a non-negative" if allow_zero else "a positive"
            raise argparse.ArgumentTypeError(f"must be {need}, finite number of seconds: {text!r}")
        return value

    return parse


def _exit_code(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an exit status: {text!r}") from None
    if not 0 <= value <= 255:
        raise argparse.ArgumentTypeError(f"exit status must be within 0..255: {text!r}")
    return value


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1: {text!r}")
    return value


def _interval(text: str) -> float:
    value = _seconds(False)(text)
    if value < MIN_TOP_INTERVAL:
        raise argparse.ArgumentTypeError(
            f"must be at least {MIN_TOP_INTERVAL:g} seconds: {text!r}")
    return value


def _name(text: str) -> str:
    if not text:
        raise argparse.ArgumentTypeError("a lock name must not be empty")
    return text


# --- the parser -------------------------------------------------------------------------------

def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--url", default=None, metavar="URL",
        help=f"Redis server URL (default: $DISTLOCK_URL, then {DEFAULT_URL})")

    parser = argparse.ArgumentParser(
        prog="distlock",
        description="threading's locks across processes and hosts, on Redis: run a command "
                    "under a lock, look at who holds what, break a stuck lock, see a demo.")
    parser.add_argument("--version", action="version", version=f"distlock {__version__}")
    sub = parser.add_subparsers(dest="command_name", metavar="COMMAND")
    sub.required = True

    run = sub.add_parser(
        "run", parents=[common], help="run a command while holding a lock (flock(1) across hosts)",
        description="Take the lock NAME, run COMMAND, release the lock when COMMAND ends, however "
                    "it ends. COMMAND's exit status is passed through. The fencing token of the "
                    "hold is in COMMAND's environment as DISTLOCK_TOKEN. With --leader, campaign "
                    "for the leadership of the election NAME instead: COMMAND runs on one host at "
                    "a time, and its epoch is in DISTLOCK_EPOCH.",
        usage="distlock run [--leader [--value TEXT]] NAME [options] -- COMMAND [ARGS...]")
    run.add_argument("name", metavar="NAME", type=_name, help="the lock's (or election's) name")
    run.add_argument("--leader", action="store_true",
                     help="campaign for the leadership of the election NAME (distlock.DistElection) "
                          "and run COMMAND as its leader; resign when COMMAND ends")
    run.add_argument("--value", metavar="TEXT",
                     help="with --leader: what the leader campaigns with, as DistElection.leader() "
                          "shows it (default: HOST:PID of this run)")
    wait = run.add_mutually_exclusive_group()
    wait.add_argument("--timeout", type=_seconds(True), metavar="S",
                      help="wait at most S seconds for the lock, or to be elected (default: wait as "
                           "long as it takes)")
    wait.add_argument("--nonblock", "-n", action="store_true",
                      help="do not wait: fail at once when the lock is held")
    run.add_argument("--lease", type=_seconds(False), metavar="S",
                     help="an explicit lease of S seconds, never renewed: COMMAND is stopped when it "
                          "runs out (default: a watchdog renews the lease while COMMAND runs)")
    side = run.add_mutually_exclusive_group()
    side.add_argument("--shared", "-s", action="store_true",
                      help="take the read side of the DistReadWriteLock NAME (like flock -s): "
                           "shared with other --shared runs, excluded by plain runs and by every "
                           "other holder of NAME")
    side.add_argument("--write", "-x", action="store_true",
                      help="the same as a plain run (like flock -x): take the lock NAME, which "
                           "excludes --shared runs and every other holder of NAME")
    run.add_argument("--conflict-exit-code", "-E", type=_exit_code, default=EXIT_CONFLICT,
                     metavar="N", help=f"exit status when the lock is not taken (or the leadership "
                                       f"not won) in time (default {EXIT_CONFLICT})")
    run.add_argument("--kill-after", type=_seconds(True), default=DEFAULT_KILL_AFTER, metavar="S",
                     help="after a lost lease, SIGKILL COMMAND this long after SIGTERM "
                          f"(default {DEFAULT_KILL_AFTER:g})")
    run.add_argument("command", nargs="*", metavar="COMMAND",
                     help="the command to run and its arguments, after -- (everything after -- "
                          "is passed as it is)")

    status = sub.add_parser("status", parents=[common], help="show who holds the named locks",
                            description="For each NAME: held or free, owners (session, thread, "
                                        "host, pid), reentrancy count, remaining lease, fencing "
                                        "token and kind of primitive.")
    status.add_argument("names", nargs="+", metavar="NAME", type=_name)
    status.add_argument("--json", action="store_true", help="machine-readable output")

    lst = sub.add_parser("list", parents=[common], help="list held locks (SCAN, never KEYS)",
                         description="List every held primitive whose name matches PATTERN "
                                     "(a Redis glob, default *), found with SCAN.")
    lst.add_argument("pattern", nargs="?", default="*", metavar="PATTERN")
    lst.add_argument("--json", action="store_true", help="machine-readable output")

    top = sub.add_parser(
        "top", parents=[common], help="a live view of what is held and who waits",
        description="A live view of one Redis server, refreshed every second: one row per "
                    "primitive held or waited on (kind, holder host:pid, hold age, lease left, "
                    "fencing token, waiters and the oldest wait), sorted by the oldest wait. "
                    "Found with SCAN, never KEYS. Quit with q or Ctrl-C.")
    top.add_argument("--interval", "-i", type=_interval, default=DEFAULT_TOP_INTERVAL,
                     metavar="S", help=f"seconds between refreshes (default "
                                       f"{DEFAULT_TOP_INTERVAL:g}, at least {MIN_TOP_INTERVAL:g})")
    top.add_argument("--once", action="store_true",
                     help="print one snapshot and exit (every row, unless --limit)")
    top.add_argument("--json", action="store_true",
                     help="print one snapshot as JSON and exit (implies --once)")
    top.add_argument("--limit", type=_positive_int, metavar="N",
                     help="show at most N rows (default: as many as fit the terminal; with "
                          "--once, all)")
    top.add_argument("--long", type=_seconds(True), metavar="S",
                     help="mark the holds older than S seconds: their AGE ends in '!' (in the "
                          "live view, the line is highlighted too)")

    release = sub.add_parser(
        "release", parents=[common], help="break a stuck lock (needs --force)",
        description="Break the hold on NAME: delete it, move the fencing token on and wake every "
                    "waiter. The old holder finds its lease lost at its next renewal or release. "
                    "Without --force, only show who holds it.")
    release.add_argument("name", metavar="NAME", type=_name)
    release.add_argument("--force", action="store_true", help="really break the hold")

    demo = sub.add_parser(
        "demo", help="the lost-update race without and with distlock, on a private server",
        description="Run N worker processes that each read a shared counter, add one and write it "
                    "back, K times: without a lock, with DistLock, and with DistRLock taken twice. "
                    "Without --url it starts a private redis-server (or fakeredis' TCP server "
                    "when there is none); $DISTLOCK_URL is not used.")
    demo.add_argument("--url", default=None, metavar="URL",
                      help="use this Redis server instead of a private one")
    demo.add_argument("--workers", "-w", type=_positive_int, default=4, metavar="N",
                      help="worker processes (default 4)")
    demo.add_argument("--increments", "-k", type=_positive_int, default=200, metavar="K",
                      help="increments per worker and run (default 200)")

    bench = sub.add_parser(
        "bench", help="run the benchmark suite",
        usage="distlock bench [--cluster] [FIGURE...] [--quick] [--json PATH] "
              "[other options of the benchmark script]",
        description="Run benchmarks/bench_locks.py from the source tree (all figures, or those "
                    "named) and print the table. It always starts its own fresh redis-server, so "
                    "it takes no --url; other options go to bench_locks.py as they are. With "
                    "--cluster, run benchmarks/bench_cluster.py instead: distlock on a private "
                    "Redis Cluster (3 masters, 3 replicas) against one server.")
    bench.add_argument("--cluster", action="store_true",
                       help="benchmark distlock on a private Redis Cluster (bench_cluster.py; "
                            "figures: commands, spread, handoff, watchdog)")
    bench.add_argument("figures", nargs="*", metavar="FIGURE",
                       help="floor, uncontended, handoff, contended, herd, idle, connections")
    return parser


def _split_command(argv: List[str]) -> tuple[List[str], Optional[List[str]]]:
    """For ``run``, split off everything after the first ``--`` as the command, verbatim."""
    if "run" in argv and "--" in argv[argv.index("run"):]:
        at = argv.index("--", argv.index("run"))
        return argv[:at], argv[at + 1:]
    return argv, None


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Entry point of the ``distlock`` console script and of ``python -m distlock``."""
    args_list = list(sys.argv[1:] if argv is None else argv)
    head, command = _split_command(args_list)
    parser = build_parser()
    args, extra = parser.parse_known_args(head)
    if extra and args.command_name != "bench":
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    args.extra = extra
    if args.command_name == "bench":
        # everything after "bench" but --cluster goes to the script as it is (an option's
        # value must not be taken for a FIGURE: "--rounds 3")
        args.extra = [a for a in head[head.index("bench") + 1:] if a != "--cluster"]
        if any(a == "--url" or a.startswith("--url=") for a in args.extra):
            parser.error("bench starts servers of its own and takes no --url (a given server's "
                         "figures could not be compared with the floors of the same run); "
                         "--cluster benchmarks distlock on a private Redis Cluster")
    if command is not None:
        args.command = [*args.command, *command]
    if args.command_name == "run" and args.value is not None and not args.leader:
        parser.error("--value is the value of a leader: it needs --leader")
    handlers: Dict[str, Callable[[argparse.Namespace, argparse.ArgumentParser], int]] = {
        "run": cmd_leader if getattr(args, "leader", False) else cmd_run,
        "status": cmd_status, "list": cmd_list, "top": cmd_top,
        "release": cmd_release, "demo": cmd_demo, "bench": cmd_bench,
    }
    url = getattr(args, "url", None)
    if url is None and args.command_name not in ("demo", "bench"):
        url = os.environ.get("DISTLOCK_URL") or DEFAULT_URL
    args.url = url
    try:
        return handlers[args.command_name](args, parser)
    except Fail as exc:
        err(str(exc))
        return exc.status
    except WrongKindError as exc:  # a name is one lock (docs/guides/kinds.rst)
        err(one_line(exc))
        return EXIT_WRONG_KIND
    except (redis.ConnectionError, redis.TimeoutError) as exc:
        err(f"cannot reach the Redis server at {redact_url(url or '?')}: {one_line(exc)}")
        return EXIT_UNAVAILABLE
    except (redis.RedisError, RedisClusterException) as exc:
        err(f"Redis error from {redact_url(url or '?')}: {one_line(exc)}")
        return EXIT_SOFTWARE
    except KeyboardInterrupt:
        err("interrupted")
        return 128 + signal.SIGINT
