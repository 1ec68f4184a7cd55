"""The read/write lock's rules that need no I/O: key names, the waiting-writer lease, wording.

Shared by the sync shell (``_rwlock.py``) and any future asyncio twin; nothing here talks to
Redis or reads a clock.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Tuple

from ._logic import Keys, lease_ms

__all__ = [
    "RWKeys", "reader_member", "read_release_left", "writer_entry_ms", "write_acquire_mode",
    "write_acquire_args", "optional_tail", "UPGRADE_REFUSED",
]


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
    """

    writer: str
    readers: str
    queue: str
    fence: str
    writer_channel: str
    reader_channel: str

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
        )

    def all_keys(self) -> Tuple[str, ...]:
        """Every data key (not the channels), the fence included."""
        return (self.writer, self.readers, self.queue, self.fence)


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


#: acquire() of the write lock by a thread that holds only the read lock.
UPGRADE_REFUSED = (
    "cannot acquire the write lock while holding only the read lock: two upgrading readers "
    "would wait for each other forever; release the read lock first"
)
