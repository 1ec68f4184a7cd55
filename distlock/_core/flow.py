"""Flows: every operation of every primitive, written once, for both shells.

A primitive's operation (an acquire, a release, a wait) is a *flow*: a generator that does its
bookkeeping itself and *yields* each piece of I/O as an op, then is *sent* the reply (or
*thrown* the error). An op is one of the small classes below, and each names the method of a
*port* that does it (``Run.to`` calls ``port.run``), so a reader, a type checker and "go to
definition" can follow a flow's I/O from ``acquire`` to the executor that sends it:

- ``Run(name, keys, args)``: one script, a state change (``Port.run``: never sent twice);
- ``Read(*command)``: one command that is safe to repeat;
- ``Join(channel, bound, ident)``, ``Sleep(waiter, head_bound, limit)``,
  ``Leave(waiter, acquired)``: waiting on a pub/sub channel;
- ``Slot(enter)``: take (True) or give back (False) one of the slots through which a crowd of
  woken waiters takes turns;
- ``Pick(channel)``, ``Hand(waiter, handed)``: a release that may hand its lock to a waiter
  of this process finds one, and gives it what the script handed it (no I/O: the board's
  bookkeeping, under its mutex).

``Port`` is what a flow may ask of its driver, as a ``Protocol``: a port for threads
(``_session.session.Session``) does each op with blocking I/O, and ``drive`` runs a flow on
it; a port for asyncio (``_redis.aport.AsyncPort``, ``APort`` here) has coroutines of the same
names, and ``adrive`` runs the same flow on it. So the wait policy, the scripts, the keys and
the decoding of replies have one copy, and a shell is only the public methods that hand a flow
to its driver (see docs/how-it-works.rst, "Two shells, one engine").

A driver never abandons a flow: every exception of an op, a cancellation included, is thrown
into it, so its ``except`` and ``finally`` clauses (which may yield more ops: leaving a queue,
giving a lost grant back) run in both shells.
"""

from __future__ import annotations

import asyncio
from typing import Any, Awaitable, Callable, Coroutine, Generator, Optional, Protocol, Tuple, TypeVar, Union

from .errors import WRONG_KIND, wrong_kind

__all__ = ["Flow", "Port", "APort", "Op", "Run", "Read", "Join", "Sleep", "Leave", "Slot",
           "Pick", "Hand", "drive", "adrive", "start", "Started", "Query"]

T = TypeVar("T")


class Port(Protocol):
    """What a flow may ask of its driver, for threads: each op is one blocking call."""

    def run(self, name: str, keys: Tuple[str, ...], args: Tuple[Any, ...],
            acks: Optional[Tuple[int, int]] = None) -> Any:
        """Script ``name``, a state change, sent once; with ``acks``: (reply, acknowledged)."""

    def read(self, *command: Any) -> Any:
        """One command that is safe to repeat."""

    def join(self, channel: str, bound: Optional[float], ident: Optional[str] = None) -> Any:
        """Start waiting on ``channel``; the waiter that ``sleep`` and ``leave`` take."""

    def sleep(self, waiter: Any, head_bound: float, limit: Optional[float] = None) -> bool:
        """Sleep until a hint or the bound; True when hinted."""

    def leave(self, waiter: Any, acquired: bool) -> bool:
        """Stop waiting; True when a hint meant for this waiter must be passed on."""

    def slot(self, enter: bool) -> None:
        """Take (True) or give back (False) one of the slots of a woken crowd."""

    def pick(self, channel: str) -> Any:
        """A waiter on ``channel`` that a release may hand its lock to, or None."""

    def hand(self, waiter: Any, handed: Tuple[int, float]) -> bool:
        """Give ``waiter`` its hand-off and wake it; False when it has left."""


