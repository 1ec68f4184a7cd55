"""``distlock top``'s rows: one per primitive held or waited on, no I/O here.

``top`` SCANs the keyspace; ``group_keys`` groups the keys it found by name and primitive, and
``plan_reads`` chooses which to read; ``top`` reads them (its I/O) and the ``*_row`` functions
below turn the replies into rows (locks and read/write locks through ``inspect``'s
``exclusive_state`` / ``rw_state``, as ``status`` reads them), sorted by the oldest wait
(``sort_rows``) and laid out as text (``format_top``) or JSON (``TopSnapshot.to_json``).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

from .._core.keys import Keys, unescape_name
from .inspect import LockState, Owner, Raw, int_of, oldest, permit_age, text_of, zset_pairs

__all__ = [
    "LOCK",
    "RW",
    "SEM",
    "EVENT",
    "BARRIER",
    "COND",
    "HOLD",
    "WAIT",
    "READERS",
    "LEASES",
    "split_key",
    "top_parts",
    "group_keys",
    "plan_reads",
    "Found",
    "TopRow",
    "TopSnapshot",
    "lock_row",
    "rw_row",
    "semaphore_row",
    "event_row",
    "barrier_row",
    "condition_row",
    "sort_rows",
    "format_top",
    "duration",
    "LONG_MARK",
]

#: families of primitives, as ``group_keys`` names them
LOCK, RW, SEM, EVENT, BARRIER, COND = "lock", "rw", "sem", "ev", "bar", "cond"

#: a key's role in its primitive: something held (or set, or recorded), or someone waiting
HOLD, WAIT, READERS, LEASES = "hold", "wait", "readers", "leases"


def split_key(prefix: str, key: Raw) -> Optional[Tuple[str, str]]:
    """``<prefix>{<escaped name>}<suffix>`` -> (name, suffix); None for any other key. The
    escaped name holds no ``}`` (see ``escape_name``), so the first ``}`` ends the tag."""
    text = text_of(key) or ""
    start = prefix + "{"
    if not text.startswith(start):
        return None
    end = text.find("}", len(start))
    if end <= len(start):
        return None
    return unescape_name(text[len(start):end]), text[end + 1:]


def top_parts(prefix: str) -> Tuple[Dict[str, Tuple[str, str]], Tuple[str, str]]:
    """The key suffixes ``top`` reads, from the key classes themselves (the single source of the
    layout): suffix -> (family, role); and the two prefixes of a condition's suffixes
    (queue, leases), which end with the condition's name."""
    from .._core.keys import BarrierKeys, CondKeys, EventKeys, RWKeys, SemKeys

    base = Keys(prefix, "x")

    def tail(key: str) -> str:
        return key[len(base.tag):]

    rw = RWKeys.of(prefix, "x")
    sem = SemKeys.of(prefix, "x")
    ev = EventKeys.of(prefix, "x")
    bar = BarrierKeys.of(prefix, "x")
    parts = {
        tail(base.lock): (LOCK, HOLD), tail(base.queue): (LOCK, WAIT),
        tail(rw.writer): (RW, HOLD), tail(rw.readers): (RW, READERS), tail(rw.queue): (RW, WAIT),
        tail(sem.sem): (SEM, HOLD), tail(sem.queue): (SEM, WAIT),
        tail(ev.flag): (EVENT, HOLD), tail(ev.waiters): (EVENT, WAIT),
        tail(bar.state): (BARRIER, HOLD), tail(bar.waiters): (BARRIER, WAIT),
    }
    cond = CondKeys.of(base, "c")
    return parts, (tail(cond.queue)[:-1], tail(cond.leases)[:-1])


@dataclass
class Found:
    """One primitive the scan found: its name, family, and its keys that exist, by role."""

    name: str
    family: str
    #: a condition's own name (its keys carry its lock's tag, ``name``); else None
    cond: Optional[str] = None
    keys: Dict[str, str] = field(default_factory=dict)

    @property
    def waited(self) -> bool:
        """Someone may be waiting (a waiting key exists)."""
        return WAIT in self.keys

    @property
    def order(self) -> Tuple[str, str, str]:
        return (self.cond if self.cond is not None else self.name, self.family, self.name)


