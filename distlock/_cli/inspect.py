"""Reading lock state for ``distlock status``, ``list`` and ``release``: no I/O here.

The command line fetches raw replies (TYPE, HGETALL, PTTL, GET, ZRANGE, TIME) and hands them to
the functions below, which turn them into :class:`LockState` records. Keeping the parsing free of
I/O lets the tests feed it any hash a primitive may write, and lets an asyncio twin share it.

The hash of an exclusive hold (``<prefix>{<name>}``, and a read/write lock's writer hash) holds:

- one field per owner, ``<session id>:<thread ident or random hold id>`` -> reentrancy count;
- ``:t`` -> the fencing token of the grant;
- ``:i`` -> ``host:pid`` of the process it was granted to;
- ``:l`` -> every lease the hold was given, in all (ms; the grant's, plus what each renewal and
  re-entry added), so that its age is ``:l`` minus its PTTL (holds granted before this field
  existed have none, and show no age);
- ``:s`` -> since when (server ms) a queued process has waited for this hold (the waiting path
  writes it; gone with the hold);
- optionally ``:k`` -> the kind of primitive, for primitives that record it.

Fields that start with ``:`` are metadata; every other field is an owner. A read/write lock's
readers hash maps each reader to its count and ``<owner>/t`` to its token; a sorted set holds
each reader's lease deadline in server milliseconds.
"""

from __future__ import annotations

import re
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

import redis

from .._core.keys import Keys, unescape_name

__all__ = [
    "pipeline_reply",
    "Owner",
    "LockState",
    "parse_owner",
    "parse_info",
    "guess_kind",
    "exclusive_state",
    "rw_state",
    "free_state",
    "name_from_key",
    "scan_pattern",
    "glob_escape",
    "hold_age",
    "split_key",
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
]


def pipeline_reply(value: Any) -> Any:
    """One reply of a pipeline run with ``raise_on_error=False``, as ``status`` and ``top``
    read them: a lost connection raises; any other error (a key of another type) reads as
    nothing there."""
    if isinstance(value, (redis.ConnectionError, redis.TimeoutError)):
        raise value
    return None if isinstance(value, Exception) else value

Raw = Union[bytes, str]


def _text(value: Optional[Raw]) -> Optional[str]:
    if value is None:
        return None
    if isinstance(value, bytes):
        return value.decode("utf-8", "surrogateescape")
    return str(value)


def _int(value: Optional[Raw]) -> Optional[int]:
    text = _text(value) if not isinstance(value, (int, float)) else str(int(value))
    if text is None:
        return None
    try:
        return int(float(text)) if "." in text or "e" in text.lower() else int(text)
    except ValueError:
        return None


@dataclass(frozen=True)
class Owner:
    """One owner of a hold."""

    owner: str
    session: str
    #: ``threading.get_ident()`` of the holding thread (DistRLock, read/write lock), else None
    thread: Optional[int]
    #: the random per-hold id (DistLock, whose hold belongs to an object, not a thread), else None
    hold_id: Optional[str]
    count: int
    host: Optional[str] = None
    pid: Optional[int] = None
    #: ``exclusive``, or ``write`` / ``read`` for a read/write lock
    mode: str = "exclusive"
    #: this owner's fencing token, when the primitive keeps one per owner (readers)
    token: Optional[int] = None
    #: this owner's remaining lease in ms, when the primitive keeps one per owner (readers)
    lease_ms: Optional[int] = None


@dataclass(frozen=True)
class LockState:
    """What ``distlock status`` shows for one primitive of one name."""

    name: str
    key: str
    #: ``DistLock``, ``DistRLock``, ``DistLock/DistRLock`` when the owner ids cannot tell them
    #: apart, ``DistReadWriteLock``, another primitive's own ``:k``, ``free`` when nothing is
    #: held, or ``unknown (<redis type>)`` for a key this version does not know
    kind: str
    held: bool
    owners: Tuple[Owner, ...] = ()
    #: sum of the owners' reentrancy counts
    count: int = 0
    #: remaining lease in ms (for readers: the longest, as the lock is held until then); None
    #: when not held or when the key has no expiry
    lease_ms: Optional[int] = None
    #: the fencing token of the current hold (for readers: the newest), or when free the last
    #: token granted (None: never granted)
    token: Optional[int] = None
    #: the last token granted for this name (the ``:fence`` key), None when never granted
    fence: Optional[int] = None
    #: writers queued on a read/write lock (they keep new readers out)
    waiting_writers: int = 0
    #: how long the current hold has been held, in ms (the writer's, for a read/write lock);
    #: None when free or not recorded (a hold granted by an older version)
    age_ms: Optional[int] = None
    #: since when (server ms) a queued process has waited for the current hold (locks only);
    #: None when nobody queued against it
    waiting_since_ms: Optional[int] = None
    extra: Dict[str, str] = field(default_factory=dict)

    def to_json(self) -> Dict[str, Any]:
        data = asdict(self)
        data["owners"] = [asdict(o) for o in self.owners]
        return data


