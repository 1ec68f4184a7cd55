"""distlock: ``threading``'s synchronization primitives across processes and hosts, on Redis."""

from ._barrier import DistBarrier
from ._condition import DistCondition
from ._config import Settings, configure
from ._errors import DistLockError, LockLostError, LockNotOwnedError, NotEnoughReplicasError, QuorumError
from ._event import DistEvent
from ._lock import DistLock, DistRLock
from ._metrics import snapshot as metrics
from ._rwlock import DistReadWriteLock
from ._semaphore import DistBoundedSemaphore, DistSemaphore

__all__ = [
    "DistLock",
    "DistRLock",
    "DistReadWriteLock",
    "DistCondition",
    "DistSemaphore",
    "DistBoundedSemaphore",
    "DistEvent",
    "DistBarrier",
    "configure",
    "Settings",
    "metrics",
    "DistLockError",
    "LockNotOwnedError",
    "LockLostError",
    "NotEnoughReplicasError",
    "QuorumError",
]

__version__ = "0.1.0"
