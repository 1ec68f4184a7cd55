"""The primitives of the blocking shell, one module per family: ``lock`` (DistLock, DistRLock)
on ``lock_base`` (what the lock family shares) and ``lock_wait`` (how a lock waits), ``fair``
(fair locks), ``rwlock`` (with ``rw_mutex``, its face for dogpile.cache's file backend),
``condition``, ``semaphore``, ``event``, ``barrier``; and ``engine``, the one wait loop under
all of them. Each module holds its primitive's own checks and repr;
what several share lives in ``distlock._core``. The asyncio shell (``distlock.asyncio``)
subclasses these classes, module for module. See docs/design.rst, principle 12.
"""
