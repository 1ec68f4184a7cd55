"""Failpoints: a seam for tests in every executor and asyncio port, off unless a test installs it.

A ``FailPoints`` set as ``executor.failpoints`` (a blocking executor: one server, Sentinel, a
cluster, a Redlock quorum) or ``port.failpoints`` (an asyncio port: one server, a cluster, a
quorum) sees every script that ``run`` sends; on a Redlock quorum it sees each fan-out of
a script to the masters (``lock_undo`` included, which only the quorum's plans send), and
applies per master. A rule (``fail``) makes the ``nth`` call of one named script go wrong in
one of three ways:

- ``BEFORE``: ``ConnectionError`` and nothing is sent (the script did not run);
- ``LOST``: the script runs, then ``ConnectionError`` (its reply was lost on its way back);
- ``LATE``: the script runs, then ``TimeoutError``: its reply would have come after the socket
  timeout. Simulated (the reply is read, then dropped), not waited for; on a quorum, the undo
  the fan-out writes behind a try that timed out is written, and its reply read, before the
  error is reported, as a real late reply would leave it (``fanout_quorum.FanOut.fanout``).

Calls are counted per script name, only while ``active()`` is on in the caller's context (a
``contextvars`` variable: a thread, or an asyncio task and the tasks it starts), unless the
``FailPoints`` was made with ``everywhere=True``. So the watchdog thread's deferred work and
other actors of a test pass through, counted in ``calls`` but never failed. Every call seen is
recorded (``calls``), with what was done to it, for a test to compare with what the server
counted (``INFO commandstats``): a script is never sent twice.

The cost when off: ``run`` reads one attribute, ``failpoints``, which is None.
"""

from __future__ import annotations

import contextlib
import contextvars
import threading
from typing import Any, Awaitable, Callable, Dict, FrozenSet, Iterator, List, Optional, Tuple, TypeVar

import redis

__all__ = ["FailPoints", "Rule", "Call", "BEFORE", "LOST", "LATE", "KINDS", "injected"]

BEFORE = "before"
LOST = "lost"
LATE = "late"
KINDS = (BEFORE, LOST, LATE)

T = TypeVar("T")

#: the ``FailPoints`` whose ``active()`` the current context is in
_ACTIVE: contextvars.ContextVar[Optional[FailPoints]] = contextvars.ContextVar(
    "distlock_failpoints", default=None)


class Rule:
    """Fail the ``nth`` call (1-based) of script ``name`` as ``kind`` says; on a quorum, on
    ``masters`` (indexes; None: every master the call goes to)."""

    __slots__ = ("name", "nth", "kind", "masters", "fired")

    def __init__(self, name: str, nth: int, kind: str, masters: Optional[FrozenSet[int]] = None) -> None:
        if kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, not {kind!r}")
        if nth < 1:
            raise ValueError("nth counts from 1")
        self.name = name
        self.nth = nth
        self.kind = kind
        self.masters = masters
        #: whether the call it names came (and was failed)
        self.fired = False

    def __repr__(self) -> str:
        where = "" if self.masters is None else f" on masters {sorted(self.masters)}"
        return f"Rule({self.name!r} #{self.nth} {self.kind}{where})"


class Call:
    """One script call the seam saw: its name, keys and args, whether it was counted (made
    while ``active()``), the kind of failure it was given (None: none), and on a quorum the
    masters it was sent to (``sent``) and those the failure applied to (``failed_on``)."""

    __slots__ = ("name", "keys", "args", "counted", "kind", "sent", "failed_on")

    def __init__(self, name: str, keys: Tuple[Any, ...], args: Tuple[Any, ...], counted: bool) -> None:
        self.name = name
        self.keys = keys
        self.args = args
        self.counted = counted
        self.kind: Optional[str] = None
        self.sent: Tuple[int, ...] = ()
        self.failed_on: Tuple[int, ...] = ()

    def __repr__(self) -> str:
        mark = "" if self.kind is None else f" !{self.kind}"
        return f"Call({self.name}{'' if self.counted else ' (not counted)'}{mark})"