class APort(Protocol):
    """``Port`` for asyncio: the same methods, as coroutines."""

    async def run(self, name: str, keys: Tuple[str, ...], args: Tuple[Any, ...],
                  acks: Optional[Tuple[int, int]] = None) -> Any: ...

    async def read(self, *command: Any) -> Any: ...

    async def join(self, channel: str, bound: Optional[float], ident: Optional[str] = None) -> Any: ...

    async def sleep(self, waiter: Any, head_bound: float, limit: Optional[float] = None) -> bool: ...

    async def leave(self, waiter: Any, acquired: bool) -> bool: ...

    async def slot(self, enter: bool) -> None: ...

    async def pick(self, channel: str) -> Any: ...

    async def hand(self, waiter: Any, handed: Tuple[int, float]) -> bool: ...


AnyPort = Union[Port, APort]


class Op:
    """One piece of I/O that a flow yields; ``to(port)`` does it on a port (and returns the
    reply, or the coroutine that answers it on an asyncio port)."""

    __slots__ = ()

    def to(self, port: Any) -> Any:
        raise NotImplementedError


class Run(Op):
    """Script ``name`` on ``keys`` and ``args``, once (``Port.run``); with ``acks`` (k, ms) a
    ``WAIT`` behind it, and the reply is (reply, acknowledged)."""

    __slots__ = ("name", "keys", "args", "acks")

    def __init__(self, name: str, keys: Tuple[str, ...], args: Tuple[Any, ...],
                 acks: Optional[Tuple[int, int]] = None) -> None:
        self.name = name
        self.keys = keys
        self.args = args
        self.acks = acks

    def to(self, port: AnyPort) -> Any:
        if self.acks is None:
            return port.run(self.name, self.keys, self.args)
        return port.run(self.name, self.keys, self.args, self.acks)

    def __repr__(self) -> str:
        return f"Run({self.name!r}, {self.keys!r}, {self.args!r})"


class Read(Op):
    """One command that is safe to repeat (``Port.read``)."""

    __slots__ = ("command",)

    def __init__(self, *command: Any) -> None:
        self.command = command

    def to(self, port: AnyPort) -> Any:
        return port.read(*self.command)

    def __repr__(self) -> str:
        return f"Read{self.command!r}"


class Join(Op):
    """Start waiting on ``channel`` (``Port.join``)."""

    __slots__ = ("channel", "bound", "ident")

    def __init__(self, channel: str, bound: Optional[float], ident: Optional[str] = None) -> None:
        self.channel = channel
        self.bound = bound
        self.ident = ident

    def to(self, port: AnyPort) -> Any:
        return port.join(self.channel, self.bound, self.ident)


class Sleep(Op):
    """Sleep until a hint or the bound (``Port.sleep``)."""

    __slots__ = ("waiter", "head_bound", "limit")

    def __init__(self, waiter: Any, head_bound: float, limit: Optional[float] = None) -> None:
        self.waiter = waiter
        self.head_bound = head_bound
        self.limit = limit

    def to(self, port: AnyPort) -> Any:
        return port.sleep(self.waiter, self.head_bound, self.limit)


class Leave(Op):
    """Stop waiting (``Port.leave``)."""

    __slots__ = ("waiter", "acquired")

    def __init__(self, waiter: Any, acquired: bool) -> None:
        self.waiter = waiter
        self.acquired = acquired

    def to(self, port: AnyPort) -> Any:
        return port.leave(self.waiter, self.acquired)


class Slot(Op):
    """Take (True) or give back (False) one slot of a woken crowd (``Port.slot``)."""

    __slots__ = ("enter",)

    def __init__(self, enter: bool) -> None:
        self.enter = enter

    def to(self, port: AnyPort) -> Any:
        return port.slot(self.enter)


class Pick(Op):
    """A waiter on ``channel`` that a release may hand its lock to (``Port.pick``)."""

    __slots__ = ("channel",)

    def __init__(self, channel: str) -> None:
        self.channel = channel

    def to(self, port: AnyPort) -> Any:
        return port.pick(self.channel)


