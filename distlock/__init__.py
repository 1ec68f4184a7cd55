"""distlock: ``threading``'s synchronization primitives across processes and hosts, on Redis."""

from ._core.errors import (
    DistLockError,
    LockLostError,
    LockNotOwnedError,
    NotEnoughReplicasError,
    QuorumError,
    WrongKindError,
)
from ._core.settings import Settings
from ._primitives.barrier import DistBarrier
from ._primitives.condition import DistCondition
from ._primitives.election import DistElection, Leader, Leadership
from ._primitives.event import DistEvent
from ._primitives.lock import DistLock, DistRLock
from ._primitives.rwlock import DistReadWriteLock
from ._primitives.semaphore import DistBoundedSemaphore, DistSemaphore
from ._session.config import configure
from ._session.live import metrics
from ._session.metrics import reset as reset_metrics

__all__ = [
    "DistLock",
    "DistRLock",
    "DistReadWriteLock",
    "DistCondition",
    "DistSemaphore",
    "DistBoundedSemaphore",
    "DistEvent",
    "DistBarrier",
    "DistElection",
    "Leadership",
    "Leader",
    "configure",
    "Settings",
    "metrics",
    "reset_metrics",
    "DistLockError",
    "LockNotOwnedError",
    "LockLostError",
    "NotEnoughReplicasError",
    "QuorumError",
    "WrongKindError",
]

__version__ = "0.1.0"
