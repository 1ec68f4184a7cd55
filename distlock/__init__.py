"""distlock: ``threading``'s synchronization primitives across processes and hosts, on Redis."""

from ._config import Settings, configure
from ._errors import DistLockError, LockLostError, LockNotOwnedError
from ._lock import DistLock, DistRLock

__all__ = [
    "DistLock",
    "DistRLock",
    "configure",
    "Settings",
    "DistLockError",
    "LockNotOwnedError",
    "LockLostError",
]

__version__ = "0.1.0"