def group_keys(prefix: str, keys: Iterable[Raw]) -> List[Found]:
    """The primitives behind a SCAN's keys, by (display name, family): those with something held
    or someone waiting. Keys that stay at rest alone (a ``:fence``, a barrier's or a semaphore's
    records) make no primitive of their own."""
    parts, (cond_queue, cond_leases) = top_parts(prefix)
    found: Dict[Tuple[str, str, Optional[str]], Found] = {}
    for key in keys:
        split = split_key(prefix, key)
        if split is None:
            continue
        name, suffix = split
        cond: Optional[str] = None
        if suffix in parts:
            family, role = parts[suffix]
        elif suffix.startswith(cond_queue) and len(suffix) > len(cond_queue):
            family, role, cond = COND, WAIT, suffix[len(cond_queue):]
        elif suffix.startswith(cond_leases) and len(suffix) > len(cond_leases):
            family, role, cond = COND, LEASES, suffix[len(cond_leases):]
        else:
            continue
        entry = found.get((name, family, cond))
        if entry is None:
            entry = found[(name, family, cond)] = Found(name, family, cond)
        entry.keys[role] = text_of(key) or ""
    # a condition's leases alone (its queue already gone) is no waiter: nobody to show
    return sorted((f for f in found.values() if f.family != COND or WAIT in f.keys),
                  key=lambda f: f.order)


def plan_reads(found: Sequence[Found], limit: Optional[int],
               budget: Optional[int] = None) -> List[Found]:
    """Which primitives to read: every one that may be waited on (their waits decide the
    order), then the others by name, up to ``limit`` rows in all (all when None). ``budget``
    caps the primitives read (None: no cap): past it, only the first waited ones by name are
    read, and the order is that of the oldest wait among them."""
    if limit is None:
        chosen = list(found)
    else:
        waited = [f for f in found if f.waited]
        rest = [f for f in found if not f.waited]
        chosen = waited + rest[:max(0, limit - len(waited))]
    return chosen if budget is None else chosen[:max(budget, limit or 0)]


@dataclass(frozen=True)
class TopRow:
    """One row of ``distlock top``: what one primitive holds, and who waits for it."""

    name: str
    #: DistLock, DistRLock (``DistLock/DistRLock`` when the owner ids cannot tell),
    #: DistReadWriteLock, DistSemaphore (or DistBoundedSemaphore: Redis cannot tell them
    #: apart), DistCondition, DistEvent, DistBarrier
    kind: str
    #: something is held (a lock, a read or write hold, a permit; a set event; a broken barrier)
    held: bool
    #: one per owner: ``host:pid`` where the grant recorded it, else the owner's session id
    holders: Tuple[str, ...] = ()
    #: how long the current hold has been held (ms): a lock's or writer's (``:l`` - PTTL), the
    #: oldest live reader's (from its token, the server's clock at its grant), the oldest live
    #: permit's (from the grant time its id carries); None when not recorded
    age_ms: Optional[int] = None
    #: the hold's remaining lease (ms): a lock's PTTL; the latest reader's; the soonest permit's
    lease_ms: Optional[int] = None
    #: the fencing token of the current hold (locks and read/write locks only)
    token: Optional[int] = None
    #: waiting processes (locks), queued writers (read/write locks), waiting callers
    #: (semaphores), waiting threads (conditions, events), parties arrived (barriers)
    waiting: int = 0
    #: how long the oldest of them has waited (ms), where Redis records it; else None
    oldest_wait_ms: Optional[int] = None
    #: the rest, in words: ``count 2``, ``2/3 permits``, ``3 readers``, ``lock NAME``, ``set``,
    #: ``broken``, ``1/4 parties``
    note: str = ""

    def to_json(self) -> Dict[str, Any]:
        data = asdict(self)
        data["holders"] = list(self.holders)
        return data