def injected(kind: str) -> redis.RedisError:
    """The error a failpoint of ``kind`` raises in place of a reply."""
    if kind == LATE:
        return redis.exceptions.TimeoutError("failpoint: the reply came too late")
    if kind == LOST:
        return redis.exceptions.ConnectionError("failpoint: the reply was lost")
    return redis.exceptions.ConnectionError("failpoint: not sent")


class FailPoints:
    """The rules and the record of one test (see the module's docstring)."""

    def __init__(self, everywhere: bool = False) -> None:
        self.everywhere = everywhere
        self.rules: List[Rule] = []
        self.calls: List[Call] = []
        self._counts: Dict[str, int] = {}
        self._lock = threading.Lock()

    def fail(self, name: str, nth: int, kind: str, masters: Optional[Any] = None) -> Rule:
        """Add a rule; return it (its ``fired`` tells whether the call came)."""
        rule = Rule(name, nth, kind, None if masters is None else frozenset(masters))
        with self._lock:
            self.rules.append(rule)
        return rule

    @contextlib.contextmanager
    def active(self) -> Iterator[FailPoints]:
        """Count (and fail) the calls made in this context, and in tasks started from it."""
        token = _ACTIVE.set(self)
        try:
            yield self
        finally:
            _ACTIVE.reset(token)

    def counted(self, name: Optional[str] = None) -> List[Call]:
        """The calls counted so far (of script ``name`` only, when given)."""
        with self._lock:
            return [c for c in self.calls if c.counted and (name is None or c.name == name)]

    def reset(self) -> None:
        """Forget the rules, the record and the counts."""
        with self._lock:
            self.rules.clear()
            self.calls.clear()
            self._counts.clear()

    # --- what the executors and the ports call ----------------------------------------------------

    def decide(self, name: str, keys: Tuple[Any, ...], args: Tuple[Any, ...]) -> Tuple[Call, Optional[Rule]]:
        """Record one call of script ``name``; the rule that fails it, if any."""
        counted = self.everywhere or _ACTIVE.get() is self
        call = Call(name, tuple(keys), tuple(args), counted)
        with self._lock:
            self.calls.append(call)
            if not counted:
                return call, None
            nth = self._counts[name] = self._counts.get(name, 0) + 1
            for rule in self.rules:
                if rule.name == name and rule.nth == nth and not rule.fired:
                    rule.fired = True
                    call.kind = rule.kind
                    return call, rule
        return call, None

    def around(self, name: str, keys: Tuple[Any, ...], args: Tuple[Any, ...], send: Callable[[], T]) -> T:
        """``send()`` (one script, sent once), as the rules say."""
        _, rule = self.decide(name, keys, args)
        if rule is None:
            return send()
        if rule.kind == BEFORE:
            raise injected(BEFORE)
        send()
        raise injected(rule.kind)

    async def around_async(self, name: str, keys: Tuple[Any, ...], args: Tuple[Any, ...],
                           send: Callable[[], Awaitable[T]]) -> T:
        """``around`` for an asyncio port."""
        _, rule = self.decide(name, keys, args)
        if rule is None:
            return await send()
        if rule.kind == BEFORE:
            raise injected(BEFORE)
        await send()
        raise injected(rule.kind)

    def fanout(self, jobs: Dict[int, List[Any]]) -> Tuple[Optional[Call], Dict[int, str]]:
        """A quorum's fan-out of ``jobs`` (per master, its entries): when it is one script's
        call (one entry per master, all of one script), record it and return, per master, the
        kind of failure it gets. Batches of renewals (several entries per master) and reads
        pass."""
        names = {entries[0][0] for entries in jobs.values() if len(entries) == 1}
        if len(names) != 1 or any(len(entries) != 1 for entries in jobs.values()):
            return None, {}
        name = names.pop()
        if not name:
            return None, {}
        first = next(iter(jobs.values()))[0]
        call, rule = self.decide(name, first[1], first[2])
        call.sent = tuple(sorted(jobs))
        if rule is None:
            return call, {}
        chosen = [i for i in jobs if rule.masters is None or i in rule.masters]
        call.failed_on = tuple(sorted(chosen))
        return call, {i: rule.kind for i in chosen}
