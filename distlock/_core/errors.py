"""Exception hierarchy.

Every error subclasses :class:`DistLockError` and, where a built-in category fits,
that category too, so ``except RuntimeError`` written for :mod:`threading` keeps working.
All of them pickle, so they cross process boundaries (multiprocessing, concurrent.futures).
"""

from __future__ import annotations

from typing import Any, Optional, Tuple

from .keys import unescape_name

__all__ = ["DistLockError", "LockNotOwnedError", "LockLostError", "NotEnoughReplicasError", "QuorumError",
           "WrongKindError", "wrong_kind", "WRONG_KIND"]


class DistLockError(Exception):
    """Base class of every error raised by distlock itself."""


class LockNotOwnedError(DistLockError, RuntimeError):
    """Release (or another owner-only call) of a primitive the caller does not hold.

    Subclasses :class:`RuntimeError`, which is what :mod:`threading` raises in the same case.
    ``name`` is the primitive's shared name and ``token`` the fencing token of the hold
    concerned (None when there was none, or when it is not known); both survive pickling, so
    the error crosses process boundaries whole.
    """

    def __init__(self, message: str = "", *, name: Optional[str] = None,
                 token: Optional[int] = None) -> None:
        super().__init__(message)
        self.name = name
        self.token = token

    def __reduce__(self) -> Tuple[Any, ...]:
        return (_rebuild, (type(self), str(self), self.name, self.token))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({str(self)!r}, name={self.name!r}, token={self.token!r})"


class LockLostError(LockNotOwnedError):
    """The caller held the primitive, but its lease ran out or someone took it over.

    Raised by ``release()`` after the hold was found gone or owned by someone else, by the
    watchdog's renewal, by the release script, or by a force-release, and at the end of a
    bound block (``bound()``) whose hold was lost. ``cause`` says why, where it is known
    ("held longer than max_hold (5 s)", "its lease ran out unrenewed", ...), else None; it
    survives pickling with ``name`` and ``token``.
    """

    def __init__(self, message: str = "", *, name: Optional[str] = None,
                 token: Optional[int] = None, cause: Optional[str] = None) -> None:
        super().__init__(message, name=name, token=token)
        self.cause = cause

    def __reduce__(self) -> Tuple[Any, ...]:
        return (_rebuild_lost, (type(self), str(self), self.name, self.token, self.cause))


def _rebuild_lost(cls: Any, message: str, name: Optional[str], token: Optional[int],
                  cause: Optional[str]) -> Any:
    """Unpickle a LockLostError (or subclass) with its keyword-only data."""
    return cls(message, name=name, token=token, cause=cause)


def _rebuild(cls: Any, message: str, name: Optional[str], token: Optional[int]) -> Any:
    """Unpickle a LockNotOwnedError (or subclass) with its keyword-only data."""
    return cls(message, name=name, token=token)


class NotEnoughReplicasError(DistLockError):
    """A grant that fewer replicas acknowledged (``WAIT``) than the primitive's
    ``min_replicas``, within its ``replica_timeout``: it was given back, and the caller holds
    nothing. ``acknowledged`` is how many replicas answered, ``required`` how many were asked
    for; both survive pickling. See docs/guides/replicas.rst.
    """

    def __init__(self, message: str = "", *, acknowledged: int = 0, required: int = 0) -> None:
        super().__init__(message)
        self.acknowledged = acknowledged
        self.required = required

    def __reduce__(self) -> Tuple[Any, ...]:
        return (_rebuild_replicas, (type(self), str(self), self.acknowledged, self.required))

    def __repr__(self) -> str:
        return (f"{type(self).__name__}({str(self)!r}, acknowledged={self.acknowledged!r}, "
                f"required={self.required!r})")


def _rebuild_replicas(cls: Any, message: str, acknowledged: int, required: int) -> Any:
    """Unpickle a NotEnoughReplicasError with its keyword-only data."""
    return cls(message, acknowledged=acknowledged, required=required)


class QuorumError(DistLockError):
    """Too few masters of a Redlock quorum (``client=[...]``) answered for a grant to count.

    ``answered`` is how many masters answered (and could vote) in the last try, ``required``
    how many a grant needs (N//2+1). Raised by ``acquire()`` once its timeout is over (at once
    for a non-blocking one), never turned into False; the tries it made were undone.
    """

    def __init__(self, message: str = "", *, answered: int = 0, required: int = 0) -> None:
        super().__init__(message)
        self.answered = answered
        self.required = required

    def __reduce__(self) -> Tuple[Any, ...]:
        return (_rebuild_quorum, (type(self), str(self), self.answered, self.required))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({str(self)!r}, answered={self.answered!r}, required={self.required!r})"


def _rebuild_quorum(cls: Any, message: str, answered: int, required: int) -> Any:
    """Unpickle a QuorumError with its keyword-only data."""
    return cls(message, answered=answered, required=required)


class WrongKindError(DistLockError, TypeError):
    """A name is one lock: it is in use as another kind of primitive, whose meaning cannot be
    shared with this one (a semaphore's, an event's, a barrier's, a lock's). Nothing was
    written. ``name`` is the name, ``kind`` what it is in use as, ``this`` what the refused
    call is; all survive pickling. A subclass of :class:`TypeError`: the same name given to
    two kinds is a type mistake in the calling code, not a state to wait out. See
    docs/guides/kinds.rst.
    """

    def __init__(self, message: str = "", *, name: str = "", kind: str = "", this: str = "") -> None:
        super().__init__(message)
        self.name = name
        self.kind = kind
        self.this = this

    def __reduce__(self) -> Tuple[Any, ...]:
        return (_rebuild_kind, (type(self), str(self), self.name, self.kind, self.this))

    def __repr__(self) -> str:
        return (f"{type(self).__name__}({str(self)!r}, name={self.name!r}, kind={self.kind!r}, "
                f"this={self.this!r})")


def _rebuild_kind(cls: Any, message: str, name: str, kind: str, this: str) -> Any:
    """Unpickle a WrongKindError with its keyword-only data."""
    return cls(message, name=name, kind=kind, this=this)


#: How a script refuses a name of another kind: an error reply ``<WRONG_KIND> <found> <this>``
#: (``wrong_kind`` in lua/_prelude.lua), one letter each.
WRONG_KIND = "DISTLOCK_WRONGKIND"

#: the kinds' letters, as the scripts name them, and what a person reads
KIND_NAMES = {"L": "DistLock (or DistRLock, DistCondition)", "W": "DistReadWriteLock",
              "S": "DistSemaphore", "E": "DistEvent", "B": "DistBarrier"}


def wrong_kind(exc: BaseException, key: str) -> Optional[WrongKindError]:
    """The WrongKindError that ``exc``, a script's error reply, stands for (``key``: one of the
    script's keys, which names the name), or None when it is another error."""
    words = str(exc).split()
    if len(words) != 3 or words[0] != WRONG_KIND:
        return None
    start, end = key.find("{"), key.find("}")
    name = unescape_name(key[start + 1:end]) if 0 <= start < end else key
    kind, this = KIND_NAMES.get(words[1], words[1]), KIND_NAMES.get(words[2], words[2])
    return WrongKindError(f"{name!r} is a {kind} here; this is a {this}", name=name,
                          kind=kind, this=this)
