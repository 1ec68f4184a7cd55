"""DistReadWriteLock: shared readers, exclusive writers, across threads, processes and hosts.

``rw.read_lock()`` and ``rw.write_lock()`` are two lock objects with DistRLock's whole surface,
built on the same ``_LockBase``; they differ in their scripts and their keys (``RWKeys``):

- a writer is one hash (owner -> count, token), like DistRLock's;
- each read hold is one member (``<owner>#<token>``) of a sorted set scored by its lease
  deadline on the server's clock: live readers are the scores above now, found in O(log n),
  and a reader killed with SIGKILL stops blocking writers once its lease runs out (the next
  writer removes it). Its reentrancy depth is kept by its process (the writer's, in its hash);
- a writer that has to wait is a member of a sorted set of waiting writers, whose entries are
  refreshed on every try and expire a few seconds after the last one. While any live entry
  exists, readers that do not already hold the read lock are refused: writer preference.

Both sides are owned by ``<session id>:<thread ident>``: reentrant per thread. A thread that
holds the write lock may take the read lock (downgrade). A thread that holds only the read lock
and asks for the write lock (upgrade) gets False from a single try (``blocking=False``,
``timeout=0``, ``try_lock()``), as Java's ``tryLock()`` does, without a round trip; a try that
would wait is refused at once with RuntimeError, instead of deadlocking.
"""

from __future__ import annotations

import functools
import logging
import time
from typing import Any, Optional, Tuple

import redis

from .._core.checks import check_lease, check_name
from .._core.deadlines import lease_ms
from .._core.errors import WrongKindError
from .._core.flow import Flow, Read, Run
from .._core.keys import RWKeys
from .._core.outcomes import Granted, Outcome
from .._core.outcomes import lock_acquire as decode_acquire
from .._core.replicas import give_back_unacked
from .._core.settings import settings
from .._core.wait_policy import LAST
from .._redis.clients import ClientArg
from .._session.session import Hold, Session, Waiter
from .engine import Waiting
from .lock import _ThreadOwned
from .lost import reentry_lost
from .rw_mutex import ReadWriteMutex


def reader_member(owner: str, token: int, info: str) -> str:
    """The member of the readers' sorted set that stands for one read hold:
    ``<owner>#<token>@<host:pid>`` (``rw_read_acquire`` builds the same string)."""
    return f"{owner}#{token}@{info}"


def read_release_left(held: int, count: int) -> int:
    """Depth a read hold keeps after releasing ``count`` levels (0: all, ``_release_save``)."""
    return 0 if count == 0 else max(0, held - count)


def writer_entry_ms(wait_cap: float) -> int:
    """The lease of a waiting writer's queue entry, in ms.

    A waiting writer refreshes its entry on every try, and it tries at least once per
    ``wait_cap`` (a writer's sleep is capped at ``wait_cap`` whatever its place in the local
    queue). Twice that plus a second covers one missed beat and a slow round trip; a writer that
    died or gave up without saying so stops blocking new readers that long after its last try.
    """
    return lease_ms(2.0 * wait_cap + 1.0)


def write_acquire_mode(reentry_token: str, queue_ms: int, queued: bool) -> str:
    """The ``mode`` argument of ``rw_write_acquire`` for one try (see its contract).

    A re-entry sends its token; a waiting writer sends 'q' (first try: queue if refused), 'w'
    (a later try: it may be queued already) or 'x' (its last try: leave the queue); a single
    try sends nothing.
    """
    if reentry_token:
        return reentry_token
    if queue_ms > 0:
        return "w" if queued else "q"
    return "x" if queued else ""


def write_acquire_args(owner: str, ms: int, fence_ms: int, info: str, mode: str, queue_ms: int,
                       count: int) -> Tuple[Any, ...]:
    """ARGV of ``rw_write_acquire``, without the trailing arguments it can do without: every
    argument costs the client measurable time to encode on the uncontended path."""
    head: Tuple[Any, ...] = (owner, ms, fence_ms, info)
    if count != 1:
        return head + (mode, queue_ms, count)
    if mode in ("q", "w"):
        return head + (mode, queue_ms)
    return head + (mode,) if mode else head


def optional_tail(head: Tuple[Any, ...], value: Any, default: Any) -> Tuple[Any, ...]:
    """``head`` plus ``value``, unless ``value`` is the script's default for an absent ARGV."""
    return head if value == default else head + (value,)


