"""The pub/sub side of a Redlock quorum: one dispatcher per master, and a waiter joins all of
them, so that a hint from any master wakes it.

``Boards`` is what the quorum's dispatchers of both shells share: the dispatchers, one per
master, and a wait's waiters in them (a ``_Fan``: one ``Waiter`` per master, all sharing the
first one's event). ``QuorumDispatcher`` (threads) adds the parts that block, over a
``_MasterDispatcher`` per master (a ``dispatcher.Dispatcher`` on that master's twin, with its own
pub/sub connection and thread, as a cluster has one per node); the asyncio shell's
``aport_quorum.AsyncQuorumDispatcher`` adds those that await.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Callable, List, Optional

from .._core.quorum import quorum
from .._core.settings import settings
from .dispatcher import Dispatcher
from .pubsub import Board, Waiter

if TYPE_CHECKING:
    from .fanout_quorum import Master

__all__ = ["Boards", "QuorumDispatcher"]


class _Fan:
    """One waiter of a Redlock lock: one ``Waiter`` per master's dispatcher, all sharing the
    first one's event, so that a hint from any master wakes it."""

    __slots__ = ("inner",)

    def __init__(self, inner: List[Waiter]) -> None:
        self.inner = inner

    @property
    def named(self) -> bool:
        return any(w.named for w in self.inner)

    @property
    def channel(self) -> Any:
        return self.inner[0].channel


class Boards:
    """What the quorum's dispatchers of both shells share: one dispatcher per master
    (``_boards``), a waiter in each (a ``_Fan``). Each shell adds ``join`` and ``sleep`` (the
    only parts that block or await) and ``close``."""

    _boards: List[Any]

    def __init__(self, boards: List[Any]) -> None:
        self._boards = boards
        self._required = quorum(len(boards))
        self.closed = False

    def _wait_bound(self, bound: Optional[float]) -> Optional[float]:
        """Until when ``join`` waits for a quorum of confirmed subscriptions (as on one server:
        at most the bound, at most the wait cap); None: it does not wait."""
        if bound is not None and bound <= 0:
            return None
        cap = settings().wait_cap
        return time.monotonic() + (cap if bound is None else min(bound, cap))

    def _share_event(self, inner: List[Waiter]) -> _Fan:
        """The waiters of one wait, one per master, woken by the first one's event."""
        for waiter in inner[1:]:
            waiter.event = inner[0].event
        return _Fan(inner)

    def _left(self, fan: _Fan, started: float, head_bound: float, limit: Optional[float]) -> float:
        """How long ``sleep`` may still wait (<= 0: no more), as ``Dispatcher.sleep``: the bound is
        that of the first master's queue; 0 once any master hinted."""
        if any(w.hinted for w in fan.inner):
            return 0.0
        return Board._bound(fan.inner[0], head_bound, limit) - (time.monotonic() - started)

    def _take_hint(self, fan: _Fan) -> bool:
        """Whether any master hinted this wait since the last look (and forget it)."""
        hinted = False
        for board, waiter in zip(self._boards, fan.inner):
            with board.mutex:
                hinted = hinted or bool(waiter.hinted)
                waiter.hinted = False
        fan.inner[0].event.clear()
        return hinted

    def leave(self, fan: _Fan, acquired: bool) -> bool:
        last = [board.leave(waiter, acquired) for board, waiter in zip(self._boards, fan.inner)]
        return bool(last[0])

    def _leave_partial(self, inner: List[Waiter]) -> None:
        """A join interrupted: leave the masters joined so far."""
        for board, waiter in zip(self._boards, inner):
            board.leave(waiter, False)

    def busy(self) -> bool:
        return any(board.busy() for board in self._boards)

    def wake_all(self) -> None:
        for board in self._boards:
            board.wake_all()

    def subscribed(self) -> List[str]:
        return sorted({name for board in self._boards for name in board.subscribed()})

    def boards(self) -> List[Any]:
        """For tests: the dispatcher of each master, in the list's order."""
        return list(self._boards)


class QuorumDispatcher(Boards):
    """The session's dispatcher on a quorum: ``dispatcher.Dispatcher``'s methods over one
    dispatcher per master (each with its pub/sub connection and thread, as a cluster has one
    per node)."""

    def __init__(self, source: Callable[[], Any], tag: str, masters: List[Master]) -> None:
        super().__init__([MasterDispatcher(source, i, f"{tag}-{m.name.rpartition(':')[2]}")
                          for i, m in enumerate(masters)])

    def join(self, channel_name: str, bound: Optional[float], ident: Optional[str] = None) -> _Fan:
        inner: List[Waiter] = []
        try:
            for board in self._boards:
                inner.append(board.join(channel_name, 0, ident))
        except BaseException:
            self._leave_partial(inner)
            raise
        fan = self._share_event(inner)
        deadline = self._wait_bound(bound)
        if deadline is not None:
            confirmed = 0
            for waiter in inner:
                if waiter.channel.confirmed.wait(max(0.0, deadline - time.monotonic())):
                    confirmed += 1
                    if confirmed >= self._required:
                        break
        return fan

    def sleep(self, fan: _Fan, head_bound: float, limit: Optional[float] = None) -> bool:
        """As ``Dispatcher.sleep``: the bound is that of the first master's queue."""
        started = time.monotonic()
        while (left := self._left(fan, started, head_bound, limit)) > 0:
            fan.inner[0].event.wait(left)
            fan.inner[0].event.clear()
        return self._take_hint(fan)

    @property
    def reconnects(self) -> int:
        return sum(board.reconnects for board in self._boards)

    @property
    def running(self) -> bool:
        return any(board.running for board in self._boards)

    def close(self, join: bool) -> None:
        self.closed = True
        for board in self._boards:
            board.close(join)


class MasterDispatcher(Dispatcher):
    """A dispatcher on one master of the quorum."""

    lends = False  # a quorum's waiter sleeps on every master's dispatcher at once

    def __init__(self, source: Callable[[], Any], index: int, tag: str) -> None:
        super().__init__(source, tag)
        self.index = index

    def _open(self) -> Any:
        return self._executor().masters[self.index].twin.pubsub()
