"""``distlock run --leader NAME -- COMMAND``: run COMMAND on one host at a time, the leader of
the election NAME (``distlock.DistElection``).

Every host runs the same line; each campaigns, the one elected runs COMMAND, and when COMMAND
ends it resigns and exits with COMMAND's status, and another host's campaign wins and starts
its COMMAND. Everything else is ``run``'s (``run.run_claim``): the forwarded signals, the
monitor and the belief rule, the stop on a lost leadership (SIGTERM, SIGKILL after
``--kill-after``, exit 76), ``--timeout``, ``--nonblock`` and the conflict code. The leader's
epoch (its hold's fencing token) is in COMMAND's environment as ``DISTLOCK_EPOCH``, and as
``DISTLOCK_TOKEN`` too, as ``run`` exports it.
"""

from __future__ import annotations

import argparse
import os
import socket
from typing import Any, Callable, Dict, Optional

import redis
from redis.exceptions import RedisClusterException

from .._core.election import check_value
from .._primitives.election import DistElection, Leadership
from .connect import client_for
from .exits import one_line
from .run import Claim, run_claim

__all__ = ["cmd_leader", "LeaderClaim", "default_value"]


def default_value() -> str:
    """What a leader campaigns with unless ``--value`` says: ``host:pid`` of this ``run``."""
    return f"{socket.gethostname()}:{os.getpid()}"


class LeaderClaim(Claim):
    """A leadership of the election NAME, as ``run`` holds a lock: its hold is the election's
    exclusive hold of NAME, so the monitor checks it as it checks a lock's."""

    def __init__(self, args: argparse.Namespace, election: DistElection, value: str) -> None:
        # the DistLock a leadership is the hold of: the monitor reads its hold (one HGET)
        super().__init__(args, election._lock)
        self.election = election
        self.value = value
        self.leadership: Optional[Leadership] = None

    @property
    def what(self) -> str:
        return f"the leadership of {self.args.name!r}"

    @property
    def lease(self) -> str:
        return self.what

    def on_lost(self, callback: Callable[[], None]) -> None:
        self.election.on_revoked(lambda _election: callback())

    def take(self) -> bool:
        timeout = 0.0 if self.args.nonblock else self.args.timeout
        try:
            self.leadership = self.election.campaign(self.value, timeout=timeout)
        except TimeoutError:
            return False
        return True

    def refusal(self, client: Any) -> str:
        how = "" if self.args.nonblock else f" within {self.args.timeout:g} s"
        led = ""
        try:
            leader = self.election.leader()
        except (redis.RedisError, RedisClusterException):
            leader = None
        if leader is not None:
            where = f" on {leader.host} pid {leader.pid}" if leader.host else ""
            led = f"; led by {leader.value!r}{where} (epoch {leader.epoch})"
        return f"not elected leader of {self.args.name!r}{how}{led}"

    def env(self) -> Dict[str, str]:
        env = {"DISTLOCK_NAME": self.args.name}
        if self.leadership is not None:
            env["DISTLOCK_EPOCH"] = env["DISTLOCK_TOKEN"] = str(self.leadership.epoch)
        return env

    def give_up(self) -> None:
        self.election.resign()


def cmd_leader(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    if not args.command:
        parser.error("run needs a COMMAND after --")
    if args.shared or args.write:
        parser.error("--leader takes no --shared or --write: a leadership is one exclusive hold")
    value = default_value() if args.value is None else args.value
    try:
        check_value(value)
    except ValueError as exc:
        parser.error(f"argument --value: {one_line(exc)}")
    client = client_for(args.url, parser)
    try:
        election = DistElection(args.name, client=client, lease=args.lease)
    except TypeError as exc:  # a Redlock quorum: its tokens are no epochs
        parser.error(one_line(exc))
    return run_claim(args, LeaderClaim(args, election, value), client)