#: a blocking acquire() of the write lock by a thread that holds only the read lock.
UPGRADE_REFUSED = (
    "cannot acquire the write lock while holding only the read lock: two upgrading readers "
    "would wait for each other forever; release the read lock first"
)


__all__ = ["DistReadWriteLock", "DistReadLock", "DistWriteLock"]

log = logging.getLogger("distlock")


class _RWSide(_ThreadOwned):
    """What both sides share: the thread-owned, reentrant surface of DistRLock, the wait loop."""

    _kind = "RWSide"

    def __init__(self, name: str, rw: RWKeys, *, client: ClientArg, lease: Optional[float],
                 min_replicas: Optional[int] = None, replica_timeout: Optional[float] = None,
                 max_hold: Optional[float] = None) -> None:
        super().__init__(name, client=client, lease=lease, min_replicas=min_replicas,
                         replica_timeout=replica_timeout, max_hold=max_hold)
        self._rw = rw

    # --- the family's acquire (``_LockBase._acquire``), with a side's queue ----------------

    def _first_try(self, session: Session, owner: str, ms: int, count: int, waits: bool) -> Flow[int]:
        if self._upgrading(session):
            if not waits:
                # A single try cannot deadlock: refused, as Redis would refuse it (a reader
                # holds the lock: this thread), with a refusal's reply code and no round trip.
                return -1
            raise RuntimeError(UPGRADE_REFUSED)
        try:
            return (yield from self._call_acquire(session, owner, ms, count, "",
                                                  queue_ms=self._queue_ms() if waits else 0))
        except (redis.ResponseError, WrongKindError):
            raise
        except BaseException:
            if waits:  # a writer's first try may have queued it: leave the queue
                yield from self._abandon(owner)
            raise

    def _waiting(self, session: Session, owner: str, ms: int, count: int, watchdog: bool) -> Waiting:
        return _SideWaiting(self, session, owner, ms, count, watchdog, self._queue_ms())

    def _attempt(self, session: Session, mode: str, grant: Tuple[str, int, int, bool],
                 queue_ms: int) -> Flow[Outcome]:
        """One try for the wait engine; the last one (time is up) also takes a writer off
        the queue, in the same script."""
        owner, ms, count, watchdog = grant
        sent_at = time.monotonic()
        outcome = decode_acquire((yield from self._call_acquire(
            session, owner, ms, count, "", queue_ms=0 if mode == LAST else queue_ms, queued=True)))
        if type(outcome) is Granted:
            self._grant(session, owner, outcome.token, count, watchdog, ms, sent_at)
        return outcome

    # --- what each side defines ----------------------------------------------------------------

    @property
    def _wait_channel(self) -> str:
        raise NotImplementedError

    def _upgrading(self, session: Session) -> bool:
        """Whether a new hold of this side would be an upgrade (the write side: the calling
        thread holds the read side)."""
        return False

    def _queue_ms(self) -> int:
        return 0

    #: every waiter of the process sleeps at most the bound (see ``_core.wait_policy.policy``)
    _strict = False

    def _abandon(self, owner: str) -> Flow[None]:
        return
        yield

    def _call_acquire(self, session: Session, owner: str, ms: int, count: int,
                      reentry_token: str, waiter: Optional[Waiter] = None, queue_ms: int = 0,
                      queued: bool = False) -> Flow[int]:
        """One try. ``reentry_token``: '' for a new hold, else the token being re-entered.
        ``queue_ms``: a writer refused queues itself for that long (0: it does not, and leaves
        the queue if ``queued``, i.e. it may be in it from an earlier try)."""
        raise NotImplementedError


def _renew_reader(fence: str, batch: Any, hold: Hold, ms: int) -> None:
    batch.script("rw_read_renew", (hold.key, fence),
                 (reader_member(hold.owner, hold.token, hold.session.info), ms,
                  ms + settings().fence_retention_ms))


