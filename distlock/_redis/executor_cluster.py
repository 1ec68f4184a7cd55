"""The Cluster executor: the executor's methods on a ``redis.RedisCluster``.

Every key of a primitive shares one hash tag, so each script has one slot, and one master
serves it. The same three kinds of traffic as on one server (``executor``), routed:

- ``run``: one EVALSHA on the master of the keys' slot, by the direct path on that node's own
  connection pool (no retries). Redirections mean the script did not run, so they are
  followed: MOVED updates the slot map and sends again; ASK sends ASKING and the script to the
  importing node; TRYAGAIN and CLUSTERDOWN pause briefly and send again; NOSCRIPT loads the
  script on that node. A connection that cannot be *opened* (nothing was sent: the node died)
  refreshes the slot map and tries the slot's master again. All of that is bounded
  (``REDIRECTS`` tries within ``REDIRECT_BOUND`` seconds), and decided once for both shells
  by ``redirects.follow``: ``_send`` only carries out its steps. A connection that fails
  *after* the send raises: the reply was lost and the script may have run, so it is never
  re-sent (docs/design.rst, principle 13). redis-py's ``RedisCluster.execute_command`` would re-send it
  on a connection error, which is why scripts never go through it.
- ``read``: a command that is safe to repeat goes through the client: redis-py routes it by
  its key and follows redirections.
- ``batch`` / ``renewal_batch``: entries grouped by the master of their slot, one pipeline per
  node, so the watchdog renews 1,000 holds on 3 masters in 3 round trips. An entry answered
  with MOVED or ASK is sent again to its new owner (batched entries are safe to repeat). The
  watchdog's pipelines go through a private twin of each node's client (``clients.renewer``).
- ``dispatcher``: one pub/sub connection per node that has waiters (``pubsub_cluster``); the
  scripts announce releases with SPUBLISH (sharded pub/sub, Redis 7.0+), or PUBLISH on older
  servers.

A grant made with ``min_replicas`` (``run(..., acks=...)``) sends its WAIT behind the script on
the same connection of the slot's master, so the WAIT counts that shard's replicas and no
other's (``RedisCluster.wait()`` would ask every shard). A batch's WAIT (the watchdog's
renewals) ends each node's pipeline: each entry learns its own master's count.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Dict, List, Optional, Set, Tuple

import redis
from redis.commands.core import Script
from redis.exceptions import AskError, MovedError, NoScriptError, TryAgainError

from .._core.settings import settings
from .clients import renewer
from .direct import disconnect_quietly, packer, read_pair, taker
from .executor import Batch, Executor, located
from .redirects import ASK, FIRST_PAUSE, MOVED, REDIRECTED, REFRESH, SEND, SLEEP, NotSent, follow, remapped
from .scripts import script_names, script_source

__all__ = ["ClusterExecutor", "ClusterBatch"]

#: connection settings of a cluster's node pools that refer back to the RedisCluster
_BACK_REFERENCES = ("redis_connect_func", "oss_cluster_maint_notifications_handler")

#: How many rounds one batch makes at most: the first, then those of entries redirected.
_BATCH_ROUNDS = 4


def sharded_source(name: str, sharded: bool) -> str:
    """Script ``name``'s text, announcing with SPUBLISH when ``sharded`` (same lines, so error
    locations are unchanged)."""
    source = script_source(name)
    return source.replace("redis.call('publish',", "redis.call('spublish',") if sharded else source


class ClusterExecutor(Executor):
    """Runs scripts and commands on a Redis Cluster (see the module's docstring)."""

    def __init__(self, client: Any, real: Any = None) -> None:
        super().__init__(client, real)
        self.sharded = _has_sharded_pubsub(client)
        self.scripts = {name: Script(client, sharded_source(name, self.sharded)) for name in script_names()}
        #: per node name: the watchdog's private twin of that node's client
        self._renewers: Dict[str, Tuple[float, Any]] = {}
        #: per node name: the scripts a batch loaded there (see ``ClusterBatch._send``)
        self.loaded: Dict[str, Set[str]] = {}

    # --- routing ----------------------------------------------------------------------------

    def slot_of(self, key: Any) -> int:
        return int(self.client.keyslot(key))

    def master(self, slot: int) -> Any:
        """The node that serves ``slot`` now, as far as the client's slot map knows."""
        return self.client.nodes_manager.get_node_from_slot(slot)

    def node_client(self, node: Any) -> Any:
        """The client (a ``redis.Redis``) that talks to ``node``."""
        return self.client.get_redis_connection(node)

    def moved(self, exc: MovedError) -> None:
        """Record a MOVED reply in the client's slot map."""
        manager = self.client.nodes_manager
        remapped(manager, exc)
        if hasattr(manager, "move_slot"):
            manager.move_slot(exc)
        else:  # redis-py before 5.1: applied at the next lookup
            manager.update_moved_exception(exc)

    def refresh(self) -> None:
        """Read the slot map again (a node could not be reached)."""
        self.loaded.clear()  # a node may have been replaced (a promoted replica)
        try:
            self.client.nodes_manager.initialize()
        except (redis.RedisError, redis.exceptions.RedisClusterException):
            pass  # no node answers: the try that follows meets the same error, and raises it

    def _sender(self, node: Any) -> Callable[..., Any]:
        # Kept on the node's pool, not here: the pool's settings refer to the user's client,
        # which the session must not keep alive (docs/design.rst, principle 11).
        pool = self.node_client(node).connection_pool
        send: Optional[Callable[..., Any]] = getattr(pool, "_distlock_send", None)
        if send is None:
            send = pool._distlock_send = _node_sender(pool)
        return send

    def asked(self, exc: AskError) -> Any:
        """The node an ASK reply names (a lookup: nothing is sent)."""
        remapped(self.client.nodes_manager, exc)
        return self.client.nodes_manager.get_node(host=exc.host, port=exc.port) or \
            redis.cluster.ClusterNode(exc.host, exc.port)  # type: ignore[no-untyped-call]

    # --- the three kinds of traffic ---------------------------------------------------------

    def _send(self, name: str, script: Any, keys: Tuple[str, ...], args: Tuple[Any, ...],
              then: Optional[Tuple[Any, ...]] = None) -> Any:
        if not keys:
            raise ValueError(f"distlock: script {name} has no key to route it by")
        slot = self.slot_of(keys[0])
        command = ("EVALSHA", script.sha, len(keys), *keys, *args)
        started = time.monotonic()
        node = self.master(slot)
        try:
            return self._sender(node)(command, False, then)
        except REDIRECTED as exc:
            plan = follow(slot, node, exc, started, self.master, self.asked)
        # redirected (the script did not run): the plan decides, this carries it out
        kind, what = next(plan)
        while True:
            if kind is SEND or kind is ASK:
                try:
                    return self._sender(what)(command, kind is ASK, then)
                except REDIRECTED as exc:
                    outcome = exc
                kind, what = plan.send(outcome)
                continue
            if kind is SLEEP:
                time.sleep(what)
            elif kind is MOVED:
                self.moved(what)
            elif kind is REFRESH:
                self.refresh()
            else:  # LOAD
                self.node_client(what).script_load(script.script)
                # and from now on the body itself: a SCRIPT FLUSH between the load and the
                # next send cannot make that one answer NOSCRIPT again
                command = ("EVAL", script.script, len(keys), *keys, *args)
            kind, what = next(plan)

    def read(self, *command: Any) -> Any:
        try:
            return self.client.execute_command(*command)
        except AttributeError as exc:
            hidden = _hidden_error(exc)
            if hidden is exc:
                raise
            raise hidden from None

    def batch(self) -> ClusterBatch:
        return ClusterBatch(self, self.node_client)

    def renewal_batch(self) -> ClusterBatch:
        return ClusterBatch(self, self._renewer_for)

    def _renewer_for(self, node: Any) -> Any:
        interval = settings().renew_interval
        known = self._renewers.get(node.name)
        if known is None or known[0] != interval:
            if known is not None:
                disconnect_quietly(known[1])
            twin = renewer(self.node_client(node), interval)
            if twin is None:
                raise TypeError(f"distlock: cannot make the watchdog's connection to {node.name}")
            # settings that refer back to the user's client (its on_connect hook and
            # notification handler): the twin needs neither, and must not keep it alive
            for key in _BACK_REFERENCES:
                twin.connection_pool.connection_kwargs.pop(key, None)
            known = self._renewers[node.name] = (interval, twin)
        return known[1]

    def open_renewal(self) -> bool:
        """Nothing: the watchdog's connection to a node is made with its first renewal."""
        return False

    def _renewal_pools(self) -> List[Any]:
        return [twin.connection_pool for _, twin in list(self._renewers.values())
                if twin is not None and hasattr(twin, "connection_pool")]

    def drop_renewal(self) -> None:
        renewers, self._renewers = self._renewers, {}
        for _, twin in renewers.values():
            disconnect_quietly(twin)

    def pubsub(self) -> Any:
        raise TypeError("a cluster has one pub/sub connection per node: see dispatcher()")

    def dispatcher(self, source: Callable[[], Any], tag: str) -> Any:
        from .pubsub_cluster import ClusterDispatcher
        return ClusterDispatcher(source, tag)


def _hidden_error(exc: AttributeError) -> BaseException:
    """The Redis error that ``exc`` hid, else ``exc``. redis-py 8.1 records a metric of a
    connection error whose ``connection`` is None (``RedisCluster._record_error_metric``) and
    fails doing so: the error it was handling is the one that happened."""
    context = exc.__context__
    return context if isinstance(context, redis.RedisError) else exc


def _has_sharded_pubsub(client: Any) -> bool:
    """Whether the cluster's servers have SPUBLISH (Redis 7.0+, Valkey); asked once."""
    try:
        info = client.execute_command("INFO", "server", target_nodes=client.get_default_node())
    except redis.RedisError:
        return True  # unreachable now: assume a current server; the scripts say otherwise if not
    except AttributeError as exc:
        if isinstance(_hidden_error(exc), redis.RedisError):
            return True
        raise
    if isinstance(info, dict) and len(info) == 1 and isinstance(next(iter(info.values())), dict):
        info = next(iter(info.values()))
    version = str(info.get("redis_version", "7.0.0")) if isinstance(info, dict) else "7.0.0"
    try:
        return int(version.split(".")[0]) >= 7
    except ValueError:
        return True


def _node_sender(pool: Any) -> Callable[[Tuple[Any, ...], bool, Optional[Tuple[Any, ...]]], Any]:
    """Send one command on a connection of ``pool`` (one node), never retrying; raise
    ``NotSent`` when no connection could be opened. ``then``: a command sent behind it in
    the same write (a grant's WAIT): both replies are returned (``direct.read_pair``)."""
    take = taker(pool)
    give_back = pool.release
    pack = packer(pool.get_encoder())
    asking = pack(("ASKING",))

    def execute(command: Tuple[Any, ...], ask: bool, then: Optional[Tuple[Any, ...]] = None) -> Any:
        packed = pack(command)
        if then is not None:
            packed = [packed[0] + pack(then)[0]]
        try:
            conn = take()
        except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, OSError,
                ValueError) as exc:
            # ValueError: "I/O operation on closed file", a connection closed by another
            # thread (a slot map refresh in a failover) while this one connected on it
            raise NotSent() from exc
        try:
            if ask:
                conn.send_packed_command(asking + packed)
                conn.read_response()
            else:
                conn.send_packed_command(packed)
            if then is not None:
                return read_pair(conn)
            return conn.read_response()
        except redis.exceptions.ResponseError:
            raise  # the whole reply was read: the connection is clean
        except BaseException:
            conn.disconnect()
            raise
        finally:
            give_back(conn)

    return execute


