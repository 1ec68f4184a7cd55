"""The watchdog's own connection (``OwnConnection``, mixed into ``watchdog.Watchdog``): opened
on the ``renewals`` worker when a session gets its first hold, off the caller's path; witnessed
once open (a hold granted before it may have come from a server that restarted empty meanwhile);
and closed by whoever ends its use last. A renewals job that is opening or using it closes it
itself as it ends, never another thread under it: closed under it, a connection redis-py is
opening goes on with a new socket, then waits its whole timeout for a handshake reply sent on
the old one, and the renewals thread with it.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable, Dict, Tuple

from .hold import Hold
from .renewal import check_round, refused
from .worker import Worker

__all__ = ["OwnConnection"]

log = logging.getLogger("distlock")


class OwnConnection:
    """The watchdog's fields this part reads and writes, all under ``mutex``."""

    mutex: threading.Lock
    closed: bool
    holds: Dict[Tuple[str, str], Hold]
    renewals: Worker
    _executor: Callable[[], Any]
    _kick: Any
    #: the watchdog's own connection was asked to open (``add``); dropped with it
    _renewal_open: bool
    #: a job on ``renewals`` is using that connection: it is closed by that job when it ends
    #: (``_drop_if_stale``), never under it (see ``_drop_renewer``)
    _renewal_io: bool
    #: what that job talks through (``_begin_io``)
    _io_executor: Any

    def suspend(self, why: str) -> None:
        raise NotImplementedError

    def _open_renewal(self) -> None:
        with self.mutex:
            if self.closed or not self._renewal_open:
                return  # dropped before this job ran (the thread went idle, or the session closed)
            self._begin_io()
        try:
            made = self._executor().open_renewal()
            if made:
                self._witness(time.monotonic())  # once it is open: see _witness
                self._kick.set()  # the thread's wait takes the new socket in
        except Exception as exc:  # noqa: BLE001 - the first renewal connects it anyway
            log.debug("distlock: could not open the watchdog's connection: %r", exc)
            if refused(exc):  # the server that granted the holds may be gone (a restart)
                self.suspend(f"the watchdog could not connect to the server ({exc!r})")
        finally:
            self._drop_if_stale()

    def _witness(self, opening: float) -> None:
        """The watchdog's own connection is open, as of ``opening`` (time.monotonic(), read
        once it was made): a FIN on it tells of its server's restart from now on. A hold sent
        before ``opening`` may have been granted by a server that restarted, empty, before the
        connection was made (or while it was being made), which nothing would tell: one read
        on this connection (``renewal.check_round``, which writes nothing) confirms it or reports it lost."""
        # grants only (a lock's hold, a permit: what tells its primitives of a loss). A waiter's
        # lease (a barrier's, a condition's) may be gone by right: the barrier tripped, the
        # last waiter was notified; its renewal says it has no loss to report, and so does this
        holds = [h for h in list(self.holds.values())
                 if not h.lost and h.notify is not None and h.sent_at <= opening]
        if holds:
            check_round(self, holds)

    def _begin_io(self) -> None:
        """(Under the mutex.) A renewals job starts its I/O on the watchdog's connection; its
        executor is kept for the job's end, which must close that connection even once the
        session is retired and collected (``source()`` then raises)."""
        self._renewal_io = True
        try:
            self._io_executor = self._executor()
        except RuntimeError:
            self._io_executor = None

    def _drop_if_stale(self) -> None:
        """The end of a renewals job's I/O on the watchdog's connection: close it if it was
        dropped meanwhile (the thread exited idle, or the session was retired while the
        connection was being opened or used), so that no connection outlives its watchdog."""
        with self.mutex:
            self._renewal_io = False
            executor, self._io_executor = self._io_executor, None
            if self.closed or not self._renewal_open:
                self._drop_renewer(executor=executor)

    def _drop_renewer(self, under_io: bool = False, executor: Any = None) -> None:
        """Close the watchdog's connection, unless a renewals job is using it (``under_io``:
        all the same; see the module's docstring). ``executor``: the one that job kept."""
        self._renewal_open = False
        if self._renewal_io and not under_io:
            return
        try:
            (executor or self._executor()).drop_renewal()
        except Exception:  # noqa: BLE001 - the session is gone: so is its connection
            pass