class _SideWaiting(Waiting):
    """One wait of either side: its tries, and a writer's leaving the queue when interrupted."""

    def __init__(self, side: _RWSide, session: Session, owner: str, ms: int, count: int,
                 watchdog: bool, queue_ms: int) -> None:
        self.channel = side._wait_channel
        self.strict = side._strict
        self._side = side
        self._session = session
        self._grant = (owner, ms, count, watchdog)
        self._queue_ms = queue_ms

    def attempt(self, mode: str, waiter: Any) -> Flow[Outcome]:
        return (yield from self._side._attempt(self._session, mode, self._grant, self._queue_ms))

    def abandon(self) -> Flow[None]:
        return (yield from self._side._abandon(self._grant[0]))


class DistReadLock(_RWSide):
    """The read side of a DistReadWriteLock: shared by any number of readers, anywhere.

    ``acquire()`` waits while a writer holds the lock, and also while a writer is waiting for
    it (writer preference), unless the calling thread already holds the read lock (a re-entry)
    or holds the write lock (a downgrade): neither is ever refused. Each hold has its own lease,
    renewed by the watchdog (or the explicit ``lease``), so a reader that dies stops blocking
    writers once its lease runs out. Reentrant per thread; ``threading.Condition`` accepts it.
    """

    _metric_kind = "read"

    def __init__(self, name: str, rw: RWKeys, *, client: ClientArg, lease: Optional[float],
                 min_replicas: Optional[int] = None, replica_timeout: Optional[float] = None,
                 max_hold: Optional[float] = None) -> None:
        super().__init__(name, rw, client=client, lease=lease, min_replicas=min_replicas,
                         replica_timeout=replica_timeout, max_hold=max_hold)
        # a read hold is a member of the readers' sorted set, renewed as such
        self._renew_fn = functools.partial(_renew_reader, rw.fence)

    _kind = "DistReadLock"

    @property
    def _hold_key(self) -> str:
        return self._rw.readers

    @property
    def _wait_channel(self) -> str:
        return self._rw.reader_channel

    def locked(self) -> bool:
        """Return True if any reader, in any process on any host, holds the read lock now
        (a reader whose lease ran out does not count)."""
        return self._drive(self._locked())

    def _locked(self) -> Flow[bool]:
        return int((yield Run("rw_read_count", (self._rw.readers,), ()))) > 0

    def _call_acquire(self, session: Session, owner: str, ms: int, count: int,
                      reentry_token: str, waiter: Optional[Waiter] = None, queue_ms: int = 0,
                      queued: bool = False) -> Flow[int]:
        rw = self._rw  # the depth (count) of a read hold is kept here only: see RWKeys
        keys = rw.read_acquire
        args = (owner, ms, ms + settings().fence_retention_ms, reentry_token, session.info)
        acks = None if reentry_token else self._acks()  # a re-entry is no grant
        try:
            if acks is None:
                return int((yield Run("rw_read_acquire", keys, args)))
            reply, acked = yield Run("rw_read_acquire", keys, args, acks)
        except (redis.ResponseError, WrongKindError):
            raise
        except BaseException:
            if not reentry_token:
                yield from self._undo_lost_read(owner, session.info)
            raise
        if int(reply) > 0:
            yield from give_back_unacked(self._name, acks, acked,
                                         functools.partial(self._undo_lost_read, owner, session.info))
        return int(reply)

    def _undo_lost_read(self, owner: str, info: str) -> Flow[None]:
        """A try for a new read hold lost its reply, and may have run (docs/design.rst, principle 13):
        find a member of ``owner`` among the readers and give it back, as a lock does
        (``_LockBase._undo_lost_grant``). A server out of reach: it ends with its lease."""
        rw = self._rw
        try:
            cursor: Any = 0
            prefix = f"{owner}#"
            for _ in range(1000):  # bounded: a readers' set is small
                cursor, members = yield Read("ZSCAN", rw.readers, cursor, "MATCH", f"{prefix}*")
                for member, _deadline in members:
                    text = member.decode() if isinstance(member, bytes) else str(member)
                    if text.startswith(prefix) and text.endswith(f"@{info}"):
                        yield Run("rw_read_release", rw.read_release,
                               (text,))
                if int(cursor) == 0:
                    return
        except redis.RedisError:
            pass

    def _still_held(self, hold: Hold) -> bool:
        """A read hold is a member of the readers' sorted set, scored by its deadline (server
        ms): it is still held while its member is there with a deadline still ahead."""
        batch = hold.session.executor.batch()
        batch.command("ZSCORE", self._rw.readers, reader_member(hold.owner, hold.token, hold.session.info))
        batch.command("TIME")
        deadline, (seconds, micros) = batch.execute()
        return deadline is not None and float(deadline) > int(seconds) * 1000 + int(micros) // 1000

    def _undo_lost_reentry(self, hold: Hold, added: int) -> Flow[None]:
        """A read re-entry adds no level in Redis (the depth is kept here): nothing to undo."""
        return
        yield

    def _settle_lost_release(self, hold: Hold, count: int, depth: int) -> Flow[Optional[int]]:
        """A release of a read hold lost its reply. One that leaves levels changes nothing in
        Redis; the last one removes the member: if it is still there, it did not run, and is
        sent now (``_primitives.lost``)."""
        left = read_release_left(depth, count)
        if left > 0:
            return left
        member = reader_member(hold.owner, hold.token, hold.session.info)
        try:
            if (yield Read("ZSCORE", self._rw.readers, member)) is not None:
                yield from self._call_release(hold, count)
        except redis.RedisError:
            pass
        return None

    def _call_release(self, hold: Hold, count: int) -> Flow[int]:
        rw = self._rw
        left = read_release_left(hold.count, count)
        member = reader_member(hold.owner, hold.token, hold.session.info)
        return int((yield Run("rw_read_release", rw.read_release,
                           optional_tail((member,), left, 0))))


