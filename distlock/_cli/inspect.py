"""Reading lock state for ``distlock status``, ``list``, ``release`` and ``top``: no I/O here.

The command line fetches raw replies (TYPE, HGETALL, PTTL, GET, ZRANGE, TIME) and hands them to
the functions below, which turn them into :class:`LockState` records. Keeping the parsing free of
I/O lets the tests feed it any hash a primitive may write, and lets an asyncio twin share it.
``top``'s rows are made of these records in ``top_rows``.

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
read holds are members of a sorted set, ``<owner>#<token>@<host:pid>`` -> lease deadline (server
ms). A read hold's age is read from its token (``token_age``): ``next_token`` (_prelude.lua)
makes every fencing token the server's clock at its grant, in µs. A semaphore's permits carry
their grant time in their ids (``permit_age``).
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

import redis

from .._core.election import split_info
from .._core.keys import unescape_name
from .._core.permits import grant_ms

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
    "semaphore_state",
    "event_state",
    "barrier_state",
    "name_from_key",
    "scan_pattern",
    "glob_escape",
    "hold_age",
    "token_age",
    "permit_age",
    "oldest",
    "text_of",
    "int_of",
    "zset_pairs",
    "Raw",
]


def pipeline_reply(value: Any) -> Any:
    """One reply of a pipeline run with ``raise_on_error=False``, as ``status`` and ``top``
    read them: a lost connection raises; any other error (a key of another type) reads as
    nothing there."""
    if isinstance(value, (redis.ConnectionError, redis.TimeoutError)):
        raise value
    return None if isinstance(value, Exception) else value

Raw = Union[bytes, str]


def text_of(value: Optional[Raw]) -> Optional[str]:
    """A reply as text (bytes decoded, undecodable bytes kept as surrogates); None stays None."""
    if value is None:
        return None
    if isinstance(value, bytes):
        return value.decode("utf-8", "surrogateescape")
    return str(value)


def int_of(value: Optional[Raw]) -> Optional[int]:
    """A reply as a whole number (a decimal's integer part); None when none or not a number."""
    text = text_of(value) if not isinstance(value, (int, float)) else str(int(value))
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
    #: the value its hold carries (``DistLock(holder=...)``, an election's value), else None
    holder: Optional[str] = None


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
    #: how long the current hold has been held, in ms: for a read/write lock the writer's, else
    #: the oldest live reader's; for a semaphore the oldest live permit's. None when free or not
    #: recorded (a hold granted by an older version)
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
    """``host:pid`` (and an election's `` <value>`` after it) -> (host, pid); tolerant of
    hosts that contain colons."""
    host, pid, _value = split_info(info)
    return host, pid


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
        name = text_of(raw_field) or ""
        value = text_of(raw_value) or ""
        if name.startswith(":"):
            meta[name] = value
        else:
            plain.append((name, value))
    return meta, plain


def free_state(name: str, key: str, fence: Optional[Raw]) -> LockState:
    """Nothing of this name is held; ``token`` is the last one granted."""
    token = int_of(fence)
    return LockState(name=name, key=key, kind="free", held=False, token=token, fence=token)


def exclusive_state(name: str, key: str, key_type: Optional[Raw],
                    fields: Optional[Mapping[Raw, Raw]], pttl: Optional[int],
                    fence: Optional[Raw]) -> Optional[LockState]:
    """The state of an exclusive hold (DistLock, DistRLock); None when the key is absent.

    ``key_type`` is the TYPE reply of the lock key (``none`` when absent), ``fields`` its
    HGETALL reply (ignored unless it is a hash), ``pttl`` its PTTL reply (-2 absent, -1 no
    expiry), ``fence`` the GET reply of the ``:fence`` key.
    """
    fence_token = int_of(fence)
    kind_raw = text_of(key_type) or "none"
    if kind_raw == "none":
        return None
    lease = pttl if pttl is not None and pttl >= 0 else None
    if kind_raw != "hash":
        return LockState(name=name, key=key, kind=f"unknown ({kind_raw})", held=True,
                         lease_ms=lease, token=fence_token, fence=fence_token)
    meta, plain = _split_hash(fields)
    host, pid, holder = split_info(meta.pop(":i", None))
    owners = tuple(sorted(
        (replace(parse_owner(o, int_of(c) or 0, host, pid), holder=holder) for o, c in plain),
        key=lambda o: o.owner))
    token = int_of(meta.pop(":t", None))
    kind = guess_kind(owners, meta.pop(":k", None))
    if meta.pop(":n", None) is not None:  # granted by a fair lock's script (the wait's nonce)
        kind = f"{kind} (fair)"
    age = hold_age(meta.pop(":l", None), pttl)
    since = int_of(meta.pop(":s", None))
    return LockState(
        name=name, key=key, kind=kind, held=True, owners=owners,
        count=sum(o.count for o in owners), lease_ms=lease,
        token=token if token is not None else fence_token, fence=fence_token,
        waiting_writers=0, age_ms=age, waiting_since_ms=since, extra=dict(sorted(meta.items())),
    )


def semaphore_state(name: str, key: str, members: Any, pttl: Optional[int], *,
                    waiting: Optional[int], now_ms: int, fence: Optional[Raw]) -> Optional[LockState]:
    """A DistSemaphore (or DistBoundedSemaphore: Redis cannot tell them apart) from ``ZRANGE
    <sem> 0 -1 WITHSCORES`` (permit id -> lease deadline, ``+inf`` for a permit taken at rest,
    whose deadline is the key's expiry; ``~v`` and ``~x`` -> -(value + 1), -(extra + 1)), the
    key's PTTL and its waiting callers (``ZCARD`` of its queue); None when no permit is held,
    nobody waits and no release raised its count. One owner per held permit (ids
    ``<session id>:<thread ident>:<n>@<grant ms>``, see ``permit_age``); the age is the oldest
    live permit's."""
    value: Optional[int] = None
    extra = 0
    owners: List[Owner] = []
    ages: List[Optional[int]] = []
    for member, score in zset_pairs(members):
        if member == "~v":
            value = int(-score) - 1
        elif member == "~x":
            extra = int(-score) - 1
        else:
            left = pttl if score == float("inf") else int(score - now_ms)
            if left is not None and left >= 0:
                session, _, rest = member.partition(":")
                thread = int_of(rest.partition(":")[0])
                owners.append(Owner(owner=member, session=session, thread=thread, hold_id=None,
                                    count=1, mode="permit", lease_ms=left))
                ages.append(permit_age(member, now_ms))
    queued = int(waiting or 0)
    if not owners and not queued and not extra:
        return None  # (a count raised by releases beyond the permits held is state at rest)
    words: Dict[str, str] = {}
    if value is not None:
        words["permits"] = f"{len(owners)} of {value + extra} held"
        if extra:
            words["raised"] = (f"its count, by {extra} release(s) beyond the permits held "
                               "(kept in Redis for good)")
    if queued:
        words["waiting"] = f"{queued} caller(s) wait for a permit"
    token = int_of(fence)
    return LockState(name=name, key=key, kind="DistSemaphore", held=bool(owners),
                     owners=tuple(owners), count=len(owners),
                     lease_ms=min((o.lease_ms for o in owners if o.lease_ms is not None), default=None),
                     token=token, fence=token, age_ms=oldest(ages), extra=words)


def event_state(name: str, key: str, is_set: bool, *, waiting: Optional[int],
                fence: Optional[Raw]) -> Optional[LockState]:
    """A DistEvent: set (its state at rest) or waited on; None when neither."""
    queued = int(waiting or 0)
    if not is_set and not queued:
        return None
    words = {"state": "set" if is_set else "clear"}
    if queued:
        words["waiting"] = f"{queued} caller(s) wait for it to be set"
    token = int_of(fence)
    return LockState(name=name, key=key, kind="DistEvent", held=is_set, token=token, fence=token,
                     extra=words)


def barrier_state(name: str, key: str, fields: Sequence[Optional[Raw]], *,
                  waiting: Optional[int], fence: Optional[Raw]) -> Optional[LockState]:
    """A DistBarrier from ``HMGET <bar> p b``: broken (its state at rest) or with parties
    waiting; None when neither."""
    parties = int_of(fields[0]) if fields else None
    broken = bool(fields[1]) if len(fields) > 1 else False
    queued = int(waiting or 0)
    if not queued and not broken:
        return None
    words = {"parties": f"{queued} of {parties} arrived" if parties is not None else f"{queued} arrived"}
    if broken:
        words["state"] = "broken (until reset())"
    token = int_of(fence)
    return LockState(name=name, key=key, kind="DistBarrier", held=broken, token=token,
                     fence=token, extra=words)


def hold_age(total_lease: Optional[Raw], pttl: Optional[int]) -> Optional[int]:
    """A hold's age in ms from its ``:l`` field (every lease it was given, in all) and its
    PTTL; None when either is unknown."""
    total = int_of(total_lease)
    if total is None or pttl is None or pttl < 0:
        return None
    return max(0, total - pttl)


#: a fencing token below this is a counter that never met the clock's floor, not a time (µs
#: since the epoch: 2001-09-09)
TOKEN_TIME_FLOOR = 10 ** 15


def token_age(token: Optional[int], now_ms: int) -> Optional[int]:
    """A hold's age in ms from its fencing token and the server's clock (``now_ms``, TIME).

    ``next_token`` (_prelude.lua) makes a token max(INCR of the name's counter, the server's
    clock in µs): the counter is ahead of the clock only by one per grant made within the same
    µs, or after the server's clock went back, so the token is the server's time of the grant
    and the age is ``now_ms - token / 1000``, never negative. None when unknown, or when the
    token is clearly not a time (below ``TOKEN_TIME_FLOOR``: a counter that never met the floor,
    as the tokens of versions before the floor were)."""
    if token is None or token < TOKEN_TIME_FLOOR:
        return None
    return max(0, now_ms - token // 1000)


def permit_age(permit: str, now_ms: int) -> Optional[int]:
    """A semaphore permit's age in ms from its id, ``<session id>:<thread>:<n>@<grant ms>``
    (``_core.permits``: the acquiring host's clock at the try that got it; the server reads no
    clock on the uncontended path), and the server's clock: ``now_ms - <grant ms>``, never
    negative, so a skew between the two clocks shows in it. None for an id that carries no
    time (an older version's)."""
    granted = grant_ms(permit)
    return None if granted is None else max(0, now_ms - granted)


def oldest(ages: Iterable[Optional[int]]) -> Optional[int]:
    """The oldest of some holds' ages (ms): None when none is known."""
    return max((age for age in ages if age is not None), default=None)


def zset_pairs(reply: Any) -> List[Tuple[str, float]]:
    """A ZRANGE ... WITHSCORES reply (list of pairs, or a flat list) as (member, score)."""
    if not reply:
        return []
    items = list(reply)
    if isinstance(items[0], (list, tuple)):
        return [(text_of(m) or "", float(s)) for m, s in items]
    return [(text_of(items[i]) or "", float(items[i + 1])) for i in range(0, len(items) - 1, 2)]


def rw_state(name: str, writer_key: str, *, writer_type: Optional[Raw],
             writer_fields: Optional[Mapping[Raw, Raw]], writer_pttl: Optional[int],
             readers: Any, queue: Any, now_ms: int, fence: Optional[Raw]) -> Optional[LockState]:
    """The state of a DistReadWriteLock; None when neither side is held.

    ``writer_type``, ``writer_fields`` and ``writer_pttl`` are the TYPE, HGETALL and PTTL
    replies of the writer hash ``writer_key``; ``fence`` the GET reply of the ``:fence`` key.
    ``readers`` and ``queue`` are ``ZRANGE key 0 -1 WITHSCORES`` replies: read holds
    (``<owner>#<token>@<host:pid>`` -> lease deadline) and waiting writers' entries, both in
    server ms; ``now_ms`` is the server's TIME. Readers past their deadline are gone, as keys
    past their TTL are. A read hold's reentrancy depth lives in its process only, so it shows
    as 1. The age is the writer's (``hold_age``), else the oldest live reader's (``token_age``).
    """
    fence_token = int_of(fence)
    waiting = sum(1 for _, score in zset_pairs(queue) if score > now_ms)
    owners: List[Owner] = []
    token: Optional[int] = None
    lease: Optional[int] = None
    age: Optional[int] = None
    reader_ages: List[Optional[int]] = []
    if (text_of(writer_type) or "none") == "hash":
        meta, plain = _split_hash(writer_fields)
        host, pid = parse_info(meta.get(":i"))
        token = int_of(meta.get(":t"))
        for owner, count in plain:
            owners.append(parse_owner(owner, int_of(count) or 0, host, pid, mode="write"))
        lease = writer_pttl if writer_pttl is not None and writer_pttl >= 0 else None
        age = hold_age(meta.get(":l"), writer_pttl)
    for member, score in zset_pairs(readers):
        if score <= now_ms:
            continue
        owner, _, raw_token = member.rpartition("#")
        raw_token, _, info = raw_token.partition("@")  # '@host:pid' since Core v2
        reader_token = int_of(raw_token)
        left = int(score - now_ms)
        host, pid = parse_info(info)
        owners.append(parse_owner(owner or member, 1, host, pid, mode="read", token=reader_token,
                                  lease=left))
        if reader_token is not None and (token is None or reader_token > token):
            token = reader_token
        lease = left if lease is None else max(lease, left)
        reader_ages.append(token_age(reader_token, now_ms))
    if not owners:
        return None
    if age is None:
        age = oldest(reader_ages)
    return LockState(name=name, key=writer_key, kind="DistReadWriteLock", held=True,
                     owners=tuple(owners), count=sum(o.count for o in owners), lease_ms=lease,
                     token=token if token is not None else fence_token, fence=fence_token,
                     waiting_writers=waiting, age_ms=age)


def name_from_key(prefix: str, key: Raw, suffixes: Iterable[str] = ("",)) -> Optional[str]:
    """The primitive name of a key ``<prefix>{<escaped name>}<suffix>`` for one of
    ``suffixes``; None for any other key."""
    text = text_of(key) or ""
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
