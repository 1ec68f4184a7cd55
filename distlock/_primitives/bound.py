"""``with lock.bound():`` in the blocking shell: the holding thread gets ``LockLostError`` when
its hold is lost (docs/guides/bound.rst).

The loss is reported in the watchdog thread (the hold's local deadline or cap passed, a renewal
found it gone) or in whichever thread found it. That thread raises the error in the holding
thread with ``PyThreadState_SetAsyncExc``, which takes an exception *class* and raises it there
between two bytecodes. So the class is ``_Interrupt``, a LockLostError whose instance, made in
the holding thread, reads the name, token and cause from the scope that fired (``_pending``).

Exactly one interrupt is in flight per thread (``_pending``, taken out when it is delivered or
cleared), and a scope fires at most once: it must take its own entry out of ``_armed`` first,
which its exit also does, and it does not interrupt a thread that is in the scope's own enter
or exit (``_OWN``; the exit then raises). A window is left: the holding thread may move into
the exit between that look and the raise (a switch of the GIL in the firing thread); the
interrupt then surfaces raw from the ``with`` statement, before the exit gave back the hold,
which the holder's next ``release()`` reports lost. No Python lock
is held by the holding thread at any point where the interrupt could be raised (it would stay
held). An exit that finds its scope already fired waits for the ``SetAsyncExc`` to be made,
then clears it if it was not delivered yet; one delivered inside the exit is caught there. The
interrupt is therefore raised only inside the block or inside its exit, which turns it into a
plain ``LockLostError`` raised by the ``with`` statement, after giving back what is left.

What it cannot do: a blocking C call (``time.sleep``, a socket read) is not interrupted; the
error comes at the next bytecode after it returns. And on Python 3.13 an exception raised this
way at a loop's back-edge was seen to skip ``except``, ``finally`` and ``__exit__``
(cpython#139622): ``bound()`` refuses with RuntimeError there (``UNSAFE``).
"""

from __future__ import annotations

import ctypes
import sys
import threading
import time
from types import TracebackType
from typing import Any, Dict, Optional, Tuple, Type

from .._core.checks import check_acquire_args
from .._core.errors import LockLostError

__all__ = ["Bindable", "ThreadBound", "UNSAFE"]

#: Pythons where an asynchronous exception may skip ``finally`` and ``__exit__``
UNSAFE = sys.version_info >= (3, 13)

_raise_in = ctypes.pythonapi.PyThreadState_SetAsyncExc
_raise_in.argtypes = (ctypes.c_ulong, ctypes.py_object)
_raise_in.restype = ctypes.c_int
#: the same function, to clear what is pending (its exception argument NULL)
_clear_in = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.c_ulong, ctypes.c_void_p)(
    ("PyThreadState_SetAsyncExc", ctypes.pythonapi))

#: scopes that may still fire, by (thread ident, id(scope)); taken out by whichever comes first,
#: the loss or the exit (dict.pop: one C call under the GIL)
_armed: Dict[Tuple[int, int], ThreadBound] = {}
#: per thread, the scope whose interrupt is in flight (set before it is raised)
_pending: Dict[int, ThreadBound] = {}


class _Interrupt(LockLostError):
    """Raised in the holding thread; reads its hold's name, token and cause when made there."""

    def __init__(self, message: str = "", *, name: Optional[str] = None,
                 token: Optional[int] = None, cause: Optional[str] = None) -> None:
        scope = None if message else _pending.pop(threading.get_ident(), None)  # delivered
        if scope is not None:
            name, token, cause = scope.name, scope.token, scope.cause
            message = f"the hold of {name!r} was lost in its bound block: {cause}"
        super().__init__(message, name=name, token=token, cause=cause)
        self.scope = scope


