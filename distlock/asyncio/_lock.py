"""distlock.asyncio's DistLock and DistRLock: the blocking classes' flows, awaited.

``DistLock`` is ``asyncio.Lock`` across processes and hosts: the hold belongs to the object,
so any task may release it. ``DistRLock`` is a task-reentrant lock (which asyncio lacks): the
holding task re-enters, only it may release, and ``DistCondition`` over it works as
``asyncio.Condition`` does.
"""

from __future__ import annotations

from typing import Any, Optional

from .._core.checks import check_acquire_args
from .._core.flow import Query, Started, adrive
from .._primitives import lock as _lock
from .._primitives.handles import decode_handle
from .._primitives.lock_base import _UNSET, _LockBase
from ._bound import BoundHold
from ._shell import AsyncShell, task_ident

__all__ = ["DistLock", "DistRLock"]


class _AsyncLock(AsyncShell, _LockBase):
    """The asyncio surface both locks share."""

    _repr_prefix = "asyncio."
    _nobody = None

    @staticmethod
    def _owner_label(ident: str) -> Any:
        """A repr shows the owning task (``task-<n>``); a thread's hold is not this shell's."""
        return ident if ident.startswith("task-") else None

    async def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:  # type: ignore[override]
        """Acquire the lock: the blocking class' ``acquire``, awaited (same arguments, checks,
        errors and results). A cancelled acquire leaves no hold and no waiter entry behind, and
        the cancellation propagates."""
        blocking_, timeout_ = check_acquire_args(blocking, timeout)
        port = self._port()
        if self._reentrant == "1":
            await _settled(self._current(port.session))
        return await adrive(self._acquire(blocking_, timeout_, _UNSET, 1), port)

    async def try_lock(self, timeout: Optional[float] = 0.0, lease: Optional[float] = None) -> bool:  # type: ignore[override]
        """``tryLock(wait, lease)``, awaited: see the blocking class."""
        return bool(await self._adrive(self._try_lock(timeout, lease)))

    def locked(self) -> Query[bool]:  # type: ignore[override]
        """Whether anyone, anywhere, holds the lock: ``await lock.locked()``."""
        return self._query(self._locked)

    def release(self) -> Started[None]:  # type: ignore[override]
        """Release the lock, at once: a caller that does not hold it gets RuntimeError here;
        otherwise the release is on its way when this returns, and completes even if the
        caller is cancelled. Await the result to learn its outcome (LockLostError when the
        lease was lost meanwhile)."""
        # A lock's own release may finish in the task that awaits it: cut short there, the
        # watchdog thread completes it (see ``_primitives.lock_wait._finish_release``); a side's may not.
        held = self._current(self._session()) if self._reentrant == "1" else None
        started = self._start(self._release_one(), self._hold_key == self._keys.lock)
        if held is not None and not started.done():
            held.pending = started  # the task's next acquire waits for it (see ``_settled``)
        return started

    def bound(self, blocking: bool = True, timeout: float = -1) -> BoundHold:
        """``async with lock.bound():`` takes the lock (``acquire``'s arguments; TimeoutError
        when it is not taken), runs the block, and releases. When the hold is lost while the
        block runs (its lease ran out unrenewed, its local deadline or ``max_hold`` passed,
        someone took it over), the block is cancelled at its next await and the ``async
        with`` raises ``LockLostError``, with the hold's ``name``, ``token`` and ``cause``;
        the task is left with no cancellation pending. See docs/guides/bound.rst."""
        return BoundHold(self, blocking, timeout)

    async def __aenter__(self) -> None:
        await self.acquire()

    async def __aexit__(self, *exc_info: object) -> None:
        await self.release()


async def _settled(hold: Any) -> None:
    """Wait for a release of ``hold`` the task started and did not await: its re-entry must
    not count on a hold that is on its way out. What that release raised is the release's
    business (it was reported to whoever awaits it, or logged)."""
    if hold is not None and hold.pending is not None and not hold.pending.done():
        try:
            await hold.pending
        except Exception:  # noqa: BLE001 - see above
            pass


class DistLock(_AsyncLock, _lock.DistLock):  # type: ignore[misc]
    """``asyncio.Lock`` shared by every process and host that names it on one Redis; the same
    lock as ``distlock.DistLock`` of that name. Any task may release it. Arguments: as the
    blocking class, with ``client`` a ``redis.asyncio.Redis`` or a URL."""

    async def export(self, lease: Optional[float] = None) -> str:  # type: ignore[override]
        """Detach this object's hold as a handle: the blocking class' ``export``, awaited."""
        return str(await self._adrive(self._export(lease)))

    @classmethod
    async def adopt(cls, handle: str, *, client: Any = None,
                    lease: Optional[float] = None) -> DistLock:
        """A lock object that holds the handle's hold: the blocking class' ``adopt``, awaited."""
        name, owner, token = decode_handle(handle)
        lock = cls(name, client=client, lease=lease)
        await lock._adrive(lock._adopt(owner, token))
        return lock

    @classmethod
    async def release_handle(cls, handle: str, *, client: Any = None) -> None:  # type: ignore[override]
        """Release the hold a handle names, token-checked: see the blocking class."""
        name, owner, token = decode_handle(handle)
        lock = cls(name, client=client)
        await lock._adrive(lock._release_handle(owner, token))

    def holder(self) -> Query[Optional[str]]:  # type: ignore[override]
        """The current holder's value, or None: ``await lock.holder()``."""
        return self._query(self._read_holder)


class DistRLock(_AsyncLock, _lock.DistRLock):  # type: ignore[misc]
    """A task-reentrant lock shared by every process and host that names it on one Redis: the
    holding task re-enters (through any DistRLock of the name), and only it may release. The
    same lock as ``distlock.DistRLock`` of that name (a thread and a task are different
    owners).

    Bound a wait with ``acquire(timeout=...)`` or ``asyncio.timeout()``, not with
    ``asyncio.wait_for(lock.acquire(), ...)``: before Python 3.12, ``wait_for`` runs the acquire
    in a task of its own, which then owns the hold, and the caller cannot release it."""

    @staticmethod
    def _me() -> Any:
        return task_ident()

    def _release_save(self) -> Any:
        raise TypeError("distlock.asyncio.DistRLock is awaited: use distlock.asyncio.DistCondition")
