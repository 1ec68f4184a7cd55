"""The asyncio shell's port on a ``redis.asyncio.RedisCluster``.

The same port as on one server (``aport.AsyncPort``), routed as the blocking Cluster
executor routes (``executor_cluster``):

- ``session`` is the blocking Cluster session of a twin ``redis.RedisCluster`` with the same nodes
  and connection settings: its watchdog thread renews the holds, grouped by node.
- A script goes as one EVALSHA to the master of its slot, on a connection of that node, with
  no retries. MOVED, ASK, TRYAGAIN, CLUSTERDOWN, NOSCRIPT and a node that cannot be connected
  to (nothing was sent) are followed as ``redirects.follow`` decides, the same plan and bounds
  as the blocking executor's, carried out here with awaits; a connection that fails after the
  send raises: the script is never sent twice.
- Reads go through the client, which routes them by key.
- Waiters wait in an ``AsyncClusterDispatcher``: one pub/sub connection (SSUBSCRIBE) and one
  reader task per node with waiters, on a small ``redis.asyncio.Redis`` per node that the port
  keeps for that. Where ``redis.asyncio`` has no SSUBSCRIBE (redis-py 7.0.1, the newest release
  for Python 3.9), the port subscribes through ``ShardedPubSub``, which adds it.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Awaitable, Callable, Dict, Optional, Set, Tuple

import redis
import redis.asyncio as aredis
from redis.exceptions import AskError, MovedError

from .aport import AsyncPort, _parameters, aread_pair
from .direct import packer
from .pubsub_cluster import AsyncClusterDispatcher
from .redirects import ASK, MOVED, REDIRECT_BOUND, REDIRECTED, REFRESH, SEND, SLEEP, NotSent, follow, remapped

__all__ = ["AsyncClusterPort", "ShardedPubSub", "cluster_twin"]

_SKIP = {"retry", "redis_connect_func", "parser_class", "event_dispatcher", "connection_pool",
         "host", "port", "connection_class"}


def cluster_twin(client: Any) -> Any:
    """A blocking ``redis.RedisCluster`` with ``client``'s nodes, connection settings and
    ``address_remap`` (without it, the twin would learn the nodes' own addresses from
    ``CLUSTER SLOTS`` and go around the mapping the user's client goes through)."""
    accepted = _parameters(redis.Connection)
    kwargs = {k: v for k, v in client.get_connection_kwargs().items() if k in accepted and k not in _SKIP}
    remap = getattr(client.nodes_manager, "address_remap", None)
    if remap is not None:
        kwargs["address_remap"] = remap
    nodes = client.get_nodes() or list(client.nodes_manager.startup_nodes.values())
    startup = [redis.cluster.ClusterNode(node.host, node.port) for node in nodes]  # type: ignore[no-untyped-call]
    return redis.RedisCluster(startup_nodes=startup, **kwargs)


#: whether this redis-py's asyncio PubSub has sharded pub/sub itself (8.1 has, 7.0.1 has not)
_ASYNC_SSUBSCRIBE = hasattr(aredis.client.PubSub, "ssubscribe")


class ShardedPubSub(aredis.client.PubSub):
    """``redis.asyncio``'s PubSub with the sharded pub/sub that later redis-py releases have
    (``ssubscribe``, ``sunsubscribe``, ``shard_channels``, resubscribed on a reconnect), for a
    redis-py whose asyncio PubSub lacks it. Its replies (``ssubscribe``, ``smessage``,
    ``sunsubscribe``) already come out of ``get_message`` as they are; ``Shard`` translates them."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.shard_channels: Dict[Any, Any] = {}
        self.pending_unsubscribe_shard_channels: Set[Any] = set()

    @property
    def subscribed(self) -> bool:
        return bool(self.channels or self.patterns or self.shard_channels)

    async def on_connect(self, connection: Any) -> None:
        await super().on_connect(connection)
        if _ASYNC_SSUBSCRIBE:  # redis-py's own on_connect subscribed them again
            return
        self.pending_unsubscribe_shard_channels.clear()
        if self.shard_channels:
            await self.ssubscribe(*(self.encoder.decode(k, force=True) for k in self.shard_channels))

    async def ssubscribe(self, *args: Any, target_node: Any = None, **kwargs: Any) -> None:
        await self.execute_command("SSUBSCRIBE", *args)
        # recorded after the send, as redis-py does: a reconnect meanwhile subscribes them once
        new = self._normalize_keys(dict.fromkeys(args))
        self.shard_channels.update(new)
        self.pending_unsubscribe_shard_channels.difference_update(new)

    def sunsubscribe(self, *args: Any, target_node: Any = None) -> Awaitable[Any]:
        self.pending_unsubscribe_shard_channels.update(self._normalize_keys(dict.fromkeys(args)))
        return self.execute_command("SUNSUBSCRIBE", *args)

    async def handle_message(self, response: Any, ignore_subscribe_messages: bool = False) -> Any:
        if isinstance(response, list) and response and response[0] in (b"sunsubscribe", "sunsubscribe"):
            channel = response[1]
            if channel in self.pending_unsubscribe_shard_channels:
                self.pending_unsubscribe_shard_channels.discard(channel)
                self.shard_channels.pop(channel, None)
        return await super().handle_message(  # type: ignore[no-untyped-call]
            response, ignore_subscribe_messages)


class AsyncClusterPort(AsyncPort):
    """``AsyncPort`` for a ``redis.asyncio.RedisCluster`` (see the module's docstring)."""

    def _make_twin(self, client: Any) -> Any:
        return cluster_twin(client)

    def _connection_kwargs(self, client: Any) -> Dict[str, Any]:
        return client.get_connection_kwargs()  # type: ignore[no-any-return]

    def _attach(self, client: Any) -> None:
        executor: Any = self.session.executor
        self.sharded = executor.sharded
        self.slot_of = executor.slot_of
        self._pack = packer(client.encoder)
        self._asking = self._pack(("ASKING",))
        self._node_clients: Dict[str, Any] = {}
        proxy = self._client
        kwargs = {k: v for k, v in client.get_connection_kwargs().items()
                  if k in _parameters(aredis.Connection) and k not in _SKIP}
        me = self

        def pubsub_for(name: str) -> Any:
            node_client = me._node_clients.get(name)
            if node_client is None:
                host, _, port = name.rpartition(":")
                node_client = me._node_clients[name] = aredis.Redis(
                    connection_pool=aredis.ConnectionPool(host=host, port=int(port), **kwargs))
            if _ASYNC_SSUBSCRIBE:
                return node_client.pubsub()
            return ShardedPubSub(node_client.connection_pool)

        self.dispatcher = AsyncClusterDispatcher(lambda: me, pubsub_for)  # type: ignore[assignment]
        self._nodes: Callable[[], Any] = lambda: proxy.nodes_manager

    # --- routing (the source of the dispatcher, too) ---------------------------------------------

    def master(self, slot: int) -> Any:
        return self._nodes().get_node_from_slot(slot)

    async def amoved(self, exc: MovedError) -> None:
        manager = self._nodes()
        remapped(manager, exc)
        move = getattr(manager, "move_slot", None)
        if move is not None:
            await move(exc)
        else:  # older redis-py: applied at the next lookup
            manager._moved_exception = exc

    def asked(self, exc: AskError) -> Any:
        """The node an ASK reply names (a lookup: nothing is sent)."""
        remapped(self._nodes(), exc)
        return self._nodes().get_node(host=exc.host, port=exc.port) or \
            aredis.cluster.ClusterNode(exc.host, exc.port, **self._client.get_connection_kwargs())

    async def _refresh(self) -> None:
        try:
            await self._bounded(self._nodes().initialize(), self._connect_bound or REDIRECT_BOUND)
        except (redis.RedisError, redis.exceptions.RedisClusterException, OSError):
            pass  # no node answers: the try that follows meets the same error, and raises it

    async def join(self, channel: str, bound: Optional[float], ident: Optional[str] = None) -> Any:
        await self._client.initialize()  # the slot map routes the channel (a no-op once read)
        return await super().join(channel, bound, ident)

    # --- scripts ----------------------------------------------------------------------------------

    async def _script(self, script: Any, keys: Tuple[str, ...], args: Tuple[Any, ...],
                      then: Optional[Tuple[Any, ...]] = None) -> Any:
        if not keys:
            raise ValueError("distlock: a script with no key cannot be routed on a cluster")
        await self._client.initialize()  # the slot map (a no-op once read)
        slot = self.slot_of(keys[0])
        packed = self._pack(("EVALSHA", script.sha, len(keys), *keys, *args))
        pair = then is not None
        if then is not None:  # a grant's WAIT, on the same connection of the slot's master
            packed = [packed[0] + self._pack(then)[0]]
        started = time.monotonic()
        node = self.master(slot)
        try:
            return await self._on_node(node, packed, False, pair)
        except REDIRECTED as exc:
            plan = follow(slot, node, exc, started, self.master, self.asked)
        # redirected (the script did not run): the plan decides, this carries it out
        kind, what = next(plan)
        while True:
            if kind is SEND or kind is ASK:
                try:
                    return await self._on_node(what, self._asking + packed if kind is ASK else packed,
                                               kind is ASK, pair)
                except REDIRECTED as exc:
                    outcome = exc
                kind, what = plan.send(outcome)
                continue
            if kind is SLEEP:
                await asyncio.sleep(what)
            elif kind is MOVED:
                await self.amoved(what)
            elif kind is REFRESH:
                await self._refresh()
            else:  # LOAD
                await self._on_node(what, self._pack(("SCRIPT", "LOAD", script.script)), False)
                # and from now on the body itself, which a SCRIPT FLUSH cannot make answer
                # NOSCRIPT again (as the blocking executor)
                packed = self._pack(("EVAL", script.script, len(keys), *keys, *args))
                if then is not None:
                    packed = [packed[0] + self._pack(then)[0]]
            kind, what = next(plan)

    async def _on_node(self, node: Any, packed: Any, asking: bool, pair: bool = False) -> Any:
        """One exchange on a connection of ``node``; ``NotSent`` when none could be opened.
        ``pair``: two commands were packed, and both replies are returned."""
        conn = node.acquire_connection()
        try:
            if not conn.is_connected:
                await self._bounded(conn.connect(), self._connect_bound)
        except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, OSError,
                AttributeError) as exc:
            # AttributeError: its transport was closed under the connect's handshake (a slot
            # map refresh in a failover disconnects the nodes): asyncio's has no writer then
            node.release(conn)
            raise NotSent() from exc
        except BaseException:
            node.release(conn)
            raise
        try:
            if asking:
                await conn.send_packed_command(packed)
                await conn.read_response()  # ASKING's OK
                if pair:
                    return await aread_pair(conn)
                return await conn.read_response()
            return await self._exchange(conn, packed, pair)
        except redis.exceptions.ResponseError:
            raise
        except BaseException:
            if conn.is_connected:
                await conn.disconnect(nowait=True)
            raise
        finally:
            node.release(conn)