def _holder(owner: Owner) -> str:
    if owner.host is not None:
        return f"{owner.host}:{owner.pid}" if owner.pid is not None else owner.host
    return owner.session


def _live(reply: Optional[int]) -> int:
    return int(reply or 0)


def lock_row(state: Optional[LockState], name: str, *, waiting: Optional[int],
             now_ms: int) -> Optional[TopRow]:
    """A DistLock's or DistRLock's row from its ``exclusive_state`` and the number of live
    entries in its registry of waiting processes (``ZCOUNT :q (now +inf``; None: no registry).
    The oldest wait is the current hold's ``:s``: since when a queued process has waited for
    this very hold (a hold that ended takes its waiting-since with it)."""
    queued = _live(waiting)
    if state is None:
        if not queued:
            return None
        return TopRow(name=name, kind="DistLock/DistRLock", held=False, waiting=queued,
                      note="free, waiters about to try")
    since = state.waiting_since_ms
    oldest = max(0, now_ms - since) if since is not None and queued else None
    return TopRow(name=name, kind=state.kind, held=True,
                  holders=tuple(_holder(o) for o in state.owners), age_ms=state.age_ms,
                  lease_ms=state.lease_ms, token=state.token, waiting=queued,
                  oldest_wait_ms=oldest, note=f"count {state.count}" if state.count > 1 else "")


def rw_row(state: Optional[LockState], name: str) -> Optional[TopRow]:
    """A DistReadWriteLock's row from its ``rw_state``: the writer, or the live readers (the
    age: the oldest's); waiting writers are counted (waiting readers are not recorded in
    Redis)."""
    if state is None:
        return None
    readers = [o for o in state.owners if o.mode == "read"]
    writer = [o for o in state.owners if o.mode == "write"]
    if writer:
        note = "write" + (f", count {state.count}" if state.count > 1 else "")
    else:
        note = f"{len(readers)} reader{'s' if len(readers) != 1 else ''}"
    return TopRow(name=name, kind="DistReadWriteLock", held=True,
                  holders=tuple(_holder(o) for o in (writer or readers)),
                  age_ms=state.age_ms, lease_ms=state.lease_ms,
                  token=state.token, waiting=state.waiting_writers, note=note)


def semaphore_row(name: str, members: Any, pttl: Optional[int], *, waiting: Optional[int],
                  now_ms: int) -> Optional[TopRow]:
    """A DistSemaphore's row from ``ZRANGE <sem> 0 -1 WITHSCORES`` (permit id -> lease deadline,
    ``+inf`` for a permit taken at rest, whose deadline is the key's expiry; ``~v`` and ``~x``
    -> -(value + 1), -(extra + 1)), the key's PTTL and the live waiting callers. Permit ids
    (``<session id>:<thread ident>:<n>@<grant ms>``) record no host: the holders are session
    ids. The age is the oldest live permit's (``inspect.permit_age``)."""
    value: Optional[int] = None
    extra = 0
    permits: List[Tuple[str, int]] = []
    for member, score in zset_pairs(members):
        if member == "~v":
            value = int(-score) - 1
        elif member == "~x":
            extra = int(-score) - 1
        elif score == float("inf"):
            if pttl is not None and pttl >= 0:
                permits.append((member, pttl))
        elif score > now_ms:
            permits.append((member, int(score - now_ms)))
    queued = _live(waiting)
    if not permits and not queued:
        return None
    sessions = tuple(dict.fromkeys(m.split(":", 1)[0] for m, _ in permits))
    total = f"/{value + extra}" if value is not None else ""
    return TopRow(name=name, kind="DistSemaphore", held=bool(permits), holders=sessions,
                  age_ms=oldest(permit_age(m, now_ms) for m, _ in permits),
                  lease_ms=min((left for _, left in permits), default=None), waiting=queued,
                  note=f"{len(permits)}{total} permits")