class DistWriteLock(_RWSide):
    """The write side of a DistReadWriteLock: excludes every other reader and writer, anywhere.

    A writer that has to wait queues itself, so that new readers wait behind it; it leaves the
    queue when it gets the lock, when its timeout runs out, or, if it dies, a few seconds after
    its last try (``2 * wait_cap + 1`` seconds). A thread that holds only the read lock gets
    False from a single try (``blocking=False``, ``timeout=0``, ``try_lock()``), and is refused
    at once with RuntimeError by a try that would wait: that upgrade could deadlock. Reentrant
    per thread; ``threading.Condition(rw.write_lock())`` works.
    """

    _metric_kind = "write"

    _kind = "DistWriteLock"

    @property
    def _hold_key(self) -> str:
        return self._rw.writer

    @property
    def _wait_channel(self) -> str:
        return self._rw.writer_channel

    def _locked(self) -> Flow[bool]:
        """Whether a writer, in any process on any host, holds the write lock now."""
        return bool((yield Read("EXISTS", self._rw.writer)))

    def _upgrading(self, session: Session) -> bool:
        return (self._rw.readers, self._owner_for(session)) in session.holds

    def _queue_ms(self) -> int:
        return writer_entry_ms(settings().wait_cap)

    # Never longer than the bound, wherever the waiter stands in this process' queue: its
    # queue entry must be refreshed before it runs out (see writer_entry_ms).
    _strict = True

    def _abandon(self, owner: str) -> Flow[None]:
        """Leave the writers' queue (a wait interrupted or cancelled), waking the readers
        refused behind this writer when it was the last one waiting: ``rw_write_acquire`` in
        mode 'l', which is safe to send again."""
        try:
            yield Run("rw_write_acquire", self._rw.write_leave, (owner, 0, 0, "", "l"))
        except redis.RedisError as exc:
            log.debug("distlock: could not leave the writers' queue of %r: %r", self._name, exc)

    def _call_acquire(self, session: Session, owner: str, ms: int, count: int,
                      reentry_token: str, waiter: Optional[Waiter] = None, queue_ms: int = 0,
                      queued: bool = False) -> Flow[int]:
        rw = self._rw
        mode = write_acquire_mode(reentry_token, queue_ms, queued)
        keys = rw.write_acquire
        args = write_acquire_args(owner, ms, ms + settings().fence_retention_ms, session.info,
                                  mode, queue_ms, count)
        acks = None if reentry_token else self._acks()  # a re-entry is no grant
        try:
            if acks is None:
                return int((yield Run("rw_write_acquire", keys, args)))
            reply, acked = yield Run("rw_write_acquire", keys, args, acks)
        except (redis.ResponseError, WrongKindError):
            raise
        except BaseException:
            if not reentry_token:
                yield from self._undo_lost_write(owner, count)
            raise
        if int(reply) > 0:
            yield from give_back_unacked(self._name, acks, acked,
                                         functools.partial(self._undo_lost_write, owner, count))
        return int(reply)

    def _undo_lost_write(self, owner: str, count: int) -> Flow[None]:
        """A try for a new write hold lost its reply, and may have run: read the writer's hash
        and give the hold back if it was granted (``_LockBase._undo_lost_grant``)."""
        rw = self._rw
        try:
            held, token = yield Read("HMGET", rw.writer, owner, ":t")
            if held is not None and token is not None:
                yield Run("rw_write_release",
                       rw.write_release,
                       optional_tail((owner, int(token)), int(held), 1))
        except redis.RedisError:
            pass

    def _undo_lost_reentry(self, hold: Hold, added: int) -> Flow[None]:
        """A re-entry of the write hold lost its reply: give back the levels it added
        (``_primitives.lost``)."""
        rw = self._rw
        yield from reentry_lost(hold, rw.writer, added, lambda n: Run(
            "rw_write_release", rw.write_release,
            optional_tail((hold.owner, hold.token), n, 1)))

    def _call_release(self, hold: Hold, count: int) -> Flow[int]:
        rw = self._rw
        return int((yield Run("rw_write_release",
                           rw.write_release,
                           optional_tail((hold.owner, hold.token), count, 1))))


