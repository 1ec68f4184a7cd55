"""A read/write lock behind the four-method interface that dogpile.cache's file backend asks of
its ``lock_factory`` (and that dogpile's own ``ReadWriteMutex`` has): ``acquire_read_lock(wait)``,
``acquire_write_lock(wait)``, ``release_read_lock()``, ``release_write_lock()``, plus the
``read()`` / ``write()`` context managers and the ``acquire(wait)`` / ``release()`` pair (the
write side) that dogpile's ``AbstractFileLock`` derives from them.

It imports nothing from dogpile and nothing of this package's other modules: ``rwlock`` hands
it a ``DistReadWriteLock`` (``DistReadWriteLock.lock_factory``), and ``distlock.contrib.dogpile``
names it for dogpile users. Both sides keep DistReadWriteLock's ownership: per thread,
reentrant, so each thread holds its own read or write lock, as dogpile asks of a lock that
threads share.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

__all__ = ["ReadWriteMutex"]


class ReadWriteMutex:
    """dogpile.cache's read/write ``lock_factory`` interface over one DistReadWriteLock.

    ``acquire_read_lock(wait)`` and ``acquire_write_lock(wait)`` return True once the side is
    held: ``wait`` true blocks until then, ``wait`` false tries once and returns False when
    the side is taken elsewhere. The releases raise LockNotOwnedError (a RuntimeError) when the
    calling thread holds nothing, and LockLostError when its lease was lost meanwhile.
    """

    def __init__(self, rw: Any) -> None:
        #: the DistReadWriteLock behind it
        self.rw = rw

    @property
    def name(self) -> str:
        """The shared name: the lock file's path, for ``DistReadWriteLock.lock_factory``."""
        return str(self.rw.name)

    @property
    def is_open(self) -> bool:
        """True while the calling thread holds either side (dogpile's optional ``is_open``)."""
        return bool(self.rw.read_lock().owned() or self.rw.write_lock().owned())

    def acquire_read_lock(self, wait: bool) -> bool:
        return bool(self.rw.read_lock().acquire(bool(wait)))

    def acquire_write_lock(self, wait: bool) -> bool:
        return bool(self.rw.write_lock().acquire(bool(wait)))

    def release_read_lock(self) -> None:
        self.rw.read_lock().release()

    def release_write_lock(self) -> None:
        self.rw.write_lock().release()

    def acquire(self, wait: bool = True) -> bool:
        """The write side, as dogpile's ``AbstractFileLock.acquire`` (its dogpile lock)."""
        return self.acquire_write_lock(wait)

    def release(self) -> None:
        self.release_write_lock()

    @contextlib.contextmanager
    def read(self) -> Iterator[None]:
        self.acquire_read_lock(True)
        try:
            yield
        finally:
            self.release_read_lock()

    @contextlib.contextmanager
    def write(self) -> Iterator[None]:
        self.acquire_write_lock(True)
        try:
            yield
        finally:
            self.release_write_lock()

    def __repr__(self) -> str:
        return f"<distlock ReadWriteMutex name={self.name!r} at {hex(id(self))}>"
