"""``distlock run``: flock(1) across hosts. Take a lock, run a command while holding it, release
it when the command ends, however it ends.

The command's exit status is passed through (128 + N for a signal N). SIGINT, SIGTERM and SIGHUP
are forwarded to the command while it runs. A monitor thread checks every ``RUN_CHECK_EVERY``
seconds that the hold is still in Redis; when the lease is lost (force-released, expired, the
server restarted), the command gets SIGTERM, then SIGKILL ``--kill-after`` seconds later, and
``run`` exits 76 (``exits.EXIT_LOST``).

What is held is a ``Claim``: a lock here; ``run --leader`` campaigns for a leadership instead
(``leader.LeaderClaim``), with the same command handling.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import threading
import time
from types import FrameType
from typing import Any, Callable, Dict, List, Optional

import redis
from redis.exceptions import RedisClusterException

from .._core.errors import LockLostError
from .._primitives.lock_reach import hold_of, still_held
from .connect import client_for
from .exits import EXIT_LOST, err, one_line
from .state import fetch_states, holder_summary

__all__ = ["cmd_run", "run_claim", "Claim", "RUN_CHECK_EVERY", "DEFAULT_KILL_AFTER",
           "FORWARDED_SIGNALS"]

#: How often ``distlock run`` checks that its hold is still in Redis (one HGET), so that a
#: force-release or a server restart stops the command within about this long. The library's
#: watchdog would notice too, but only at its next renewal (every 10 s by default).
RUN_CHECK_EVERY = 1.0

#: Default grace period between SIGTERM and SIGKILL after a lost lease.
DEFAULT_KILL_AFTER = 10.0

FORWARDED_SIGNALS = tuple(
    getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, name))


def _make_lock(args: argparse.Namespace, client: Any,
               parser: argparse.ArgumentParser) -> Any:
    import distlock

    if args.shared:
        # the read side of the name's DistReadWriteLock, which a DistLock of the same name
        # (a plain run, --write) excludes: a name is one lock (docs/guides/kinds.rst)
        rwlock = getattr(distlock, "DistReadWriteLock", None)
        if rwlock is None:
            parser.error("--shared needs distlock.DistReadWriteLock, which this version of "
                         "distlock does not have")
        return rwlock(args.name, client=client, lease=args.lease).read_lock()
    # a plain run and --write alike (flock's -x is its default too)
    return distlock.DistLock(args.name, client=client, lease=args.lease)


class Claim:
    """What ``run`` holds while the command runs, and how it takes it and gives it up: the lock
    NAME here; a subclass campaigns for a leadership (``leader.LeaderClaim``)."""

    def __init__(self, args: argparse.Namespace, lock: Any) -> None:
        self.args = args
        #: the primitive whose hold the monitor checks in Redis (``hold_of``, ``still_held``)
        self.lock = lock

    @property
    def what(self) -> str:
        """What is held, for messages: "lost {what}: ..."."""
        return f"the lock {self.args.name!r}"

    @property
    def lease(self) -> str:
        """What ends with a lost hold, for messages: "... after {lease} was lost"."""
        return f"the lease on {self.args.name!r}"

    def on_lost(self, callback: Callable[[], None]) -> None:
        self.lock.on_lost(lambda _lock: callback())

    def take(self) -> bool:
        """Take the hold as ``--nonblock`` and ``--timeout`` say; False when not in time."""
        if self.args.nonblock:
            return bool(self.lock.acquire(blocking=False))
        if self.args.timeout is not None:
            return bool(self.lock.acquire(timeout=self.args.timeout))
        return bool(self.lock.acquire())

    def refusal(self, client: Any) -> str:
        """The message when ``take`` returned False: who holds it, when that can be read."""
        how = "" if self.args.nonblock else f" within {self.args.timeout:g} s"
        held = ""
        try:
            states = [s for s in fetch_states(client, [self.args.name]) if s.held and s.owners]
            if states:
                held = "; held by " + "; ".join(holder_summary(s) for s in states)
        except (redis.RedisError, RedisClusterException):
            pass
        return f"could not take {self.args.name!r}{how}{held}"

    def env(self) -> Dict[str, str]:
        """What the command finds in its environment besides ours."""
        env = {"DISTLOCK_NAME": self.args.name}
        token = self.lock.token
        if token is not None:
            env["DISTLOCK_TOKEN"] = str(token)
        return env

    def give_up(self) -> None:
        """Release the hold (LockLostError when it was lost meanwhile)."""
        self.lock.release()


def _hold_of(lock: Any) -> Any:
    """The library's record of ``lock``'s current hold (key, token, expiry), if it has one."""
    try:
        return hold_of(lock)
    except Exception:  # noqa: BLE001 - a primitive without that protocol: no extra checks
        return None


def _tty_forwards_sigint() -> bool:
    """True when a terminal sends SIGINT to our whole process group, the command included.

    Then a Ctrl-C reaches the command directly, and forwarding it would deliver it twice.
    """
    if not hasattr(os, "tcgetpgrp"):
        return False
    for fd in (0, 1, 2):
        try:
            if os.isatty(fd):
                return os.tcgetpgrp(fd) == os.getpgrp()
        except OSError:
            continue
    return False


class _Terminated(Exception):
    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


class _Runner:
    """The command, the hold, and what happens when one of them ends first."""

    def __init__(self, args: argparse.Namespace, claim: Claim) -> None:
        self.args = args
        self.claim = claim
        self.lock = claim.lock
        self.child: Optional[subprocess.Popen[bytes]] = None
        self.lost_reason: Optional[str] = None
        self.killed = False
        #: set while release() runs: a renewal that raced with it may report the hold gone, but
        #: release() itself says whether the hold was still ours
        self.releasing = False
        self._mutex = threading.Lock()
        self._stop = threading.Event()
        self._killer: Optional[threading.Timer] = None
        #: the library's record of the hold, taken by the thread that acquired it
        self.hold: Any = None

    def lost(self, reason: str) -> None:
        """The lease is gone: say why, SIGTERM the command, SIGKILL it after the grace period."""
        with self._mutex:
            if self.lost_reason is not None or self.releasing:
                return
            self.lost_reason = reason
            child = self.child
        err(f"lost {self.claim.what}: {reason}")
        if child is not None:
            self._stop_child(child)

    def _stop_child(self, child: subprocess.Popen[bytes]) -> None:
        if child.poll() is not None:
            return
        err(f"stopping the command (pid {child.pid}): SIGTERM now, SIGKILL in "
             f"{self.args.kill_after:g} s")
        try:
            child.send_signal(signal.SIGTERM)
        except OSError:
            return
        killer = threading.Timer(self.args.kill_after, self._kill, args=(child,))
        killer.name = "distlock-run-killer"
        killer.daemon = True
        self._killer = killer
        killer.start()

    def _kill(self, child: subprocess.Popen[bytes]) -> None:
        if child.poll() is None:
            self.killed = True
            err(f"the command did not stop within {self.args.kill_after:g} s; sending SIGKILL")
            try:
                child.kill()
            except OSError:
                pass

    def monitor(self) -> None:
        """Check every RUN_CHECK_EVERY seconds that the hold is still ours, and declare it lost
        at its local deadline (docs/safety.rst, "Belief keeps time"): an explicit lease is never
        renewed, and a watchdog lease whose renewals did not get through ends there too."""
        hold = self.hold
        while not self._stop.is_set():
            wait = RUN_CHECK_EVERY
            # the hold's local deadline moves with every renewal: read it afresh
            expires_at = getattr(hold, "expires_at", None)
            if expires_at is not None:
                wait = min(wait, max(0.0, expires_at - time.monotonic()))
            if self._stop.wait(wait):
                return
            if (expires_at is not None and not getattr(hold, "lost", False)
                    and time.monotonic() >= hold.expires_at):
                self._mark_lost(hold, f"its lease of {self.args.lease:g} s ran out (--lease is never "
                                      "renewed)" if self.args.lease is not None else
                                      "its lease ran out before a renewal reached the server")
                return
            if hold is None or getattr(hold, "lost", False):
                continue
            try:
                held = still_held(self.lock, hold)
            except (redis.ConnectionError, redis.TimeoutError, RedisClusterException):
                continue  # the watchdog decides when an unreachable server means a lost lease
            except redis.RedisError as exc:  # an answer, but not one that says "still yours"
                self._mark_lost(hold, f"its hold cannot be confirmed in Redis ({exc})")
                return
            if not held:
                self._mark_lost(hold, "the hold is gone from Redis (force-released, expired, or "
                                      "the server restarted)")
                return

    def _mark_lost(self, hold: Any, reason: str) -> None:
        session = getattr(hold, "session", None)
        self.lost(reason)
        if session is not None:
            session.mark_lost(hold, reason)  # the library agrees: release() raises LockLostError

    def stop(self) -> None:
        self._stop.set()
        killer = self._killer
        if killer is not None:
            killer.cancel()


def cmd_run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    if not args.command:
        parser.error("run needs a COMMAND after --")
    client = client_for(args.url, parser)
    return run_claim(args, Claim(args, _make_lock(args, client, parser)), client)


def run_claim(args: argparse.Namespace, claim: Claim, client: Any) -> int:
    """Take ``claim``, run the command while it is held, give it up: ``run``'s whole life."""
    runner = _Runner(args, claim)
    claim.on_lost(lambda: runner.lost(
        "its lease was lost (renewal found the hold gone or someone else's)"))

    def terminate(signum: int, frame: Optional[FrameType]) -> None:
        raise _Terminated(signum)

    previous = {sig: signal.signal(sig, terminate) for sig in FORWARDED_SIGNALS
                if sig != signal.SIGINT}
    try:
        try:
            acquired = claim.take()
        except KeyboardInterrupt:
            err(f"interrupted while waiting for {args.name!r}")
            return 128 + signal.SIGINT
        except _Terminated as exc:
            err(f"{signal.Signals(exc.signum).name} while waiting for {args.name!r}")
            return 128 + exc.signum
        if not acquired:
            err(claim.refusal(client))
            return int(args.conflict_exit_code)
        # The hold is looked up here, in the thread that took it: a DistRLock's or a read or
        # write side's hold belongs to its thread, and the monitor thread would find none.
        runner.hold = _hold_of(claim.lock)
        return _run_holding(args, claim, runner, previous)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _wait(child: subprocess.Popen[bytes]) -> int:
    """``child.wait()``, in slices. The kernel gives a process' signal to any of its threads
    that does not block it: given to one of the session's threads, it does not interrupt a
    blocking ``waitpid`` in the main thread, where Python runs its handlers, so the signal was
    forwarded only when the command ended on its own (seen as a hung ``run`` under load). A
    wait with a timeout polls ``waitpid`` between sleeps of at most 50 ms, between which the
    forwarding handler runs."""
    while True:
        try:
            return child.wait(timeout=1.0)
        except subprocess.TimeoutExpired:
            continue