class ThreadBound:
    """What the blocking ``bound()`` returns: a context manager (use it once)."""

    def __init__(self, lock: Any, blocking: bool, timeout: float) -> None:
        check_acquire_args(blocking, timeout)  # bad arguments raise here, as acquire's would
        self._args = (blocking, timeout)
        self._lock = lock
        self.name: str = lock.name
        self.token: Optional[int] = None
        self.cause: Optional[str] = None
        self._hold: Any = None
        self._tid = 0
        self._sent = False  # the interrupt was raised (set after SetAsyncExc returned)
        self._used = False

    def __enter__(self) -> ThreadBound:
        if UNSAFE:
            raise RuntimeError(
                f"with lock.bound(): not on Python {sys.version_info[0]}.{sys.version_info[1]}, "
                "where an exception raised in a thread from outside may skip finally and __exit__ "
                "(cpython#139622); use distlock.asyncio's bound(), or check lock.valid_for() in the work")
        if self._used:
            raise RuntimeError("a bound() scope is used once: call lock.bound() again")
        self._used = True
        if not self._lock.acquire(*self._args):
            raise TimeoutError(f"bound(): {self.name!r} could not be acquired"
                               + ("" if self._args[0] else " (blocking=False)"))
        session = self._lock._session()
        hold = self._hold = self._lock._current(session)
        self.token, self._tid = hold.token, threading.get_ident()
        hold.listeners.add(self)
        if session.ran_out(hold):  # lost between the grant and here (a suspension is not a loss)
            self._end(False, None)  # gives back what is left, and raises LockLostError
        _armed[(self._tid, id(self))] = self  # last: from here on the loss interrupts the block
        return self

    def _fire_lost(self) -> None:
        """The hold was reported lost (any thread): interrupt the holding thread, once."""
        self.cause = self._hold.cause or "its local deadline passed"
        tid = self._tid
        if threading.get_ident() == tid:
            return  # the holder itself found it (a call in the block): its exit raises
        if _pending.setdefault(tid, self) is not self:
            return  # another scope's interrupt of that thread is in flight: the exit raises
        if _armed.pop((tid, id(self)), None) is not self:
            _pending.pop(tid, None)  # the exit came first: nothing to interrupt
            return
        try:
            frame = sys._current_frames().get(tid)
            if frame is not None and frame.f_code in _OWN:
                _pending.pop(tid, None)  # the thread is in the scope's own enter or exit, where
                return                   # it must not be interrupted: the exit raises instead
            _raise_in(tid, _Interrupt)
        finally:
            self._sent = True  # whatever happened, the exit must not wait for it

    def _disarm(self) -> None:
        """Take the scope out of ``_armed``; if the loss came first, wait for its interrupt to
        be raised and clear it (an interrupt delivered meanwhile is the caller's to catch)."""
        if _armed.pop((self._tid, id(self)), None) is self:
            return  # it can no longer fire
        while not self._sent:  # the firing thread is between its claim and its SetAsyncExc
            time.sleep(0.0005)
        _clear_in(self._tid, None)
        if _pending.get(self._tid) is self:
            _pending.pop(self._tid, None)

    def __exit__(self, exc_type: Optional[Type[BaseException]], exc: Optional[BaseException],
                 tb: Optional[TracebackType]) -> None:
        interrupted = isinstance(exc, _Interrupt) and exc.scope is self
        while True:
            try:
                self._disarm()
                break
            except _Interrupt as late:  # raised in this exit, before it was cleared
                interrupted, exc = True, late
        self._end(interrupted, exc)

    def _end(self, interrupted: bool, exc: Optional[BaseException]) -> None:
        """Give back what is left of the hold; raise LockLostError if it was lost."""
        hold = self._hold
        hold.listeners.discard(self)
        lost_error: Optional[LockLostError] = None
        try:
            self._lock.release()  # what is left; LockLostError if it was lost
        except LockLostError as error:
            lost_error = error
        if interrupted or hold.lost or lost_error is not None:
            cause = hold.cause or self.cause or (lost_error.cause if lost_error is not None else None)
            raise LockLostError(f"the hold of {self.name!r} was lost in its bound block"
                                + (f": {cause}" if cause else ""),
                                name=self.name, token=self.token, cause=cause) from exc


#: the code the holding thread runs in the scope itself: an interrupt there could leave the
#: scope's own bookkeeping half done, so the loss is left to the exit (which raises) instead
_OWN = frozenset(f.__code__ for f in (ThreadBound.__enter__, ThreadBound.__exit__,
                                      ThreadBound._disarm))


class Bindable:
    """Mixed into the lock family of the blocking shell."""

    def bound(self, blocking: bool = True, timeout: float = -1) -> Any:
        """``with lock.bound():`` takes the lock (``acquire``'s arguments; TimeoutError when
        it is not taken), runs the block, and releases. When the hold is lost while the block
        runs (its lease ran out unrenewed, its local deadline or ``max_hold`` passed, someone
        took it over), ``LockLostError`` is raised in the holding thread, between two
        bytecodes (a blocking C call is not interrupted), and the ``with`` raises
        ``LockLostError`` with the hold's ``name``, ``token`` and ``cause``. Not on Python
        3.13 (RuntimeError there: cpython#139622). See docs/guides/bound.rst."""
        return ThreadBound(self, blocking, timeout)