class ClusterBatch(Batch):
    """A batch whose entries go, one pipeline per node, to the master of each entry's slot.

    A command without a key (TIME) goes with the entry before it; ``execute`` returns the
    replies in the order the entries were queued."""

    __slots__ = ("_executor", "_client_for", "_entries")

    def __init__(self, executor: ClusterExecutor, client_for: Callable[[Any], Any]) -> None:  # noqa: D107
        # (Batch's own pipeline is per node here: nothing of Batch.__init__ applies)
        self._executor = executor
        self._client_for = client_for
        #: per entry: (slot, script name or '', keys, args or the command)
        self._entries: List[Tuple[int, str, Tuple[Any, ...], Tuple[Any, ...]]] = []
        self._wait: Optional[Tuple[int, int]] = None
        self.acked: Optional[List[Any]] = None

    def script(self, name: str, keys: Tuple[str, ...], args: Tuple[Any, ...]) -> None:
        self._entries.append((self._executor.slot_of(keys[0]), name, tuple(keys), tuple(args)))

    def command(self, *args: Any) -> None:
        if len(args) > 1:
            slot = self._executor.slot_of(args[1])
        elif self._entries:
            slot = self._entries[-1][0]
        else:
            slot = 0
        self._entries.append((slot, "", (), tuple(args)))

    def __len__(self) -> int:
        return len(self._entries)

    def execute(self, raise_on_error: bool = True) -> List[Any]:
        replies: List[Any] = [None] * len(self._entries)
        if self._wait is not None:
            self.acked = [0] * len(self._entries)
        todo = list(range(len(self._entries)))
        for round_ in range(_BATCH_ROUNDS):
            groups: Dict[str, Tuple[Any, List[int]]] = {}
            for i in todo:
                node = self._executor.master(self._entries[i][0])
                groups.setdefault(node.name, (node, []))[1].append(i)
            todo = []
            last = round_ == _BATCH_ROUNDS - 1
            for node, indexes in groups.values():
                for i, reply in zip(indexes, self._send(node, indexes, last)):
                    replies[i] = reply
                    if isinstance(reply, MovedError):
                        self._executor.moved(reply)
                        todo.append(i)
                    elif isinstance(reply, (AskError, TryAgainError, NoScriptError)):
                        todo.append(i)  # a slot being migrated, or a node that lost its scripts
            if not todo:
                break
            time.sleep(FIRST_PAUSE * (round_ + 1))
        if raise_on_error:
            for reply in replies:
                if isinstance(reply, Exception):
                    raise reply
        return replies

    def _send(self, node: Any, indexes: List[int], bodies: bool = False) -> List[Any]:
        """One pipeline to ``node``: scripts as bare EVALSHA, with no SCRIPT EXISTS round trip
        first. A script not known to be loaded on that node goes first in the same pipeline as
        SCRIPT LOAD (Redis runs a pipeline in order), so a node that never ran it (a new node, a
        promoted replica: the script cache is not replicated) costs no round trip more. An
        entry answered NOSCRIPT anyway (SCRIPT FLUSH) goes again in the next round, which loads
        it; the last round (``bodies``) sends each script's body (EVAL), which cannot answer
        NOSCRIPT however often the scripts are flushed. A connection failure is every entry's
        reply."""
        client = self._client_for(node)
        pipe = client.pipeline(transaction=False)
        scripts = self._executor.scripts
        loaded = self._executor.loaded.setdefault(node.name, set())
        loads = [] if bodies else sorted({self._entries[i][1] for i in indexes} - loaded - {""})
        for name in loads:
            pipe.execute_command("SCRIPT", "LOAD", scripts[name].script)
        for i in indexes:
            _, name, keys, args = self._entries[i]
            if name and bodies:
                pipe.execute_command("EVAL", scripts[name].script, len(keys), *keys, *args)
            elif name:
                pipe.execute_command("EVALSHA", scripts[name].sha, len(keys), *keys, *args)
            else:
                pipe.execute_command(*args)
        if self._wait is not None:
            pipe.execute_command("WAIT", *self._wait)  # this node's replicas, for its entries
        try:
            raw = pipe.execute(raise_on_error=False)
        except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError) as exc:
            self._executor.refresh()
            return [exc] * len(indexes)
        if self._wait is not None:
            acked = raw.pop()
            for i in indexes:
                self.acked[i] = acked  # type: ignore[index]
        loaded.update(name for name, reply in zip(loads, raw) if not isinstance(reply, Exception))
        replies = []
        for i, reply in zip(indexes, raw[len(loads):]):
            name = self._entries[i][1]
            if name and isinstance(reply, NoScriptError):
                loaded.discard(name)
            elif name and isinstance(reply, redis.exceptions.ResponseError):
                reply = located(name, reply)
            replies.append(reply)
        return replies