def _run_holding(args: argparse.Namespace, claim: Claim, runner: _Runner,
                 previous: Dict[int, Any]) -> int:
    env = dict(os.environ)
    env.update(claim.env())
    tty_sigint = _tty_forwards_sigint()
    pending: List[int] = []  # signals that arrived before the command started

    def forward(signum: int, frame: Optional[FrameType]) -> None:
        if signum == signal.SIGINT and tty_sigint:
            return  # the terminal sent it to the command as well
        child = runner.child
        if child is None:
            pending.append(signum)
            return
        try:
            child.send_signal(signum)
        except OSError:
            pass

    monitor = threading.Thread(target=runner.monitor, name="distlock-run-monitor", daemon=True)
    status: Optional[int] = None
    try:
        try:
            for sig in FORWARDED_SIGNALS:
                signal.signal(sig, forward)
            child = subprocess.Popen(args.command, env=env)
        except _Terminated as exc:  # arrived before the forwarding handlers were all in place
            status = 128 + exc.signum
        except OSError as exc:
            err(f"cannot run {args.command[0]!r}: {exc.strerror or exc}")
            status = 127 if isinstance(exc, FileNotFoundError) else 126
        else:
            with runner._mutex:
                runner.child = child
                lost_early = runner.lost_reason is not None
            for signum in pending:
                forward(signum, None)
            if lost_early:
                runner._stop_child(child)
            monitor.start()
            returncode = _wait(child)
            status = returncode if returncode >= 0 else 128 - returncode
    finally:
        runner.stop()
        if monitor.is_alive():
            monitor.join(timeout=5.0)
        runner.releasing = True
        try:
            claim.give_up()
        except LockLostError:
            runner.releasing = False
            runner.lost("its lease was found lost when releasing")
        except redis.RedisError as exc:
            err(f"could not release {args.name!r} ({one_line(exc)}); it ends with its lease")
        # Signals that arrive from here on end distlock itself, as they normally would.
        for sig in FORWARDED_SIGNALS:
            signal.signal(sig, previous.get(sig, signal.default_int_handler
                                             if sig == signal.SIGINT else signal.SIG_DFL))
    if runner.lost_reason is not None:
        how = "was killed (SIGKILL)" if runner.killed else f"ended with status {status}"
        err(f"the command {how} after {claim.lease} was lost")
        return EXIT_LOST
    assert status is not None
    return status
