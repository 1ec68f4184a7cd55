"""A history of holds, fenced writes and faults, recorded by any number of processes, and the
checker that reads it.

Each process records what it *believed*: a hold begins when ``acquire`` returned and ends when
``release`` was called, or when the hold was reported lost, or when it ran past its
``valid_for()`` (the belief rule of docs/safety.rst). Writes to a fenced store are recorded with
their token and whether the store took them; faults with the window they were in force. A
leadership (``DistElection``) is the exclusive hold of its name and is recorded as one, from
``campaign``'s return, its epoch the token: the checks below then say that no two leaders
believed at once and that epochs increased in the order leaderships began.

Times are ``time.monotonic()``: on Linux that is one clock for every process of the host
(``CLOCK_MONOTONIC``), so the records of many processes compare. A ``History`` given a path
appends one JSON line per record to that file, with ``O_APPEND`` (each record is one
``write``), so that processes share it; without a path it keeps its records in memory.

``check_history(history)`` gives a ``Report``:

- ``overlaps``: every pair of beliefs on one name that overlap in time (two shared holds, the
  read side of a read/write lock, may);
- ``token_regressions``: every pair of consecutive grants on one name, in the order they began,
  whose tokens do not increase;
- ``stale_writes``: every write the fenced store accepted with a stale token, one lower than a
  token written before it: what a store that never forgets would have refused (a store that
  lost its state, in a restart without persistence, takes them; so does any store when the
  tokens went backwards);
- ``recoveries``: for each fault, how long after it healed the next hold began (``None``: none
  began).
"""

from __future__ import annotations

import json
import math
import os
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Dict, Iterable, List, Optional, Tuple, Union

__all__ = ["Hold", "Write", "Fault", "History", "Report", "check_history", "BELIEF_ENDS"]

#: How a belief ends: ``release`` was called; the hold was reported lost; it ran past its local
#: deadline (``valid_for()`` reached 0); the history ended with it still believed.
BELIEF_ENDS = ("released", "lost", "deadline", "open")


def _who() -> str:
    return f"{os.getpid()}:{threading.current_thread().name}"


def _check_name(name: object) -> str:
    if not isinstance(name, str):
        raise TypeError(f"name must be a str, not {type(name).__name__}")
    return name


def _check_token(token: object) -> Optional[int]:
    if token is None:
        return None
    if isinstance(token, bool) or not isinstance(token, int):
        raise TypeError(f"token must be an int or None, not {type(token).__name__}")
    return token


def _check_time(at: object, what: str) -> float:
    if isinstance(at, bool) or not isinstance(at, (int, float)):
        raise TypeError(f"{what} must be a time.monotonic() value, not {type(at).__name__}")
    if not math.isfinite(at):
        raise ValueError(f"{what} must be a time.monotonic() value, not {at!r}")
    return float(at)


@dataclass(frozen=True)
class Hold:
    """One belief: ``who`` believed it held ``name`` with ``token`` from ``start`` to ``end``
    (``end`` is None while it is open)."""

    name: str
    token: Optional[int]
    start: float
    end: Optional[float] = None
    cause: str = "open"
    who: str = ""
    shared: bool = False

    def until(self, horizon: float) -> float:
        return horizon if self.end is None else self.end


@dataclass(frozen=True)
class Write:
    """A write to the fenced store that guards ``name``: its token, and whether it was taken."""

    name: str
    token: int
    at: float
    accepted: bool
    who: str = ""


@dataclass(frozen=True)
class Fault:
    """A fault (``kind``, ``detail``) in force from ``start`` until it healed at ``end``."""

    kind: str
    start: float
    end: float
    detail: str = ""


Record = Union[Hold, Write, Fault]
_TYPES: Dict[str, Any] = {"hold": Hold, "write": Write, "fault": Fault}


