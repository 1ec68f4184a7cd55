"""distlock for asyncio: the eight primitives, with ``asyncio``'s semantics, across processes
and hosts.

A primitive here and the blocking one of the same name are the same primitive: they exclude
and wake each other. Waits are coroutines (``await lock.acquire()``), state changes act at
once and return an awaitable (``lock.release()``), queries return an awaitable
(``await lock.locked()``). See docs/guides/asyncio.rst.
"""

from .._core.errors import NotEnoughReplicasError, WrongKindError
from ._barrier import BrokenBarrierError, DistBarrier
from ._condition import DistCondition
from ._election import DistElection, Leader, Leadership
from ._event import DistEvent
from ._lock import DistLock, DistRLock
from ._rwlock import DistReadWriteLock
from ._semaphore import DistBoundedSemaphore, DistSemaphore

__all__ = ["DistLock", "DistRLock", "DistReadWriteLock", "DistCondition", "DistSemaphore",
           "DistBoundedSemaphore", "DistEvent", "DistBarrier", "BrokenBarrierError",
           "DistElection", "Leadership", "Leader",
           "NotEnoughReplicasError", "WrongKindError"]