class Hand(Op):
    """Give ``waiter`` the hold a release handed it, and wake it (``Port.hand``)."""

    __slots__ = ("waiter", "handed")

    def __init__(self, waiter: Any, handed: Tuple[int, float]) -> None:
        self.waiter = waiter
        self.handed = handed

    def to(self, port: AnyPort) -> Any:
        return port.hand(self.waiter, self.handed)


#: A flow: yields ops, is sent their replies, returns its result.
Flow = Generator[Op, Any, T]


def _refused(exc: BaseException, op: Op) -> BaseException:
    """``exc``, or the WrongKindError that a script's refusal (a name of another kind) stands
    for: the flow gets the error its caller will see."""
    if isinstance(op, Run) and op.keys and str(exc).startswith(WRONG_KIND):
        return wrong_kind(exc, op.keys[0]) or exc
    return exc


def drive(flow: Flow[T], port: Port) -> T:
    """Run ``flow`` to its end on a blocking ``port``; return its result or raise its error."""
    try:
        op = next(flow)
        while True:
            try:
                reply = op.to(port)
            except BaseException as exc:  # noqa: BLE001 - the flow decides what it means
                op = flow.throw(_refused(exc, op))
            else:
                op = flow.send(reply)
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]


async def adrive(flow: Flow[T], port: APort, op: Optional[Op] = None) -> T:
    """``drive`` for an asyncio ``port``, whose ops are coroutines. ``op``: the flow's first
    op, when the caller has already stepped it there (see ``start``)."""
    task = asyncio.current_task()
    cancelling = getattr(task, "cancelling", None)  # Python 3.11+
    # Python 3.9 and 3.10: see ``_whole`` (a task that cannot be cancelled needs no care)
    whole = cancelling is None and not isinstance(task, _Unstoppable)
    try:
        if op is None:
            op = next(flow)
        while True:
            asked = cancelling() if cancelling is not None else 0
            try:
                if whole and type(op) in _SWALLOWING:
                    reply = await _whole(op.to(port), type(op) is Run)
                else:
                    reply = await op.to(port)
            except BaseException as exc:  # noqa: BLE001 - a cancellation included: see above
                op = flow.throw(_refused(exc, op))
            else:
                if cancelling is not None and cancelling() > asked:
                    # Cancelled during the op, but the cancellation was swallowed on its way
                    # (asyncio.wait_for before Python 3.12, gh-86296, which redis-py uses
                    # around its writes): deliver it, as if it had cut the reply off.
                    op = flow.throw(asyncio.CancelledError())
                else:
                    op = flow.send(reply)
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]


#: the ops whose I/O goes through ``asyncio.wait_for`` (redis-py's writes, the port's bound
#: on Python < 3.11, a subscription's): a sleep, a leave and a slot never do
_SWALLOWING = (Run, Read, Join)


async def _whole(coro: Coroutine[Any, Any, T], cut: bool) -> T:
    """``await coro``, for Python 3.9 and 3.10, where a cancellation can be swallowed on its
    way (``asyncio.wait_for`` returns the result when its inner future finished as the
    cancellation came, gh-86296) and, without ``Task.cancelling()``, leave no trace: the op
    runs in a task of its own, which the caller awaits through ``asyncio.shield``. A
    cancellation of the caller reaches it at once and is passed on to the op; the caller
    waits for the op to end (the flow's next op never overtakes it), then:

    - the op was cut off, or failed: CancelledError, which the flow is thrown;
    - it finished all the same: for a script (``cut``), CancelledError too, as if the
      cancellation had cut its reply off (the flow reads what it did and gives back a grant
      that happened); for a read or a subscription, the reply (the flow needs a waiter to
      take it off its channel), and the cancellation is asked again, to land where the task
      next waits, as it would have with no task between."""
    inner = asyncio.ensure_future(coro)
    try:
        return await asyncio.shield(inner)
    except asyncio.CancelledError:
        inner.cancel()
        while not inner.done():
            try:
                await asyncio.wait({inner})
            except asyncio.CancelledError:
                pass  # cancelled again meanwhile: one cancellation is delivered
        if inner.cancelled() or inner.exception() is not None or cut:
            raise
    task = asyncio.current_task()
    assert task is not None
    task.cancel()  # at the next await
    return inner.result()