_RANDOM_HOLD_ID = re.compile(r"[0-9a-f]{12}")


def parse_owner(owner: str, count: int, host: Optional[str] = None, pid: Optional[int] = None,
                *, mode: str = "exclusive", token: Optional[int] = None,
                lease: Optional[int] = None) -> Owner:
    """Split an owner field ``<session id>:<thread ident | random hold id>``.

    A thread-owned hold's second part is the decimal thread ident; a DistLock's is 12 random hex
    digits (6 random bytes). Twelve decimal digits fit both; they are reported as a hold id, as
    a thread ident that short is rare on 64-bit systems (see :func:`guess_kind`).
    """
    session, sep, rest = owner.rpartition(":")
    thread: Optional[int] = None
    hold_id: Optional[str] = None
    if not sep:
        session = owner
    elif rest.isdigit() and not _RANDOM_HOLD_ID.fullmatch(rest):
        thread = int(rest)
    else:
        hold_id = rest
    return Owner(owner=owner, session=session, thread=thread, hold_id=hold_id, count=count,
                 host=host, pid=pid, mode=mode, token=token, lease_ms=lease)


def parse_info(info: Optional[str]) -> Tuple[Optional[str], Optional[int]]:
    """``host:pid`` -> (host, pid); tolerant of hosts that contain colons."""
    if not info:
        return None, None
    host, sep, pid = info.rpartition(":")
    if not sep:
        return info, None
    try:
        return host, int(pid)
    except ValueError:
        return info, None


def guess_kind(owners: Sequence[Owner], recorded: Optional[str]) -> str:
    """The kind of primitive behind an exclusive lock hash.

    A ``:k`` field recorded by the primitive wins. Otherwise the owner ids tell: a thread ident
    means DistRLock, a random hold id DistLock. Twelve decimal digits could be either.
    """
    if recorded:
        return recorded
    kinds = set()
    for owner in owners:
        if owner.thread is not None:
            kinds.add("DistRLock")
        elif owner.hold_id is not None and owner.hold_id.isdigit():
            kinds.add("DistLock/DistRLock")
        elif owner.hold_id is not None and _RANDOM_HOLD_ID.fullmatch(owner.hold_id):
            kinds.add("DistLock")
        else:
            kinds.add("unknown (hash)")
    if not kinds:
        return "unknown (hash)"
    return kinds.pop() if len(kinds) == 1 else "/".join(sorted(kinds))


def _split_hash(fields: Optional[Mapping[Raw, Raw]]) -> Tuple[Dict[str, str], List[Tuple[str, str]]]:
    meta: Dict[str, str] = {}
    plain: List[Tuple[str, str]] = []
    for raw_field, raw_value in (fields or {}).items():
        name = _text(raw_field) or ""
        value = _text(raw_value) or ""
        if name.startswith(":"):
            meta[name] = value
        else:
            plain.append((name, value))
    return meta, plain


def free_state(name: str, key: str, fence: Optional[Raw]) -> LockState:
    """Nothing of this name is held; ``token`` is the last one granted."""
    token = _int(fence)
    return LockState(name=name, key=key, kind="free", held=False, token=token, fence=token)


