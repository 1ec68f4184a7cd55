"""Exception hierarchy.

Every error subclasses :class:`DistLockError` and, where a built-in category fits,
that category too, so ``except RuntimeError`` written for :mod:`threading` keeps working.
All of them pickle, so they cross process boundaries (multiprocessing, concurrent.futures).
"""

from __future__ import annotations

__all__ = ["DistLockError", "LockNotOwnedError", "LockLostError"]


class DistLockError(Exception):
    """Base class of every error raised by distlock itself."""


class LockNotOwnedError(DistLockError, RuntimeError):
    """Release (or another owner-only call) of a primitive the caller does not hold.

    Subclasses :class:`RuntimeError`, which is what :mod:`threading` raises in the same case.
    """


class LockLostError(LockNotOwnedError):
    """The caller held the primitive, but its lease ran out or someone took it over.

    Raised by ``release()`` after the hold was found gone or owned by someone else, by the
    watchdog's renewal, by the release script, or by a force-release.
    """