def event_row(name: str, is_set: bool, *, waiting: Optional[int]) -> Optional[TopRow]:
    """A DistEvent's row: set or not, and its live waiters."""
    queued = _live(waiting)
    if not is_set and not queued:
        return None
    return TopRow(name=name, kind="DistEvent", held=is_set, waiting=queued,
                  note="set" if is_set else "clear")


def barrier_row(name: str, fields: Sequence[Optional[Raw]], *,
                waiting: Optional[int]) -> Optional[TopRow]:
    """A DistBarrier's row from ``HMGET <bar> p b`` and its live waiting parties."""
    parties = int_of(fields[0]) if fields else None
    broken = bool(fields[1]) if len(fields) > 1 else False
    queued = _live(waiting)
    if not queued and not broken:
        return None
    note = f"{queued}/{parties} parties" if parties is not None else f"{queued} parties"
    return TopRow(name=name, kind="DistBarrier", held=broken, waiting=queued,
                  note=note + (", broken" if broken else ""))


def condition_row(name: str, lock_name: str, *, waiting: Optional[int], oldest: Any,
                  now_ms: int) -> Optional[TopRow]:
    """A DistCondition's row from its live waiters (``ZCOUNT <leases> (now +inf``) and its
    oldest queued waiter (``ZRANGE <queue> 0 0 WITHSCORES``: arrival, server µs)."""
    queued = _live(waiting)
    if not queued:
        return None
    first = zset_pairs(oldest)
    oldest_ms = max(0, now_ms - int(first[0][1] // 1000)) if first else None
    return TopRow(name=name, kind="DistCondition", held=False, waiting=queued,
                  oldest_wait_ms=oldest_ms, note="" if lock_name == name else f"lock {lock_name}")


def sort_rows(rows: Iterable[TopRow]) -> List[TopRow]:
    """Rows with waiters first, the oldest wait first (those whose waits Redis does not record
    after those it does, most waiters first), then the rest by name."""
    def key(row: TopRow) -> Tuple[int, int, int, str, str]:
        if row.waiting:
            oldest = row.oldest_wait_ms
            return (0, -oldest if oldest is not None else 1, -row.waiting, row.name, row.kind)
        return (1, 0, 0, row.name, row.kind)

    return sorted(rows, key=key)


@dataclass(frozen=True)
class TopSnapshot:
    """One refresh of ``distlock top``: the rows shown and what the refresh cost."""

    url: str
    #: the server's clock (TIME) at the start of the refresh, ms
    server_time_ms: int
    rows: Tuple[TopRow, ...]
    #: primitives the scan found held or waited on, and how many of them may be waited on
    primitives: int
    waited: int
    #: primitives read (all the waited ones, unless more than the live view's read budget)
    read: int
    #: keys the scan returned, and its SCAN calls
    keys_scanned: int
    scan_calls: int
    #: every command of the refresh: SCAN, TIME and the reads (pipelined)
    commands: int
    #: the refresh's wall time, ms
    refresh_ms: float
    #: ``--long``: rows whose hold is older than this (ms) are marked; None: no mark
    long_ms: Optional[int] = None

    def is_long(self, row: TopRow) -> bool:
        """Whether ``row``'s hold is older than ``--long``."""
        return self.long_ms is not None and row.age_ms is not None and row.age_ms > self.long_ms

    def to_json(self) -> Dict[str, Any]:
        data = asdict(self)
        data["rows"] = [dict(row.to_json(), long=self.is_long(row)) for row in self.rows]
        data["shown"] = len(self.rows)
        data["refresh_ms"] = round(self.refresh_ms, 1)
        return data


def duration(ms: Optional[float]) -> str:
    """A short duration for a column: ``850ms``, ``12.3s``, ``4m05s``, ``2h03m``, ``3d04h``."""
    if ms is None:
        return "-"
    if ms < 1000:
        return f"{int(ms)}ms"
    seconds = ms / 1000
    if seconds < 60:
        return f"{seconds:.1f}s"
    whole = int(seconds)
    if whole < 3600:
        return f"{whole // 60}m{whole % 60:02d}s"
    if whole < 86400:
        return f"{whole // 3600}h{whole % 3600 // 60:02d}m"
    return f"{whole // 86400}d{whole % 86400 // 3600:02d}h"


TOP_COLUMNS = ("NAME", "KIND", "HOLDER", "AGE", "LEASE", "TOKEN", "WAITING", "OLDEST", "NOTE")


#: what marks the AGE of a hold older than ``--long``; in the live view its line is shown in
#: reverse video too
LONG_MARK = "!"
_REVERSE, _PLAIN = "\x1b[7m", "\x1b[0m"


def _cells(row: TopRow, mark: Optional[bool]) -> Tuple[str, ...]:
    """A row's cells; ``mark``: None without ``--long``, else whether the hold is past it (the
    other ages get a space in its place, so that the column stays aligned)."""
    holder = row.holders[0] if row.holders else "-"
    if ":" not in holder and len(holder) == 32:  # a session id: no host recorded
        holder = f"session {holder[:8]}"
    if len(row.holders) > 1:
        holder += f" +{len(row.holders) - 1}"
    age = duration(row.age_ms)
    if mark is not None:
        age += LONG_MARK if mark else " "
    return (row.name, row.kind, holder, age, duration(row.lease_ms),
            "-" if row.token is None else str(row.token), str(row.waiting) if row.waiting else "-",
            duration(row.oldest_wait_ms) if row.waiting else "-", row.note)


def format_top(snapshot: TopSnapshot, width: Optional[int] = None, *, live: bool = False,
               error: Optional[str] = None, highlight: Optional[bool] = None) -> List[str]:
    """The text of one refresh: two header lines, the column titles, one line per row, each cut
    to ``width`` characters (None: not cut). With ``--long`` (``snapshot.long_ms``), the AGE of
    each hold older than that ends in ``!``, and its line is in reverse video when
    ``highlight`` (default: ``live``; the escapes are outside the ``width``)."""
    clock = time.strftime("%H:%M:%S", time.gmtime(snapshot.server_time_ms / 1000))
    hint = "  (q or Ctrl-C quits)" if live else ""
    waited = f", {snapshot.waited} waited on" if snapshot.waited else ""
    if snapshot.read < snapshot.waited:
        waited += f" (the first {snapshot.read} by name read)"
    lines = [
        f"distlock top - {snapshot.url} - {clock} UTC{hint}",
        f"{snapshot.primitives} held or waited on{waited}, {len(snapshot.rows)} shown; "
        f"refresh {snapshot.refresh_ms:.0f} ms, {snapshot.commands} commands "
        f"({snapshot.scan_calls} SCAN over {snapshot.keys_scanned} keys)",
    ]
    marked = snapshot.long_ms is not None
    marks = [snapshot.is_long(row) for row in snapshot.rows]
    if marked:
        lines[1] += f"; {sum(marks)} held longer than {duration(snapshot.long_ms)} ({LONG_MARK})"
    if error:
        lines[1] = f"{error} (showing the last refresh)"
    cells = [TOP_COLUMNS] + [_cells(row, mark if marked else None)
                             for row, mark in zip(snapshot.rows, marks)]
    caps = (40, 18, 28, 7, 7, 17, 7, 7, 40)
    widths = [min(cap, max(len(c[i]) for c in cells)) for i, cap in enumerate(caps)]
    right = {3, 4, 5, 6, 7}
    for c in cells:
        parts = []
        for i, (text, w) in enumerate(zip(c, widths)):
            if len(text) > w:
                text = text[:max(0, w - 1)] + "~"
            parts.append(text.rjust(w) if i in right else text.ljust(w))
        lines.append("  ".join(parts).rstrip())
    if not snapshot.rows:
        lines.append("(nothing held, nobody waiting)")
    if width is not None:
        lines = [line[:width] for line in lines]
    if live if highlight is None else highlight:
        lines[3:3 + len(marks)] = [_REVERSE + line + _PLAIN if mark else line
                                   for line, mark in zip(lines[3:3 + len(marks)], marks)]
    return lines