class Started(Awaitable[T]):
    """What a state change of an asyncio primitive returns (``release()``, ``set()``,
    ``notify()``): the change has started, and goes on whether or not it is awaited, and even
    when the task awaiting it is cancelled. Awaiting it waits for the outcome and raises its
    errors. It is not a truth value: ``if lock.release():`` raises TypeError.

    The rest of the change runs in a task of its own (``_Unstoppable``), made at the loop's
    next turn, unless the caller awaits first (``await lock.release()``, the usual case). A
    change that may finish in the awaiting task (``inline``: one whose flow hands a cut-short
    round trip to the watchdog thread, as a lock's release does) then runs there, without a
    task; any other is handed to its task at once."""

    __slots__ = ("_task", "_value", "_rest", "_inline")

    def __init__(self, task: Optional[asyncio.Future[T]], value: Any = None,
                 rest: Optional[Callable[[], Coroutine[Any, Any, T]]] = None,
                 inline: bool = False) -> None:
        self._task = task
        self._value = value
        self._rest = rest  # the coroutine that finishes the change, not started yet
        self._inline = inline

    def _launch(self) -> None:
        """The loop's next turn: nobody awaited the change yet; a task finishes it."""
        rest, self._rest = self._rest, None
        if rest is not None:
            self._task = _Unstoppable(rest(), loop=asyncio.get_running_loop())

    def __await__(self) -> Generator[Any, None, T]:
        rest = self._rest
        if rest is not None:
            self._rest = None
            if self._inline:
                return (yield from rest().__await__())
            self._task = _Unstoppable(rest(), loop=asyncio.get_running_loop())
        task = self._task
        if task is None:
            return self._value  # type: ignore[no-any-return]
        # A caller cancelled while it awaits this waits for the change to finish, then gets
        # its CancelledError: the task refuses to be cancelled (see ``_Unstoppable``).
        return (yield from task.__await__())

    def __bool__(self) -> bool:
        raise TypeError("this is an awaitable, not a truth value: use 'await'")

    def done(self) -> bool:
        return self._rest is None and (self._task is None or self._task.done())


def start(flow: Flow[T], port: Callable[[], APort], inline: bool = False) -> Started[T]:
    """Run ``flow`` at once up to its first op, in the caller (its checks raise here, and its
    bookkeeping is done before this returns), then the rest as ``Started`` says."""
    try:
        op = next(flow)
    except StopIteration as stop:
        return Started(None, stop.value)
    try:
        target = port()
        loop = asyncio.get_running_loop()
    except BaseException:
        flow.close()
        raise
    started: Started[T] = Started(None, rest=lambda: adrive(flow, target, op), inline=inline)
    loop.call_soon(started._launch)
    return started


class _Unstoppable(asyncio.Task):  # type: ignore[type-arg]
    """A state change in flight: a release must never stop half-way, leaving the lock held.
    Cancelling it (the task that awaits it was cancelled, or the loop is shutting down and
    cancels every task) does nothing: the loop's shutdown then waits for it to finish."""

    def cancel(self, msg: Any = None) -> bool:
        return False


class Query(Awaitable[T]):
    """What a query of an asyncio primitive returns (``locked()``, ``is_set()``): an awaitable
    that asks Redis when awaited, and raises TypeError when used as a truth value instead
    (``if lock.locked():`` would otherwise always be true)."""

    __slots__ = ("_make",)

    def __init__(self, make: Callable[[], Awaitable[T]]) -> None:
        self._make = make

    def __await__(self) -> Generator[Any, None, T]:
        return self._make().__await__()

    def __bool__(self) -> bool:
        raise TypeError("this is an awaitable, not a truth value: use 'await'")
