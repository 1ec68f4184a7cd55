"""Key and channel names"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Tuple


def escape_name(name: str) -> str:
    """The name as it appears inside the hash tag: ``%``, ``{`` and ``}`` percent-encoded.

    Without it a name starting with ``}`` would give an empty tag (Redis then hashes the whole
    key, scattering one primitive over several slots). The encoding is reversible
    (``unescape_name``) and leaves every name without those three characters unchanged.
    """
    if "%" in name or "{" in name or "}" in name:
        return name.replace("%", "%25").replace("{", "%7B").replace("}", "%7D")
    return name


def unescape_name(escaped: str) -> str:
    """Inverse of ``escape_name``."""
    if "%" not in escaped:
        return escaped
    return escaped.replace("%7D", "}").replace("%7B", "{").replace("%25", "%")


#: The keys that give a name its kind (docs/guides/kinds.rst), as suffixes of the name's tag,
#: by kind: L a lock (DistLock, DistRLock, DistCondition: its hash, its registry of waiting
#: processes, its fair queue, and the waiters' leases of the condition of the same name:
#: ``%s`` is the name itself, as ``CondKeys`` spells it), W a read/write lock, S a semaphore,
#: E an event, B a barrier.
KIND_KEYS = {"L": ("", ":q", ":fd", ":cond:l:%s"), "W": (":rw:w", ":rw:r", ":rw:q"),
             "S": (":sem", ":sem:q"), "E": (":ev", ":ev:w", ":ev:t"), "B": (":bar", ":bar:w")}

#: The kinds that may not share a name with each kind, in the order its scripts take their
#: keys (``wrong_kind`` in lua/_prelude.lua, whose ``COUNT`` is ``KIND_KEYS``' lengths).
OTHER_KINDS = {"L": "SEB", "W": "SEB", "S": "LWEB", "E": "LWSB", "B": "LWSE"}


def other_kinds(tag: str, name: str, kind: str) -> Tuple[str, ...]:
    """The keys of ``name`` (whose hash tag is ``tag``) that tell whether it is in use as a
    kind that ``kind`` may not share it with: the last KEYS of each script that gives a name
    its kind."""
    return tuple(tag + (suffix % name if "%s" in suffix else suffix)
                 for other in OTHER_KINDS[kind] for suffix in KIND_KEYS[other])


class Keys:
    """Key and channel names of one primitive.

    Every name is ``<prefix>{<name>}<suffix>``: the braces are a Redis Cluster hash tag, so all
    keys of one primitive map to one slot and every script touches one slot only. Braces and
    ``%`` inside a name are percent-encoded (``escape_name``), so the tag is always the whole,
    non-empty name, and two names never share a key. Suffixes are chosen so that no
    ``}suffix`` ends another (``tests/unit/test_core.py`` checks both). The names are computed once:
    they are on every round trip.
    """

    __slots__ = ("prefix", "name", "tag", "lock", "fence", "channel", "queue", "others", "rw")

    def __init__(self, prefix: str, name: str) -> None:
        self.prefix = prefix
        self.name = name
        self.tag = f"{prefix}{{{escape_name(name)}}}"
        #: hash: owner -> reentrancy count, plus the ``:t`` (token) and ``:i`` (info) fields
        self.lock = self.tag
        #: string: the last fencing token granted for this name; the only key left at rest
        self.fence = self.tag + ":fence"
        #: pub/sub channel: wake-up hints for every waiter of the name (force-release, and
        #: primitives built on top); exclusive locks wake one process via ``waiter_channel``
        self.channel = self.tag + ":wake"
        #: sorted set: the wake-up channels of processes waiting for an exclusive lock
        self.queue = self.tag + ":q"
        #: the keys of the kinds a lock may not share its name with (``other_kinds``)
        self.others = other_kinds(self.tag, name, "L")
        #: the writer hash and the readers of the DistReadWriteLock of the same name, which a
        #: lock's tries look at (``rw_held``): a name is one lock (see ``RWKeys``)
        self.rw = (self.tag + ":rw:w", self.tag + ":rw:r")

    def waiter_channel(self, session_id: str) -> str:
        """The wake-up channel of one process (session) waiting for an exclusive lock."""
        return f"{self.channel}:{session_id}"

    def sub(self, suffix: str) -> str:
        """Another key of the same primitive (same hash tag), for primitives built on top."""
        return f"{self.tag}:{suffix}"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Keys) and (self.prefix, self.name) == (other.prefix, other.name)

    def __hash__(self) -> int:
        return hash((self.prefix, self.name))

    def __repr__(self) -> str:
        return f"Keys(prefix={self.prefix!r}, name={self.name!r})"





@dataclass(frozen=True)
class CondKeys:
    """Keys and channel of one condition.

    They are sub-keys of ``base``: the lock's :class:`Keys` when the lock is a Dist lock (so the
    condition shares the lock's hash tag and cluster slot, and one script can release the lock
    and join the queue), else the condition's own. The condition's name comes last, after a
    one-letter kind, so two conditions (or two kinds) never share a key, and the ``cond:`` part
    keeps them apart from the lock's own keys (``<tag>``, ``<tag>:fence``, ``<tag>:wake``).

    - ``queue``: sorted set, waiter id -> arrival (server clock, µs, strictly increasing): the
      waiters no ``notify`` has picked yet, oldest first;
    - ``leases``: sorted set, waiter id -> lease deadline (server clock, ms), for the same
      waiters; ``notify`` drops the expired ones (a process that died while waiting). A waiter
      that ``notify`` picked is in neither key any more: that is how it knows;
    - ``channel``: pub/sub, ``=id1,id2`` hints naming the waiters a ``notify`` picked.

    Both keys expire with the last lease in them, so dead waiters leave nothing for good.
    """

    queue: str
    leases: str
    channel: str

    @classmethod
    def of(cls, base: Keys, name: str) -> CondKeys:
        return cls(
            queue=base.sub("cond:q:" + name),
            leases=base.sub("cond:l:" + name),
            channel=base.sub("cond:w:" + name),
        )

    @property
    def state(self) -> Tuple[str, str]:
        """The data keys, in the order every ``cond_*`` script takes them."""
        return (self.queue, self.leases)





@dataclass(frozen=True)
class SemKeys:
    """Every key and channel of one DistSemaphore / DistBoundedSemaphore, under the name's tag.

    - ``sem``: sorted set, one member per held permit, permit id -> lease deadline (server ms);
      plus two counters with negative scores: ``~v`` -> -(value + 1), the value the semaphore
      was created with, and ``~x`` -> -(extra + 1), how many releases went beyond the permits
      held (threading's counter raised by ``release()`` without ``acquire()``; absent when 0).
      Live permits are the scores above now; expired ones (a holder that died) are removed by
      the next script that looks, in O(log n), so a dead holder's permits come back when its
      lease runs out. The free permits are ``value + extra - live permits``. The key lives as
      long as its latest lease while extra is 0, for good while it is not, and not at all at
      rest (nothing held, extra 0).
    - ``handed``: sorted set, permit id -> its lease deadline, for permits released on their
      owner's behalf by a process that held none (see ``DistSemaphore.release``): the owner's
      watchdog then forgets the permit instead of calling it lost.
    - ``queue``: sorted set, waiter id -> entry deadline (server ms): the callers waiting for a
      permit. While it exists, a release publishes a wake-up hint.
    - ``channel``: the hints, ``"<n>"``: wake up to n waiters per process.
    """

    sem: str
    handed: str
    queue: str
    channel: str
    others: Tuple[str, ...]

    @classmethod
    def of(cls, prefix: str, name: str) -> SemKeys:
        keys = Keys(prefix, name)
        return cls(sem=keys.sub("sem"), handed=keys.sub("sem:x"), queue=keys.sub("sem:q"),
                   channel=keys.sub("sem:wake"), others=other_kinds(keys.tag, name, "S"))

    # The KEYS tuples are made once per primitive, not per call: they are on every round trip.

    @functools.cached_property
    def acquire(self) -> Tuple[str, ...]:
        """KEYS of ``sem_acquire``."""
        return (self.sem, self.queue, self.channel, *self.others)

    @functools.cached_property
    def release(self) -> Tuple[str, ...]:
        """KEYS of ``sem_release`` beyond the caller's own permits (it may make a semaphore)."""
        return (self.sem, self.handed, self.queue, self.channel, *self.others)

    @functools.cached_property
    def release_own(self) -> Tuple[str, str, str, str]:
        """KEYS of ``sem_release`` of the caller's own permits: without the other kinds' keys,
        which only a release that makes a semaphore checks (it answers ``REL_UNCHECKED``)."""
        return (self.sem, self.handed, self.queue, self.channel)

    @property
    def renew(self) -> Tuple[str, str]:
        """KEYS of ``sem_renew``."""
        return (self.sem, self.handed)


@dataclass(frozen=True)
class EventKeys:
    """Every key and channel of one DistEvent.

    - ``flag``: string ``"1"``; it exists exactly while the event is set. An Event is state:
      a set event stays set in Redis, for good, until ``clear()``.
    - ``waiters``: sorted set, waiter id -> entry deadline (server ms). ``set()`` moves every
      live entry to ``taken`` and names those waiters in one hint: the event was set while they
      waited, even if it was cleared since.
    - ``taken``: sorted set, waiter id -> entry deadline: the entries a ``set()`` took, until
      each waiter has looked (a woken waiter's look takes its own out). A waiter whose entry is
      gone returns True only when it finds itself here, so a restart that lost the data is
      never taken for a ``set()``. Gone once the waiters looked, or their deadlines passed.
    - ``channel``: hints ``=id1,id2,...`` naming the waiters a ``set()`` took (``*`` when too
      many to name).
    """

    flag: str
    waiters: str
    channel: str
    taken: str
    others: Tuple[str, ...]

    @classmethod
    def of(cls, prefix: str, name: str) -> EventKeys:
        keys = Keys(prefix, name)
        return cls(flag=keys.sub("ev"), waiters=keys.sub("ev:w"), channel=keys.sub("ev:wake"),
                   taken=keys.sub("ev:t"), others=other_kinds(keys.tag, name, "E"))

    @functools.cached_property
    def set(self) -> Tuple[str, ...]:
        """KEYS of ``ev_set``."""
        return (self.flag, self.waiters, self.channel, self.taken, *self.others)

    @functools.cached_property
    def join(self) -> Tuple[str, ...]:
        """KEYS of ``ev_wait``'s join (it gives the name its kind)."""
        return (self.flag, self.waiters, self.taken, *self.others)

    @functools.cached_property
    def look(self) -> Tuple[str, str, str]:
        """KEYS of ``ev_wait``'s look and leave."""
        return (self.flag, self.waiters, self.taken)


@dataclass(frozen=True)
class BarrierKeys:
    """Every key and channel of one DistBarrier.

    - ``state``: hash, ``p`` -> parties, ``g`` -> the current generation (strictly increasing,
      floored by the server clock in µs), ``o`` -> the first generation this hash recorded,
      ``k`` -> until when (server ms) the parties released by the latest trip may look (their
      latest lease deadline), ``b`` -> ``"1"`` while broken, and while the last party of a
      generation runs the action: ``a`` -> that generation, ``ad`` -> the runner's lease
      deadline (server ms), ``ar`` -> the runner's id. A party whose generation is no longer
      the current one learns that it tripped from this hash: it ended after ``o`` and is not
      among the broken ones. So the hash lives for good while broken (until ``reset()``), as
      long as the leases in it while parties wait, at rest until ``k`` (without ``p``: at rest
      the number of parties is forgotten), and then not at all. A party that finds no hash
      that knows its generation (the server lost its data, or every lease in it ran out before
      it looked) does not take that for a trip: its generation broke.
    - ``waiters``: sorted set, waiter id -> lease deadline (server ms): the parties of the current
      generation that arrived and wait. A party's index is the size of this set when it
      arrived. A lease that runs out (the party's process died) breaks the barrier.
    - ``broken``: sorted set, generation -> when the record goes (server ms): generations that
      ended broken (timeout, abort, reset, an action that raised, a dead party). A generation
      that ended and is not here tripped.
    - ``channel``: hints ``=id1,...`` naming the parties a trip released (they return at
      once), and ``*`` when the barrier breaks (every waiter looks).
    """

    state: str
    waiters: str
    broken: str
    channel: str
    others: Tuple[str, ...]

    @classmethod
    def of(cls, prefix: str, name: str) -> BarrierKeys:
        keys = Keys(prefix, name)
        return cls(state=keys.sub("bar"), waiters=keys.sub("bar:w"), broken=keys.sub("bar:x"),
                   channel=keys.sub("bar:wake"), others=other_kinds(keys.tag, name, "B"))

    @property
    def all(self) -> Tuple[str, str, str, str]:
        """The keys in the order every ``bar_*`` script takes them."""
        return (self.state, self.waiters, self.broken, self.channel)

    @functools.cached_property
    def checked(self) -> Tuple[str, ...]:
        """``all``, then the other kinds' keys: KEYS of ``bar_wait`` and of ``bar_reset``'s
        abort, which give the name its kind."""
        return (self.state, self.waiters, self.broken, self.channel, *self.others)





class FairKeys:
    """The keys of a fair lock's queue, beside the lock's own (``Keys``), in the order the
    ``fair_*`` scripts take them: hash, fence, ``fq`` (order), ``fd`` (deadlines), ``fe``
    (entries), and the plain lock's registry of waiting processes."""

    __slots__ = ("order", "deadlines", "entries", "all", "acquire")

    def __init__(self, keys: Keys) -> None:
        #: sorted set: wait nonce -> arrival (server µs)
        self.order = keys.sub("fq")
        #: sorted set: wait nonce -> the entry's deadline (server ms)
        self.deadlines = keys.sub("fd")
        #: hash: wait nonce -> ``<count>|<lease ms>|<owner>|<host:pid>|<process channel>``
        self.entries = keys.sub("fe")
        self.all: Tuple[str, ...] = (keys.lock, keys.fence, self.order, self.deadlines,
                                     self.entries, keys.queue)
        #: ``fair_acquire``'s: the same, then the keys of the kinds a lock may not share its
        #: name with
        self.acquire: Tuple[str, ...] = (*self.all, *keys.others, *keys.rw)





@dataclass(frozen=True)
class RWKeys:
    """Every key and channel of one DistReadWriteLock, all under the name's hash tag.

    - ``writer``: hash, writer owner -> reentrancy count, ``:t`` -> token, ``:i`` -> host:pid,
      ``:r`` -> present when readers may be waiting (the release then wakes them); its TTL is
      the writer's lease.
    - ``readers``: sorted set, one member per read hold, ``<owner>#<token>@<host:pid>``
      (``reader_member``; releases before Core v2 wrote ``<owner>#<token>``: both count alike)
      -> its lease deadline in server milliseconds (``TIME``). Live readers are the range
      ``(now..+inf``, expired ones ``-inf..now``: both found in O(log n), never by scanning
      keys. Its TTL is at least as long as its latest deadline, so a crashed process leaves
      nothing behind for good. The reentrancy depth of a read hold is kept by its process only.
    - ``queue``: sorted set, waiting writer owner -> deadline of its entry (server ms). While a
      live entry exists, new readers are refused: writer preference.
    - ``fence``: the token counter of the name, shared with every other primitive of that name:
      read and write grants draw from one strictly increasing sequence.
    - ``writer_channel``: hints for waiting writers (the last reader left; a writer left).
    - ``reader_channel``: hints for waiting readers (the writer left and none is waiting, or a
      waiting writer gave up). Two channels instead of one, so that a "1" meant for a writer is
      never taken by a reader of the same process, which could not use it.
    - ``lock`` and ``lock_queue``: the hash and the registry of waiting processes of the lock
      (``DistLock``, ``DistRLock``, ``DistCondition``) of the same name. A name is one lock: the
      write side excludes that lock's holders and they exclude it, the read side shares only
      with readers. A try refused by the lock registers this lock's channel in its registry,
      so that the lock's release hints it (``rw_enlist``, ``rw_hint``); the last release of
      this lock wakes a process waiting there (``wake_one``).
    """

    writer: str
    readers: str
    queue: str
    fence: str
    writer_channel: str
    reader_channel: str
    others: Tuple[str, ...]
    lock: str
    lock_queue: str

    @classmethod
    def of(cls, prefix: str, name: str) -> RWKeys:
        keys = Keys(prefix, name)
        return cls(
            writer=keys.sub("rw:w"),
            readers=keys.sub("rw:r"),
            queue=keys.sub("rw:q"),
            fence=keys.fence,
            writer_channel=keys.channel,
            reader_channel=keys.sub("rw:wake"),
            others=other_kinds(keys.tag, name, "W"),
            lock=keys.lock,
            lock_queue=keys.queue,
        )

    @functools.cached_property
    def read_acquire(self) -> Tuple[str, ...]:
        """KEYS of ``rw_read_acquire``."""
        return (self.writer, self.readers, self.queue, self.fence, *self.others, self.lock,
                self.lock_queue, self.reader_channel)

    @functools.cached_property
    def write_leave(self) -> Tuple[str, str, str, str, str]:
        """KEYS of ``rw_write_acquire`` for leaving the queue (mode 'l')."""
        return (self.writer, self.readers, self.queue, self.fence, self.reader_channel)

    @functools.cached_property
    def write_acquire(self) -> Tuple[str, ...]:
        """KEYS of ``rw_write_acquire`` for a try (the other kinds' keys last)."""
        return (*self.write_leave, *self.others, self.lock, self.lock_queue, self.writer_channel)

    @functools.cached_property
    def write_release(self) -> Tuple[str, str, str, str, str]:
        """KEYS of ``rw_write_release``."""
        return (self.writer, self.queue, self.writer_channel, self.reader_channel, self.lock_queue)

    @functools.cached_property
    def read_release(self) -> Tuple[str, str, str, str]:
        """KEYS of ``rw_read_release``."""
        return (self.readers, self.queue, self.writer_channel, self.lock_queue)

    def all_keys(self) -> Tuple[str, ...]:
        """Every data key (not the channels), the fence included."""
        return (self.writer, self.readers, self.queue, self.fence)
