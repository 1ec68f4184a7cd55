"""The pub/sub side of a Cluster session: one dispatcher per node that has waiters.

A primitive's channel has its name's hash tag, so it lives in the slot of its keys, and the
scripts announce on it with SPUBLISH (``_redis.executor_cluster``): only the node that owns the slot
(and its replicas) deliver it. Each waiter therefore joins the dispatcher of its channel's
master, which subscribes with SSUBSCRIBE on a connection to that node. A process holds at most
one pub/sub connection per node on which it has waiters, each with its own reader (a thread,
or a task in the asyncio shell) that exits when the node has no waiter left, as on one server.

When a slot moves (a resharding, a failover), the old owner says so: it unsubscribes the
channel (``sunsubscribe`` pushed by the server), or answers MOVED to a new SSUBSCRIBE. Either
way the channel is marked ``moved`` and its waiters are woken: each tries again (its script
follows MOVED, which updates the slot map) and, at its next sleep, leaves the old node's
dispatcher for the new owner's. A node that died says nothing; its reader reconnects in vain
while its waiters sleep their bounds and, at their next sleep, move to the promoted replica.
Hints are only hints: none of this costs a waiter more than its bound.

``Router`` is what both shells share; ``ClusterDispatcher`` (threads) and
``AsyncClusterDispatcher`` (one event loop) add the waiting. The *source* each is given is the
routing side of an executor: ``slot_of(key)``, ``master(slot)`` (a node, with ``name``),
``sharded``, and a way to note a MOVED reply.
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Dict, List, Optional, Set

import redis

from .apubsub import AsyncDispatcher
from .dispatcher import Dispatcher
from .pubsub import Board, Waiter

__all__ = ["ClusterDispatcher", "AsyncClusterDispatcher", "Routed", "Router", "Shard"]

_KINDS = {"ssubscribe": "subscribe", "smessage": "message", "sunsubscribe": "moved"}


class Routed:
    """A waiter, and the node dispatcher it waits in (which changes when its slot moves)."""

    __slots__ = ("board", "inner")

    def __init__(self, board: Any, inner: Waiter) -> None:
        self.board = board
        self.inner = inner

    @property
    def named(self) -> bool:
        return self.inner.named

    @property
    def channel(self) -> Any:
        return self.inner.channel

    @property
    def payload(self) -> Optional[str]:
        """What a hint that named this waiter alone carried (a fair lock's hand-off)."""
        return self.inner.payload

    @property
    def ident(self) -> Optional[str]:
        return self.inner.ident

    @ident.setter
    def ident(self, value: Optional[str]) -> None:  # a plain lock's wait joining a fair queue
        self.inner.ident = value

    @property
    def taker(self) -> Any:
        return self.inner.taker

    @taker.setter
    def taker(self, value: Any) -> None:
        self.inner.taker = value

    @property
    def handed(self) -> Any:
        return self.inner.handed


class Router:
    """Node dispatchers by node name, and the routing rules both shells share."""

    def __init__(self, source: Callable[[], Any], make: Callable[[Any], Board]) -> None:
        self._source = source
        self._make = make  # node -> a new node dispatcher
        self._lock = threading.Lock()
        self._nodes: Dict[str, Board] = {}
        self.closed = False

    def _board(self, channel: str) -> Any:
        source = self._source()
        node = source.master(source.slot_of(channel))
        with self._lock:
            board = self._nodes.get(node.name)
            if board is None:
                board = self._nodes[node.name] = self._make(node)
                board.closed = self.closed
            return board

    def _moves(self, routed: Routed) -> Any:
        """The dispatcher ``routed`` should wait in now, when that is not its own (its slot
        moved); else None."""
        channel = routed.inner.channel
        board = self._board(channel.name)
        return board if board is not routed.board or channel.moved else None

    def leave(self, routed: Routed, acquired: bool) -> bool:
        return routed.board.leave(routed.inner, acquired)  # type: ignore[no-any-return]

    def pick(self, channel: str) -> Optional[Routed]:
        board = self._board(channel)
        inner = board.pick(channel)
        return None if inner is None else Routed(board, inner)

    def hand(self, routed: Routed, handed: Any) -> bool:
        return routed.board.hand(routed.inner, handed)  # type: ignore[no-any-return]

    def _all(self) -> List[Any]:
        with self._lock:
            return list(self._nodes.values())

    def busy(self) -> bool:
        return any(board.busy() for board in self._all())

    def wake_all(self) -> None:
        for board in self._all():
            board.wake_all()

    def subscribed(self) -> List[str]:
        return [name for board in self._all() for name in board.subscribed()]

    @property
    def reconnects(self) -> int:
        return sum(board.reconnects for board in self._all())

    def boards(self) -> Dict[str, Any]:
        """For tests and benchmarks: the node dispatchers, by node name."""
        with self._lock:
            return dict(self._nodes)


class ClusterDispatcher(Router):
    """The session's dispatcher on a cluster (threads): ``_redis.dispatcher.Dispatcher``'s methods, each
    routed to the dispatcher of the channel's node."""

    def __init__(self, executor: Callable[[], Any], tag: str) -> None:
        def make(node: Any) -> Board:
            return _NodeDispatcher(executor, node.name, f"{tag}-{node.port}")
        super().__init__(executor, make)

    def join(self, channel_name: str, bound: Optional[float], ident: Optional[str] = None) -> Routed:
        board = self._board(channel_name)
        return Routed(board, board.join(channel_name, bound, ident))

    def sleep(self, routed: Routed, head_bound: float, limit: Optional[float] = None) -> bool:
        """As ``Dispatcher.sleep``; a waiter whose slot moved first moves to the new owner's
        dispatcher, and returns at once as if hinted (hints may have gone by meanwhile)."""
        board = self._moves(routed)
        if board is not None:
            routed.board.leave(routed.inner, False)
            routed.board = board
            routed.inner = board.join(routed.inner.channel.name, 0, routed.inner.ident)
            return True
        return routed.board.sleep(routed.inner, head_bound, limit)  # type: ignore[no-any-return]

    @property
    def running(self) -> bool:
        return any(board.running for board in self._all())

    def close(self, join: bool) -> None:
        self.closed = True
        for board in self._all():
            board.close(join)


class AsyncClusterDispatcher(Router):
    """``ClusterDispatcher`` for one event loop (``_redis.apubsub.AsyncDispatcher`` per node);
    ``pubsub_for(node)`` opens a ``redis.asyncio`` PubSub on that node."""

    def __init__(self, source: Callable[[], Any], pubsub_for: Callable[[Any], Any]) -> None:
        def make(node: Any) -> Board:
            name = node.name

            def opener() -> Any:
                return AsyncShardPubSub(pubsub_for(name), Shard(source(), name))
            return AsyncDispatcher(opener)
        super().__init__(source, make)

    async def join(self, channel_name: str, bound: Optional[float], ident: Optional[str] = None) -> Routed:
        board = self._board(channel_name)
        return Routed(board, await board.join(channel_name, bound, ident))

    async def sleep(self, routed: Routed, head_bound: float, limit: Optional[float] = None) -> bool:
        board = self._moves(routed)
        if board is not None:
            routed.board.leave(routed.inner, False)
            routed.board = board
            routed.inner = await board.join(routed.inner.channel.name, 0, routed.inner.ident)
            return True
        return await routed.board.sleep(routed.inner, head_bound, limit)  # type: ignore[no-any-return]

    def close(self) -> None:
        self.closed = True
        for board in self._all():
            board.close()


class _NodeDispatcher(Dispatcher):
    """A dispatcher on one node of the cluster."""

    lends = False  # its connection speaks through ShardPubSub, whose messages may be synthetic

    def __init__(self, executor: Callable[[], Any], node_name: str, tag: str) -> None:
        super().__init__(executor, tag)
        self.node_name = node_name

    def _open(self) -> Any:
        executor = self._executor()
        node = executor.client.nodes_manager.get_node(node_name=self.node_name)
        if node is None:
            host, _, port = self.node_name.rpartition(":")
            node = redis.cluster.ClusterNode(host, int(port))  # type: ignore[no-untyped-call]
        return ShardPubSub(executor.node_client(node).pubsub(), Shard(executor, self.node_name))


class Shard:
    """How one node's pub/sub connection is spoken, without I/O: SSUBSCRIBE (or SUBSCRIBE on
    servers without sharded pub/sub), sharded messages renamed to what ``Board`` knows
    (``subscribe``, ``message``, and ``unsubscribe`` for the confirmation of ours), and
    ``moved`` for a channel whose slot is elsewhere now: the server's own ``sunsubscribe``, a
    MOVED reply, or a channel to subscribe that the slot map places on another node."""

    def __init__(self, source: Any, node_name: str) -> None:
        self.source = source
        self.node = node_name
        self.sharded = bool(source.sharded)
        #: synthetic messages to hand out before reading the connection again
        self.pending: List[Dict[str, Any]] = []
        #: channels we unsubscribed ourselves: their ``sunsubscribe`` confirms it (handed on as
        #: ``unsubscribe``), it does not say the slot moved
        self.leaving: Set[str] = set()

    def owned(self, names: tuple[str, ...]) -> List[str]:
        """Those of ``names`` this node serves; the others come back as ``moved``."""
        source = self.source
        mine = []
        for name in names:
            if source.master(source.slot_of(name)).name == self.node:
                mine.append(name)
            else:
                self.pending.append({"type": "moved", "channel": name})
        return mine

    def moved_error(self, exc: redis.exceptions.MovedError, channels: Any) -> Optional[Dict[str, Any]]:
        """A MOVED reply to a (re-)subscription: every channel of that slot moves."""
        self.pending = [{"type": "moved", "channel": name} for name in (_text(n) for n in channels)
                        if self.source.slot_of(name) == exc.slot_id]
        return self.pending.pop() if self.pending else None

    def translate(self, message: Optional[Dict[str, Any]], pubsub: Any) -> Optional[Dict[str, Any]]:
        if message is None:
            return None
        kind = message.get("type")
        if kind in ("sunsubscribe", "unsubscribe"):
            name = _text(message.get("channel"))
            if name in self.leaving:  # ours, confirmed: the dispatcher may subscribe it again
                self.leaving.discard(name)
                return dict(message, type="unsubscribe")
            if kind == "unsubscribe":
                return None
            # The server's own: the slot moved. redis-py would subscribe it here again after a
            # reconnect; the dispatcher decides where instead.
            getattr(pubsub, "shard_channels", {}).pop(message.get("channel"), None)
        if kind in _KINDS:
            message = dict(message, type=_KINDS[kind])
        return message

    def channels(self, pubsub: Any) -> Any:
        return list(getattr(pubsub, "shard_channels" if self.sharded else "channels", {}))


class ShardPubSub:
    """A blocking redis-py PubSub on one node, spoken as ``Shard`` says."""

    def __init__(self, pubsub: Any, shard: Shard) -> None:
        self._pubsub = pubsub
        self._shard = shard

    def subscribe(self, *names: str) -> None:
        mine = self._shard.owned(names)
        if mine:
            (self._pubsub.ssubscribe if self._shard.sharded else self._pubsub.subscribe)(*mine)

    def unsubscribe(self, *names: str) -> None:
        self._shard.leaving.update(names)
        (self._pubsub.sunsubscribe if self._shard.sharded else self._pubsub.unsubscribe)(*names)

    def get_message(self, timeout: float) -> Optional[Dict[str, Any]]:
        shard = self._shard
        if shard.pending:
            return shard.pending.pop()
        try:
            message = self._pubsub.get_message(timeout=timeout)
        except redis.exceptions.MovedError as exc:
            shard.source.moved(exc)
            return shard.moved_error(exc, shard.channels(self._pubsub))
        return shard.translate(message, self._pubsub)

    def close(self) -> None:
        self._pubsub.close()


class AsyncShardPubSub:
    """A ``redis.asyncio`` PubSub on one node, spoken as ``Shard`` says."""

    def __init__(self, pubsub: Any, shard: Shard) -> None:
        self._pubsub = pubsub
        self._shard = shard

    @property
    def connection(self) -> Any:
        # a synthetic message waiting counts as a connection with something to read
        return self._pubsub.connection if not self._shard.pending else True

    async def subscribe(self, *names: str) -> None:
        mine = self._shard.owned(names)
        if mine:
            await (self._pubsub.ssubscribe if self._shard.sharded else self._pubsub.subscribe)(*mine)

    async def unsubscribe(self, *names: str) -> None:
        self._shard.leaving.update(names)
        await (self._pubsub.sunsubscribe if self._shard.sharded else self._pubsub.unsubscribe)(*names)

    async def get_message(self, timeout: float) -> Optional[Dict[str, Any]]:
        shard = self._shard
        if shard.pending:
            return shard.pending.pop()
        try:
            message = await self._pubsub.get_message(timeout=timeout)
        except redis.exceptions.MovedError as exc:
            await shard.source.amoved(exc)
            return shard.moved_error(exc, shard.channels(self._pubsub))
        return shard.translate(message, self._pubsub)

    async def aclose(self) -> None:
        close = getattr(self._pubsub, "aclose", None) or self._pubsub.close
        await close()


def _text(name: Any) -> str:
    return name.decode("utf-8", "surrogateescape") if isinstance(name, bytes) else str(name)