class DistReadWriteLock:
    """A read/write lock shared by every thread, process and host that names it on one Redis.

    ``read_lock()`` and ``write_lock()`` return this object's two sides (the same object on
    every call), each with DistRLock's whole surface: ``acquire``, ``release``, ``locked``,
    ``try_lock``, the context manager, ``token``, ``owned``, ``on_lost`` and the ``Condition``
    protocol. Any number of readers hold the read lock at once; a writer excludes everyone.

    - Writer preference: once a writer waits, new readers wait behind it, so a stream of readers
      cannot starve writers. Readers that already hold the read lock still re-enter.
    - Downgrade: the write holder may take the read lock, and keeps it after releasing the
      write lock. Upgrade: a single try (``blocking=False``, ``timeout=0``) returns False; a
      try that would wait raises RuntimeError. Release the read lock first.
    - Every grant, read or write, gets a fencing token from the name's one counter.
    - After every hold is released, nothing but that counter is left in Redis.

    Keyword-only options: ``client`` (a ``redis.Redis`` or a URL; default: see ``configure``),
    ``lease`` (None: the watchdog keeps holds alive while the process lives; a number of
    seconds: each hold expires by itself after that long), and ``min_replicas`` /
    ``replica_timeout`` (each grant, read or write, counts only once that many replicas
    acknowledged it: see docs/guides/replicas.rst) and ``max_hold`` (the cap on each hold:
    docs/guides/bound.rst), for both sides.
    """

    def __init__(self, name: str, *, client: ClientArg = None, lease: Optional[float] = None,
                 min_replicas: Optional[int] = None, replica_timeout: Optional[float] = None,
                 max_hold: Optional[float] = None) -> None:
        self._name = check_name(name)
        check_lease(lease)
        rw = RWKeys.of(settings().prefix, self._name)
        self._read = DistReadLock(self._name, rw, client=client, lease=lease, max_hold=max_hold,
                                  min_replicas=min_replicas, replica_timeout=replica_timeout)
        self._write = DistWriteLock(self._name, rw, client=client, lease=lease, max_hold=max_hold,
                                    min_replicas=min_replicas, replica_timeout=replica_timeout)

    @property
    def name(self) -> str:
        """The shared name: every object of this name on every host is the same lock."""
        return self._name

    def read_lock(self) -> DistReadLock:
        """The shared side (the same object on every call)."""
        return self._read

    def write_lock(self) -> DistWriteLock:
        """The exclusive side (the same object on every call)."""
        return self._write

    @staticmethod
    def lock_factory(path: str, **options: Any) -> ReadWriteMutex:
        """dogpile.cache's file backend's ``lock_factory`` (``arguments={"lock_factory":
        DistReadWriteLock.lock_factory}``): a (blocking) DistReadWriteLock named by the lock
        file's path, which is never created, behind the four methods dogpile asks for
        (``_primitives.rw_mutex``). ``options`` go to the constructor: bind them with
        ``functools.partial``. docs/guides/dogpile.rst."""
        return ReadWriteMutex(DistReadWriteLock(path, **options))

    def __repr__(self) -> str:
        return f"<distlock.DistReadWriteLock object name={self._name!r} at {hex(id(self))}>"
