"""What every asyncio primitive adds to the flows it shares with its blocking twin.

An asyncio class subclasses the blocking one, which owns the flows (``_core.flow``), the keys, the
checks and the bookkeeping, and only replaces the public methods:

- waits are coroutines that ``adrive`` a flow on the loop's ``AsyncPort``;
- state changes (``release``, ``set``, ``notify``...) run their flow at once up to its first
  round trip (a misuse raises there), then go on in a task: ``Started``;
- queries (``locked``, ``is_set``...) return a ``Query``, which is not a truth value.

Holds belong to the server's blocking session (``AsyncPort.session``), whose watchdog thread
renews them; ``on_lost`` and ``on_long_hold`` callbacks run in the primitive's loop.
"""

from __future__ import annotations

import asyncio
import inspect
import itertools
import logging
import weakref
from typing import Any, Callable, Optional

from .._core.flow import Flow, Query, Started, adrive, start
from .._core.replicas import refuse_quorum
from .._primitives.fair import refuse_fair_quorum
from .._redis import QUORUM, topology
from .._redis.aport import AsyncPort
from .._redis.clients import check_async_client
from .._session.config import resolve_async_client
from .._session.ports import port_for
from .._session.session import Session

__all__ = ["AsyncShell", "task_ident"]

log = logging.getLogger("distlock")


class AsyncShell:
    """Mixed in before the blocking class (``class DistLock(AsyncShell, _lock.DistLock)``)."""

    _aport: Optional[AsyncPort] = None
    _loop_ref: Any = None
    _client_arg: Any = None
    _client: Any = None
    _lost_callbacks: Any

    def __init__(self, *args: Any, client: Any = None, **kwargs: Any) -> None:
        if client is not None:
            refuse_quorum(topology(client) == QUORUM, kwargs.get("min_replicas"))
            refuse_fair_quorum(client, kwargs.get("fair"))
            check_async_client(client, type(self).__name__)
        super().__init__(*args, client=None, **kwargs)  # type: ignore[call-arg]
        self._client_arg = client
        know = getattr(self, "_know_topology", None)  # a lock: a quorum changes its rules
        if know is not None:
            know(client)

    # --- where a flow runs ------------------------------------------------------------------------

    def _port(self) -> AsyncPort:
        """The port of this primitive's client in the running loop (RuntimeError outside one)."""
        loop = asyncio.get_running_loop()
        port = self._aport
        if port is None or port.loop_ref() is not loop or not port.live:
            client = self._client
            if client is None or self._loop_ref is None or self._loop_ref() is not loop:
                client = self._client = resolve_async_client(self._client_arg)
            port = self._aport = port_for(client)
            self._loop_ref = port.loop_ref
        return port

    def _session(self) -> Session:
        session: Session = self._port().session
        return session

    def _peek_session(self) -> Optional[Session]:
        port = self._aport
        return port.session if port is not None and port.live else None

    async def _adrive(self, flow: Flow[Any]) -> Any:
        return await adrive(flow, self._port())

    def _start(self, flow: Flow[Any], inline: bool = False) -> Started[Any]:
        return start(flow, self._port, inline)

    def _query(self, make: Callable[[], Flow[Any]]) -> Query[Any]:
        return Query(lambda: self._adrive(make()))

    def _drive(self, flow: Flow[Any]) -> Any:
        flow.close()
        raise TypeError(f"distlock.asyncio.{type(self).__name__} is awaited: this blocking call "
                        f"has no asyncio form; use distlock.{type(self).__name__} in threads")

    def __enter__(self) -> Any:
        raise TypeError(f"use 'async with' with distlock.asyncio.{type(self).__name__}")

    def __exit__(self, *exc_info: object) -> None:
        pass

    # --- on_lost, in the loop -----------------------------------------------------------------

    def _fire_lost(self) -> None:
        """Run the ``on_lost`` callbacks in this primitive's loop: a plain function through
        ``call_soon_threadsafe``, a coroutine function as a task. Called from the watchdog
        thread, or from the loop itself (a release that found the hold gone)."""
        for callback in list(self._lost_callbacks):
            self._in_loop(callback)

    def _ring_long(self, callback: Callable[[Any], Any]) -> None:
        """An ``on_long_hold`` alarm, from the watchdog thread: run it in the loop too."""
        self._in_loop(callback)

    def _in_loop(self, callback: Callable[[Any], Any]) -> None:
        loop = self._loop_ref() if self._loop_ref is not None else None
        if loop is None or loop.is_closed():
            log.warning("distlock: callback %r not run: its event loop is gone", callback)
            return
        try:
            loop.call_soon_threadsafe(_run_callback, callback, self)
        except RuntimeError:  # closed meanwhile
            log.warning("distlock: callback %r not run: its event loop is gone", callback)


def _run_callback(callback: Callable[[Any], Any], subject: Any) -> None:
    """In the loop: call ``callback(subject)``; a coroutine function's coroutine becomes a task.
    What either raises is logged, never propagated."""
    try:
        if inspect.iscoroutinefunction(callback):
            task = asyncio.ensure_future(callback(subject))
            _tasks.add(task)
            task.add_done_callback(_callback_done)
        else:
            callback(subject)
    except Exception:  # noqa: BLE001 - a callback must not break the loop
        log.exception("distlock: callback %r failed", callback)


#: callback tasks still running (the loop keeps only weak references to its tasks)
_tasks: set[asyncio.Future[Any]] = set()


def _callback_done(task: asyncio.Future[Any]) -> None:
    _tasks.discard(task)
    if not task.cancelled() and task.exception() is not None:
        log.error("distlock: callback failed", exc_info=task.exception())


#: the ident of every task that asked for one, for as long as the task exists
_task_ids: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()
_serial = itertools.count(1)


#: the last task asked about, and its ident: a DistRLock asks several times per acquire and
#: release, and the weak map's lookup makes a weak reference each time
_last: tuple[Callable[[], Any], str] = (lambda: None, "")


def task_ident() -> str:
    """Who owns a task-owned hold: the current task (``task-<n>``, unique in this process for
    as long as it runs; never an ``id()``, which a later task could reuse)."""
    global _last
    task = asyncio.current_task()
    if task is None:
        raise RuntimeError("distlock.asyncio: no current task (call this from a coroutine)")
    ref, ident = _last  # one read: another thread's loop may replace it meanwhile
    if ref() is task:
        return ident
    found = _task_ids.get(task)
    if found is None:
        found = _task_ids[task] = f"task-{next(_serial)}"
    _last = (weakref.ref(task), found)
    return found
