"""A fenced store: a resource that takes a write only with a token at least as large as the
largest it has taken, as a lock's fencing token is meant to be checked (docs/safety.rst).

``FencedStore(directory)`` keeps, per name, the largest token it took in a file under
``directory``, guarded by ``flock``, so that every process of a host shares it, and it outlives a
restart of Redis (it is the world outside Redis). ``write(name, token)`` returns whether it took
the write, and when it decided (``time.monotonic()``, under the store's lock): record that time,
not a later one, since a writer can be paused between the store's answer and its record.
POSIX only (``fcntl``).
"""

from __future__ import annotations

import hashlib
import os
import time
from typing import Optional, Tuple

__all__ = ["FencedStore"]


class FencedStore:
    """Per name, the largest token taken so far; a write with a smaller one is refused."""

    def __init__(self, directory: str) -> None:
        if not isinstance(directory, (str, os.PathLike)):
            raise TypeError(f"directory must be a path, not {type(directory).__name__}")
        self.directory = os.fspath(directory)
        os.makedirs(self.directory, exist_ok=True)

    def __repr__(self) -> str:
        return f"<FencedStore {self.directory!r}>"

    def _path(self, name: str) -> str:
        digest = hashlib.sha1(name.encode("utf-8")).hexdigest()[:16]
        return os.path.join(self.directory, f"fenced-{digest}")

    def write(self, name: str, token: int) -> Tuple[bool, float]:
        """Take a write of ``name`` with ``token`` if no larger token was taken before; return
        whether it was taken, and when that was decided."""
        import fcntl

        if not isinstance(name, str):
            raise TypeError(f"name must be a str, not {type(name).__name__}")
        if isinstance(token, bool) or not isinstance(token, int):
            raise TypeError(f"token must be an int, not {type(token).__name__}")
        fd = os.open(self._path(name), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            raw = os.read(fd, 64).strip()
            highest = int(raw) if raw else None
            decided = time.monotonic()
            if highest is not None and token < highest:
                return False, decided
            os.lseek(fd, 0, os.SEEK_SET)
            os.ftruncate(fd, 0)
            os.write(fd, str(token).encode())
            return True, decided
        finally:
            os.close(fd)  # closing the descriptor releases the flock

    def highest(self, name: str) -> Optional[int]:
        """The largest token taken for ``name``, or None."""
        try:
            with open(self._path(name), encoding="ascii") as fh:
                raw = fh.read().strip()
        except FileNotFoundError:
            return None
        return int(raw) if raw else None