def exclusive_state(name: str, key: str, key_type: Optional[Raw],
                    fields: Optional[Mapping[Raw, Raw]], pttl: Optional[int],
                    fence: Optional[Raw]) -> Optional[LockState]:
    """The state of an exclusive hold (DistLock, DistRLock); None when the key is absent.

    ``key_type`` is the TYPE reply of the lock key (``none`` when absent), ``fields`` its
    HGETALL reply (ignored unless it is a hash), ``pttl`` its PTTL reply (-2 absent, -1 no
    expiry), ``fence`` the GET reply of the ``:fence`` key.
    """
    fence_token = _int(fence)
    kind_raw = _text(key_type) or "none"
    if kind_raw == "none":
        return None
    lease = pttl if pttl is not None and pttl >= 0 else None
    if kind_raw != "hash":
        return LockState(name=name, key=key, kind=f"unknown ({kind_raw})", held=True,
                         lease_ms=lease, token=fence_token, fence=fence_token)
    meta, plain = _split_hash(fields)
    host, pid = parse_info(meta.pop(":i", None))
    owners = tuple(sorted(
        (parse_owner(o, _int(c) or 0, host, pid) for o, c in plain), key=lambda o: o.owner))
    token = _int(meta.pop(":t", None))
    kind = guess_kind(owners, meta.pop(":k", None))
    if meta.pop(":n", None) is not None:  # granted by a fair lock's script (the wait's nonce)
        kind = f"{kind} (fair)"
    age = hold_age(meta.pop(":l", None), pttl)
    since = _int(meta.pop(":s", None))
    return LockState(
        name=name, key=key, kind=kind, held=True, owners=owners,
        count=sum(o.count for o in owners), lease_ms=lease,
        token=token if token is not None else fence_token, fence=fence_token,
        waiting_writers=0, age_ms=age, waiting_since_ms=since, extra=dict(sorted(meta.items())),
    )


def hold_age(total_lease: Optional[Raw], pttl: Optional[int]) -> Optional[int]:
    """A hold's age in ms from its ``:l`` field (every lease it was given, in all) and its
    PTTL; None when either is unknown."""
    total = _int(total_lease)
    if total is None or pttl is None or pttl < 0:
        return None
    return max(0, total - pttl)


def _pairs(reply: Any) -> List[Tuple[str, float]]:
    """A ZRANGE ... WITHSCORES reply (list of pairs, or a flat list) as (member, score)."""
    if not reply:
        return []
    items = list(reply)
    if isinstance(items[0], (list, tuple)):
        return [(_text(m) or "", float(s)) for m, s in items]
    return [(_text(items[i]) or "", float(items[i + 1])) for i in range(0, len(items) - 1, 2)]


def rw_state(name: str, writer_key: str, *, writer_type: Optional[Raw],
             writer_fields: Optional[Mapping[Raw, Raw]], writer_pttl: Optional[int],
             readers: Any, queue: Any, now_ms: int, fence: Optional[Raw]) -> Optional[LockState]:
    """The state of a DistReadWriteLock; None when neither side is held.

    ``writer_type``, ``writer_fields`` and ``writer_pttl`` are the TYPE, HGETALL and PTTL
    replies of the writer hash ``writer_key``; ``fence`` the GET reply of the ``:fence`` key.
    ``readers`` and ``queue`` are ``ZRANGE key 0 -1 WITHSCORES`` replies: read holds
    (``<owner>#<token>`` -> lease deadline) and waiting writers' entries, both in server ms;
    ``now_ms`` is the server's TIME. Readers past their deadline are gone, as keys past their
    TTL are. A read hold's reentrancy depth lives in its process only, so it shows as 1.
    """
    fence_token = _int(fence)
    waiting = sum(1 for _, score in _pairs(queue) if score > now_ms)
    owners: List[Owner] = []
    token: Optional[int] = None
    lease: Optional[int] = None
    age: Optional[int] = None
    if (_text(writer_type) or "none") == "hash":
        meta, plain = _split_hash(writer_fields)
        host, pid = parse_info(meta.get(":i"))
        token = _int(meta.get(":t"))
        for owner, count in plain:
            owners.append(parse_owner(owner, _int(count) or 0, host, pid, mode="write"))
        lease = writer_pttl if writer_pttl is not None and writer_pttl >= 0 else None
        age = hold_age(meta.get(":l"), writer_pttl)
    for member, score in _pairs(readers):
        if score <= now_ms:
            continue
        owner, _, raw_token = member.rpartition("#")
        raw_token, _, info = raw_token.partition("@")  # '@host:pid' since Core v2
        reader_token = _int(raw_token)
        left = int(score - now_ms)
        host, pid = parse_info(info)
        owners.append(parse_owner(owner or member, 1, host, pid, mode="read", token=reader_token,
                                  lease=left))
        if reader_token is not None and (token is None or reader_token > token):
            token = reader_token
        lease = left if lease is None else max(lease, left)
    if not owners:
        return None
    return LockState(name=name, key=writer_key, kind="DistReadWriteLock", held=True,
                     owners=tuple(owners), count=sum(o.count for o in owners), lease_ms=lease,
                     token=token if token is not None else fence_token, fence=fence_token,
                     waiting_writers=waiting, age_ms=age)