class History:
    """Records of holds, writes and faults: in memory, or appended to the file ``path``, which
    other processes may append to as well (``History(path)`` in each of them)."""

    def __init__(self, path: Optional[Union[str, os.PathLike[str]]] = None) -> None:
        self.path = None if path is None else os.fspath(path)
        self._records: List[Record] = []
        self._mutex = threading.Lock()

    def __repr__(self) -> str:
        where = "in memory" if self.path is None else repr(self.path)
        return f"<History {where}>"

    # --- recording ---------------------------------------------------------------------------

    def begin(self, name: str, token: Optional[int], *, shared: bool = False,
              at: Optional[float] = None) -> Hold:
        """A belief begins (call it as ``acquire`` returns). Nothing is written until ``end``;
        a hold never ended is reported open by ``close_open``."""
        return Hold(_check_name(name), _check_token(token),
                    time.monotonic() if at is None else _check_time(at, "at"),
                    who=_who(), shared=bool(shared))

    def end(self, hold: Hold, cause: str = "released", *, at: Optional[float] = None) -> Hold:
        """The belief ``hold`` ended, for ``cause`` (one of ``BELIEF_ENDS``); it is recorded."""
        if not isinstance(hold, Hold):
            raise TypeError(f"end() takes the Hold that begin() returned, not "
                            f"{type(hold).__name__}")
        if cause not in BELIEF_ENDS:
            raise ValueError(f"cause must be one of {', '.join(BELIEF_ENDS)}, not {cause!r}")
        when = time.monotonic() if at is None else _check_time(at, "at")
        if when < hold.start:
            raise ValueError(f"a belief cannot end ({when}) before it began ({hold.start})")
        done = Hold(hold.name, hold.token, hold.start, when, cause, hold.who, hold.shared)
        self._append("hold", done)
        return done

    def write(self, name: str, token: int, accepted: bool, *, at: Optional[float] = None) -> Write:
        """The fenced store of ``name`` took (``accepted``) or refused a write with ``token``."""
        if _check_token(token) is None:
            raise TypeError("a fenced write needs an int token, not None")
        record = Write(_check_name(name), token,
                       time.monotonic() if at is None else _check_time(at, "at"),
                       bool(accepted), _who())
        self._append("write", record)
        return record

    def fault(self, kind: str, start: float, end: float, detail: str = "") -> Fault:
        """A fault was in force from ``start`` until it healed at ``end``."""
        record = Fault(_check_name(kind), _check_time(start, "start"), _check_time(end, "end"),
                       str(detail))
        if record.end < record.start:
            raise ValueError(f"a fault cannot heal ({end}) before it began ({start})")
        self._append("fault", record)
        return record

    def _append(self, kind: str, record: Record) -> None:
        if self.path is None:
            with self._mutex:
                self._records.append(record)
            return
        line = (json.dumps({"type": kind, **asdict(record)}) + "\n").encode()
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line)  # one write of one line: O_APPEND keeps lines whole
        finally:
            os.close(fd)

    # --- reading -----------------------------------------------------------------------------

    def records(self) -> List[Record]:
        """Every record, from every process that appended to the file (a last line without
        its newline is still being written: it is left out)."""
        if self.path is None:
            with self._mutex:
                return list(self._records)
        out: List[Record] = []
        try:
            with open(self.path, encoding="utf-8") as fh:
                for number, line in enumerate(fh, 1):
                    if not line.endswith("\n"):
                        break  # the last line, still being written by another process
                    if not line.strip():
                        continue
                    data = json.loads(line)
                    kind = data.pop("type", None)
                    if kind not in _TYPES:
                        raise ValueError(f"{self.path}:{number}: not a history record: {line!r}")
                    out.append(_TYPES[kind](**data))
        except FileNotFoundError:
            pass
        return out

    def holds(self) -> List[Hold]:
        return [r for r in self.records() if isinstance(r, Hold)]

    def writes(self) -> List[Write]:
        return [r for r in self.records() if isinstance(r, Write)]

    def faults(self) -> List[Fault]:
        return [r for r in self.records() if isinstance(r, Fault)]


@dataclass
class Report:
    """What ``check_history`` found. ``ok`` is true when no beliefs overlap, no token went
    backwards and the fenced store took no stale write."""

    holds: int = 0
    writes: int = 0
    overlaps: List[Tuple[Hold, Hold]] = field(default_factory=list)
    token_regressions: List[Tuple[Hold, Hold]] = field(default_factory=list)
    stale_writes: List[Write] = field(default_factory=list)
    recoveries: List[Tuple[Fault, Optional[float]]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not (self.overlaps or self.token_regressions or self.stale_writes)

    @property
    def longest_recovery(self) -> Optional[float]:
        """The longest time from a fault's healing to the next hold (``inf`` if one fault was
        never followed by a hold; ``None`` if there were no faults)."""
        if not self.recoveries:
            return None
        return max(float("inf") if r is None else r for _, r in self.recoveries)

    def __str__(self) -> str:
        longest = self.longest_recovery
        return (f"holds {self.holds}, writes {self.writes}: {len(self.overlaps)} belief "
                f"overlaps, {len(self.token_regressions)} token regressions, "
                f"{len(self.stale_writes)} stale writes accepted, longest recovery "
                f"{'-' if longest is None else f'{longest:.3f} s'}")


def check_history(history: Union[History, Iterable[Record]],
                  horizon: Optional[float] = None) -> Report:
    """Check a history (a ``History``, or its records). A hold still open counts as believed
    until ``horizon`` (default: the latest time in the history)."""
    records = history.records() if isinstance(history, History) else list(history)
    holds = [r for r in records if isinstance(r, Hold)]
    writes = [r for r in records if isinstance(r, Write)]
    faults = [r for r in records if isinstance(r, Fault)]
    if horizon is None:
        times = [t for h in holds for t in (h.start, h.end) if t is not None]
        times += [w.at for w in writes] + [f.end for f in faults]
        horizon = max(times, default=0.0)
    report = Report(holds=len(holds), writes=len(writes))
    by_name: Dict[str, List[Hold]] = {}
    for hold in sorted(holds, key=lambda h: (h.start, h.until(horizon))):
        by_name.setdefault(hold.name, []).append(hold)
    for name_holds in by_name.values():
        report.overlaps.extend(_overlaps(name_holds, horizon))
        granted = [h for h in name_holds if h.token is not None and not h.shared]
        report.token_regressions.extend(
            (a, b) for a, b in zip(granted, granted[1:]) if b.token <= a.token)  # type: ignore[operator]
    highest: Dict[str, int] = {}  # per name: what a store that never forgets has taken
    for write in sorted(writes, key=lambda w: w.at):
        if write.token >= highest.get(write.name, write.token):
            highest[write.name] = write.token
        elif write.accepted:
            report.stale_writes.append(write)
    starts = sorted(h.start for h in holds)
    for fault in sorted(faults, key=lambda f: f.start):
        after = next((s for s in starts if s >= fault.end), None)
        report.recoveries.append((fault, None if after is None else after - fault.end))
    return report


def _overlaps(holds: List[Hold], horizon: float) -> List[Tuple[Hold, Hold]]:
    """Every overlapping pair among ``holds`` (sorted by start) that is not two shared holds;
    intervals are half-open, so a hold that begins as another ends does not overlap it."""
    found: List[Tuple[Hold, Hold]] = []
    active: List[Hold] = []
    for hold in holds:
        active = [a for a in active if a.until(horizon) > hold.start]
        found.extend((a, hold) for a in active if not (a.shared and hold.shared))
        active.append(hold)
    return found