def name_from_key(prefix: str, key: Raw, suffixes: Iterable[str] = ("",)) -> Optional[str]:
    """The primitive name of a key ``<prefix>{<escaped name>}<suffix>`` for one of
    ``suffixes``; None for any other key."""
    text = _text(key) or ""
    start = prefix + "{"
    if not text.startswith(start):
        return None
    for suffix in suffixes:
        end = "}" + suffix
        if text.endswith(end) and len(text) > len(start) + len(end):
            return unescape_name(text[len(start):len(text) - len(end)])
    return None


_GLOB_SPECIAL = re.compile(r"([\\*?\[\]])")


def glob_escape(text: str) -> str:
    """Escape Redis glob characters so that ``text`` matches only itself."""
    return _GLOB_SPECIAL.sub(r"\\\1", text)


def scan_pattern(prefix: str, pattern: str) -> str:
    """The SCAN MATCH pattern for every key of the names that match the glob ``pattern``."""
    return f"{glob_escape(prefix)}{{{pattern}}}*"


# --- distlock top: one row per primitive, no I/O ------------------------------------------------
#
# ``distlock top`` SCANs the keyspace, groups the keys it finds by name and primitive
# (``group_keys``), reads the state of the primitives it will show (the I/O is in ``_top.py``),
# and turns the replies into rows (``*_row`` below; locks and read/write locks through
# ``exclusive_state`` / ``rw_state``, as ``status`` does), sorted by the oldest wait.

#: families of primitives, as ``group_keys`` names them
LOCK, RW, SEM, EVENT, BARRIER, COND = "lock", "rw", "sem", "ev", "bar", "cond"

#: a key's role in its primitive: something held (or set, or recorded), or someone waiting
HOLD, WAIT, READERS, LEASES = "hold", "wait", "readers", "leases"


def split_key(prefix: str, key: Raw) -> Optional[Tuple[str, str]]:
    """``<prefix>{<escaped name>}<suffix>`` -> (name, suffix); None for any other key. The
    escaped name holds no ``}`` (see ``escape_name``), so the first ``}`` ends the tag."""
    text = _text(key) or ""
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
        entry.keys[role] = _text(key) or ""
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
    #: how long the current hold has been held (ms); None when not recorded
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
    """A DistReadWriteLock's row from its ``rw_state``: the writer, or the live readers;
    waiting writers are counted (waiting readers are not recorded in Redis)."""
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
                  age_ms=state.age_ms if writer else None, lease_ms=state.lease_ms,
                  token=state.token, waiting=state.waiting_writers, note=note)


def semaphore_row(name: str, members: Any, pttl: Optional[int], *, waiting: Optional[int],
                  now_ms: int) -> Optional[TopRow]:
    """A DistSemaphore's row from ``ZRANGE <sem> 0 -1 WITHSCORES`` (permit id -> lease deadline,
    ``+inf`` for a permit taken at rest, whose deadline is the key's expiry; ``~v`` and ``~x``
    -> -(value + 1), -(extra + 1)), the key's PTTL and the live waiting callers. Permit ids
    (``<session id>:<thread ident>:<n>``) record no host: the holders are session ids."""
    value: Optional[int] = None
    extra = 0
    permits: List[Tuple[str, int]] = []
    for member, score in _pairs(members):
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
    parties = _int(fields[0]) if fields else None
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
    first = _pairs(oldest)
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

    def to_json(self) -> Dict[str, Any]:
        data = asdict(self)
        data["rows"] = [row.to_json() for row in self.rows]
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


def _cells(row: TopRow) -> Tuple[str, ...]:
    holder = row.holders[0] if row.holders else "-"
    if ":" not in holder and len(holder) == 32:  # a session id: no host recorded
        holder = f"session {holder[:8]}"
    if len(row.holders) > 1:
        holder += f" +{len(row.holders) - 1}"
    return (row.name, row.kind, holder, duration(row.age_ms), duration(row.lease_ms),
            "-" if row.token is None else str(row.token), str(row.waiting) if row.waiting else "-",
            duration(row.oldest_wait_ms) if row.waiting else "-", row.note)


def format_top(snapshot: TopSnapshot, width: Optional[int] = None, *, live: bool = False,
               error: Optional[str] = None) -> List[str]:
    """The text of one refresh: two header lines, the column titles, one line per row, each cut
    to ``width`` characters (None: not cut)."""
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
    if error:
        lines[1] = f"{error} (showing the last refresh)"
    cells = [TOP_COLUMNS] + [_cells(row) for row in snapshot.rows]
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
    return lines
