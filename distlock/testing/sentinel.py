"""A real Sentinel set for the tests: one master, two replicas and three sentinels on free
127.0.0.1 ports.

``SentinelSet.start()`` starts three server processes (``redis-server`` from PATH, or the
binary that ``$DISTLOCK_SERVER_BIN`` names: a ``valkey-server``, say), no persistence, the
second and third with ``--replicaof`` the first, then three sentinels from the same binary
(``<binary> sentinel.conf --sentinel``; each has a config file of its own, in its own
temporary directory, which the sentinel rewrites) that monitor the master as service
``distlock`` with quorum 2, ``down-after-milliseconds`` 1000 and ``failover-timeout`` 2000, so
a failover takes a few seconds. It waits until the set is whole (``whole``): both replicas
online at the master, and every sentinel naming the same master, both replicas (not down)
and both other sentinels. ``close()`` ends every process and removes the directories; so does
an ``atexit`` hook, and on Linux each process runs under ``setpriv --pdeathsig KILL`` (see
distlock/testing/cluster.py), so nothing outlives the test process.

Faults, for the tests of what a failover does to holds:

- ``kill_master()`` SIGKILLs the current master and waits until the sentinels have promoted
  one of its replicas (every sentinel names it, and it says ROLE master); it returns
  (old master, new master).
- ``cut_replicas()`` SIGSTOPs the replicas, then cuts their links on the master's side
  (``CLIENT KILL TYPE replica``): they cannot reconnect while stopped, so nothing the master
  does reaches them until ``resume_replicas()`` SIGCONTs them (and by then the test has killed
  the master). Killing the links from the replicas' side (``CLIENT KILL TYPE master``) first
  and stopping them after is a race: a replica's cron reconnects within a second, and a
  partial resync takes milliseconds.
- ``pause(addr)`` SIGSTOPs one node (a master paused past ``DOWN_AFTER_MS`` is failed over,
  and continued, is a master with clients until the sentinels demote it);
  ``restart_master()`` kills the master and starts it again at once, empty, on its port.
- ``heal()`` (the ``healthy_sentinel`` fixture) resumes what was stopped, restarts every
  node that is down as a replica of the current master, waits until the set is whole again
  and flushes it. The master may have moved: tests ask ``master_addr()``.

Only processes this module started are ever signalled.
"""

from __future__ import annotations

import atexit
import os
import signal
import time
from typing import Any, Dict, List, Optional, Set, Tuple

import redis
import redis.asyncio.sentinel
import redis.sentinel
from redis.backoff import NoBackoff
from redis.retry import Retry

from ._nodes import HOST, POLL, Addr, Node, free_ports, ping, stop_all, text, wait_settled
from .server import redis_server_binary

__all__ = ["SentinelSet", "SERVICE", "DOWN_AFTER_MS", "FAILOVER_TIMEOUT_MS"]

#: The service name the sentinels monitor.
SERVICE = "distlock"
DOWN_AFTER_MS = 1000
FAILOVER_TIMEOUT_MS = 2000
QUORUM = 2


class _DataNode(Node):
    """A master or replica of the set (``replicaof``: its master when it starts as a replica)."""

    def __init__(self, binary: str, port: int) -> None:
        super().__init__(binary, port, 0, prefix="distlock-sentinel")
        self.replicaof: Optional[Addr] = None

    def args(self) -> List[str]:
        args = [
            self.binary, "--port", str(self.port), "--bind", HOST,
            # a replica's (diskless) sync starts at once, and replicas report their offsets
            # every second
            "--repl-diskless-sync-delay", "0", "--repl-ping-replica-period", "1",
            "--save", "", "--appendonly", "no", "--dir", self.dir,
            "--daemonize", "no", "--protected-mode", "yes",
            "--loglevel", "notice", "--logfile", self.logfile,
        ]
        if self.replicaof is not None:
            args += ["--replicaof", self.replicaof[0], str(self.replicaof[1])]
        return args


class _SentinelNode(Node):
    """A sentinel: ``<binary> <dir>/sentinel.conf --sentinel``; the file is written once, at the
    first start (the sentinel rewrites it as it learns the set)."""

    def __init__(self, binary: str, port: int, master: Addr) -> None:
        super().__init__(binary, port, 0, prefix="distlock-sentinel")
        self.conf = os.path.join(self.dir, "sentinel.conf")
        with open(self.conf, "w", encoding="utf-8") as fh:
            fh.write("\n".join([
                f"port {port}", f"bind {HOST}", "daemonize no", f"dir {self.dir}",
                f"logfile {self.logfile}", "loglevel notice",
                f"sentinel monitor {SERVICE} {master[0]} {master[1]} {QUORUM}",
                f"sentinel down-after-milliseconds {SERVICE} {DOWN_AFTER_MS}",
                f"sentinel failover-timeout {SERVICE} {FAILOVER_TIMEOUT_MS}",
                f"sentinel parallel-syncs {SERVICE} 2", "",
            ]))

    def args(self) -> List[str]:
        return [self.binary, self.conf, "--sentinel"]


#: Every set not yet closed, for the atexit hook.
_OPEN: Set[SentinelSet] = set()


@atexit.register
def _close_all() -> None:
    for made in list(_OPEN):
        made.close()


def _fields(reply: Any) -> Dict[str, str]:
    """A sentinel's flat [name, value, ...] (or RESP3 map) reply as a dict of str."""
    if isinstance(reply, dict):
        return {text(k): text(v) for k, v in reply.items()}
    return {text(reply[i]): text(reply[i + 1]) for i in range(0, len(reply) - 1, 2)}


class SentinelSet:
    """One master, two replicas, three sentinels (see the module's docstring)."""

    REPLICAS = 2
    SENTINELS = 3

    def __init__(self, binary: str) -> None:
        self.binary = binary
        self.nodes: List[_DataNode] = []
        self.sentinels: List[_SentinelNode] = []
        self._conns: Dict[Addr, Any] = {}  # redis.Redis, whose execute_command is untyped
        self._stopped: List[_DataNode] = []
        self._clients: List[Any] = []
        self._closed = False
        #: how long ``start()`` took, in seconds
        self.boot_time = 0.0
        _OPEN.add(self)

    # --- start and stop ----------------------------------------------------------------------

    @classmethod
    def start(cls, binary: Optional[str] = None, timeout: float = 60.0) -> SentinelSet:
        found = binary or redis_server_binary()
        if found is None:
            raise FileNotFoundError("no redis-server on PATH (nor $DISTLOCK_SERVER_BIN)")
        made = cls(found)
        try:
            made._boot(timeout)
        except BaseException:
            made.close()
            raise
        return made

    def _boot(self, timeout: float) -> None:
        began = time.monotonic()
        ports = free_ports(1 + self.REPLICAS + self.SENTINELS)
        self.nodes = [_DataNode(self.binary, port) for port in ports[:1 + self.REPLICAS]]
        master = self.nodes[0].addr
        for node in self.nodes[1:]:
            node.replicaof = master
        self.sentinels = [_SentinelNode(self.binary, port, master)
                          for port in ports[1 + self.REPLICAS:]]
        for started in [*self.nodes, *self.sentinels]:
            started.spawn()
        self._wait_up([*self.nodes, *self.sentinels], min(timeout, 15.0))
        self.wait_whole(timeout)
        self.boot_time = time.monotonic() - began

    def _wait_up(self, nodes: List[Any], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        waiting = list(nodes)
        while waiting:
            for node in list(waiting):
                if ping(node.addr):
                    waiting.remove(node)
                elif not node.alive():
                    raise RuntimeError(f"{self.binary} on port {node.port} exited with "
                                       f"{node.proc.returncode if node.proc else '?'}: {node.log_tail()}")
            if waiting and time.monotonic() > deadline:
                raise TimeoutError(f"{[n.port for n in waiting]} did not answer PING within "
                                   f"{timeout:g} s\n{self.logs()}")
            time.sleep(POLL)

    def close(self) -> None:
        """Stop every process (SIGTERM, then SIGKILL after 5 s) and remove the directories;
        idempotent."""
        if self._closed:
            return
        self._closed = True
        _OPEN.discard(self)
        for made in self._clients:
            try:
                close_sentinel(made)
            except Exception:  # noqa: BLE001 - going away
                pass
        self._clients.clear()
        for conn in self._conns.values():
            conn.close()
        self._conns.clear()
        for node in self._stopped:
            self._signal(node, signal.SIGCONT)
        stop_all([*self.sentinels, *self.nodes])

    def __enter__(self) -> SentinelSet:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"<SentinelSet nodes={[n.port for n in self.nodes]} "
                f"sentinels={[s.port for s in self.sentinels]}{' closed' if self._closed else ''}>")

    # --- addresses and clients ---------------------------------------------------------------

    @property
    def sentinel_addrs(self) -> List[Addr]:
        return [s.addr for s in self.sentinels]

    @property
    def url(self) -> str:
        """``redis+sentinel://127.0.0.1:<p1>,127.0.0.1:<p2>,127.0.0.1:<p3>/distlock``."""
        return "redis+sentinel://" + ",".join(f"{h}:{p}" for h, p in self.sentinel_addrs) + f"/{SERVICE}"

    def _sentinel_kwargs(self) -> Dict[str, Any]:
        return {"socket_timeout": 1.0, "socket_connect_timeout": 1.0}

    def client(self, **kwargs: Any) -> redis.Redis:
        """A new master client: ``Sentinel(<the three>).master_for("distlock", **kwargs)`` (its
        Sentinel is closed with the set; the caller closes the client)."""
        manager = redis.sentinel.Sentinel(  # type: ignore[no-untyped-call,unused-ignore]
            self.sentinel_addrs, sentinel_kwargs=self._sentinel_kwargs())
        self._clients.append(manager)
        kwargs.setdefault("socket_timeout", 5.0)
        return manager.master_for(SERVICE, **kwargs)  # type: ignore[no-any-return,no-untyped-call,unused-ignore]

    def aclient(self, **kwargs: Any) -> Any:
        """``client``'s asyncio twin (``redis.asyncio.sentinel``); it connects on first use, in
        the loop that uses it."""
        manager = redis.asyncio.sentinel.Sentinel(  # type: ignore[no-untyped-call,unused-ignore]
            self.sentinel_addrs, sentinel_kwargs=self._sentinel_kwargs())
        kwargs.setdefault("socket_timeout", 5.0)
        return manager.master_for(SERVICE, **kwargs)

    def _conn(self, addr: Addr) -> Any:
        """This module's own client of one process (kept; no retries, short timeouts)."""
        conn = self._conns.get(addr)
        if conn is None:
            conn = self._conns[addr] = redis.Redis(
                host=addr[0], port=addr[1], socket_timeout=2.0, socket_connect_timeout=1.0,
                retry=Retry(NoBackoff(), 0))
        return conn

    def node_client(self, addr: Addr) -> redis.Redis:
        """A plain client of one data node (no Sentinel), bytes replies; the caller closes it."""
        return redis.Redis(host=addr[0], port=addr[1], socket_timeout=5.0,
                           socket_connect_timeout=2.0, retry=Retry(NoBackoff(), 0))

    def _node(self, addr: Addr) -> _DataNode:
        for node in self.nodes:
            if node.addr == tuple(addr):
                return node
        raise KeyError(f"{addr} is not a node of {self!r}")

    # --- what the set looks like ---------------------------------------------------------------

    def _sentinel_master(self, sentinel: _SentinelNode) -> Addr:
        host, port = self._conn(sentinel.addr).execute_command(
            "SENTINEL", "GET-MASTER-ADDR-BY-NAME", SERVICE)
        return (text(host), int(port))

    def master_addr(self) -> Addr:
        """The master as the first sentinel that answers names it."""
        error: Optional[Exception] = None
        for sentinel in self.sentinels:
            try:
                return self._sentinel_master(sentinel)
            except (redis.RedisError, TypeError) as exc:
                error = exc
        raise RuntimeError(f"no sentinel of {self!r} names a master: {error!r}")

    def replica_addrs(self) -> List[Addr]:
        master = self.master_addr()
        return [n.addr for n in self.nodes if n.addr != master]

    def role(self, addr: Addr) -> str:
        """``ROLE`` of one node. A node that changes role closes its clients' connections
        (this module's own among them): the question then goes once more, on a new one."""
        try:
            return text(self._conn(addr).execute_command("ROLE")[0])
        except redis.ConnectionError:
            stale = self._conns.pop(addr, None)
            if stale is not None:
                stale.close()
            return text(self._conn(addr).execute_command("ROLE")[0])

    def _problem(self) -> Optional[str]:
        """Why the set is not whole now (None when it is): see the module's docstring."""
        try:
            masters = {self._sentinel_master(s) for s in self.sentinels}
        except (redis.RedisError, TypeError) as exc:
            return f"a sentinel does not name the master: {exc!r}"
        if len(masters) != 1:
            return f"the sentinels name different masters: {masters}"
        master = masters.pop()
        try:
            if self.role(master) != "master":
                return f"{master} is not a master yet"
            info = self._conn(master).info("replication")
        except redis.RedisError as exc:
            return f"master {master}: {exc!r}"
        online = [v for k, v in info.items() if k.startswith("slave") and isinstance(v, dict)
                  and v.get("state") == "online"]
        if len(online) != self.REPLICAS:
            return f"master {master} has {len(online)} replicas online"
        for sentinel in self.sentinels:
            conn = self._conn(sentinel.addr)
            try:
                state = _fields(conn.execute_command("SENTINEL", "MASTER", SERVICE))
                replicas = [_fields(r) for r in conn.execute_command("SENTINEL", "REPLICAS", SERVICE)]
            except redis.RedisError as exc:
                return f"sentinel {sentinel.port}: {exc!r}"
            if int(state.get("num-other-sentinels", 0)) != self.SENTINELS - 1:
                return f"sentinel {sentinel.port} knows {state.get('num-other-sentinels')} other sentinels"
            if "down" in state.get("flags", "") or "failover" in state.get("flags", ""):
                return f"sentinel {sentinel.port} flags the master {state.get('flags')}"
            up = [r for r in replicas if "down" not in r.get("flags", "")
                  and r.get("master-link-status") == "ok"
                  and (r.get("ip"), int(r.get("port", 0))) != master]
            if len(up) != self.REPLICAS:
                return f"sentinel {sentinel.port} sees {len(up)} replicas up"
        return None

    def wait_whole(self, timeout: float = 60.0) -> None:
        """Wait until the set is whole (see ``_problem``); TimeoutError with the logs' tails."""
        wait_settled(self.logs, "the sentinel set is not whole", timeout, self._problem)

    def wait_replicas(self, timeout: float = 60.0) -> Addr:
        """Wait until the master the sentinels name has every replica online by its own
        ``INFO replication`` (what a grant with ``min_replicas`` waits for; the sentinels' own
        view may lag by their 10 s refresh, see ``wait_whole``); return it."""
        found: List[Addr] = []

        def problem() -> Optional[str]:
            found.clear()
            try:
                master = self.master_addr()
                info = self._conn(master).info("replication")
            except (redis.RedisError, RuntimeError) as exc:
                return f"no master to ask: {exc!r}"
            online = [v for k, v in info.items() if k.startswith("slave") and isinstance(v, dict)
                      and v.get("state") == "online"]
            if info.get("role") != "master" or len(online) != self.REPLICAS:
                return f"{master} is {info.get('role')} with {len(online)} replicas online"
            found.append(master)
            return None

        wait_settled(self.logs, "every replica online", timeout, problem)
        return found[0]

    def down(self) -> List[Addr]:
        return [n.addr for n in self.nodes if not n.alive()]

    # --- faults --------------------------------------------------------------------------------

    def kill_master(self, timeout: float = 60.0) -> Tuple[Addr, Addr]:
        """SIGKILL the master; wait until every sentinel names one of its replicas, which says
        ROLE master; return (old master, new master)."""
        old = self.master_addr()
        self.kill(old)
        return old, self.wait_promotion(old, timeout)

    def kill(self, addr: Addr) -> None:
        node = self._node(addr)
        node.kill()
        conn = self._conns.pop(node.addr, None)
        if conn is not None:
            conn.close()

    def wait_promotion(self, old: Addr, timeout: float = 60.0) -> Addr:
        """Wait until every sentinel names a master other than ``old`` and it says ROLE master."""
        found: List[Addr] = []

        def problem() -> Optional[str]:
            found.clear()
            try:
                masters = {self._sentinel_master(s) for s in self.sentinels}
            except (redis.RedisError, TypeError) as exc:
                return f"a sentinel does not answer: {exc!r}"
            if len(masters) != 1 or old in masters:
                return f"the sentinels name {masters}"
            new = masters.pop()
            try:
                if self.role(new) != "master":
                    return f"{new} is not master yet"
            except redis.RedisError as exc:
                return f"{new}: {exc!r}"
            found.append(new)
            return None

        wait_settled(self.logs, f"promotion of a replica of {old}", timeout, problem)
        return found[0]

    def cut_replicas(self) -> None:
        """Cut every replica's link to the master and SIGSTOP the replicas (see the module's
        docstring). The master then counts no replica: ``connected_slaves:0``."""
        master = self.master_addr()
        replicas = [n for n in self.nodes if n.addr != master and n.alive()]
        # Stopped first, then cut from the master's side: a replica that is running reconnects
        # by itself (its cron tries every second, and a partial resync takes milliseconds), so
        # killing its link and then stopping it is a race on a loaded machine; a stopped one
        # cannot reconnect, and the master, which dropped it, streams nothing more to it.
        for node in replicas:
            self._signal(node, signal.SIGSTOP)
            self._stopped.append(node)
        self._conn(master).execute_command("CLIENT", "KILL", "TYPE", "replica")
        deadline = time.monotonic() + 10.0
        while (info := self._conn(master).info("replication")).get("connected_slaves", 0) != 0:
            assert time.monotonic() < deadline, f"the master still counts replicas after the cut: {info}"
            time.sleep(POLL)

    def resume_replicas(self) -> None:
        """SIGCONT every replica ``cut_replicas`` stopped (and every node ``pause`` stopped)."""
        stopped, self._stopped = self._stopped, []
        for node in stopped:
            self._signal(node, signal.SIGCONT)

    def pause(self, addr: Addr) -> None:
        """SIGSTOP one data node: its clients' connections stay open, and nothing answers on
        them, as on the far side of a partition; ``resume_replicas`` (or ``close``) continues it.
        The master paused past ``DOWN_AFTER_MS``: the sentinels promote a replica, and the old
        master, continued, is a master with clients until they demote it."""
        node = self._node(addr)
        self._signal(node, signal.SIGSTOP)
        self._stopped.append(node)

    def restart_master(self, timeout: float = 15.0) -> Addr:
        """SIGKILL the master and start it again at once on its port, empty (no persistence),
        as a master: back within ``DOWN_AFTER_MS``, no failover; its replicas then resync from
        it, and so lose every key too. Returns its address."""
        addr = self.master_addr()
        node = self._node(addr)
        self.kill(addr)
        node.replicaof = None
        node.spawn()
        self._wait_up([node], timeout)
        return addr

    @staticmethod
    def _signal(node: Node, sig: int) -> None:
        if node.proc is not None and node.proc.poll() is None:
            node.proc.send_signal(sig)

    def flush(self) -> None:
        """FLUSHALL on the master (it replicates)."""
        self._conn(self.master_addr()).execute_command("FLUSHALL")

    def heal(self, timeout: float = 60.0) -> None:
        """Make the set whole again after a test (see the module's docstring)."""
        self.resume_replicas()
        down = self.down()
        if down:
            master = self.master_addr()
            for addr in down:
                node = self._node(addr)
                node.replicaof = master
                node.spawn()
            self._wait_up([self._node(a) for a in down], 15.0)
        self.wait_whole(timeout)
        self.flush()

    # --- diagnostics -----------------------------------------------------------------------------

    def logs(self, chars: int = 1200) -> str:
        return "\n".join(f"--- {'sentinel' if isinstance(n, _SentinelNode) else 'node'} {n.port} "
                         f"({'running' if n.alive() else 'down'}):\n{n.log_tail(chars)}"
                         for n in [*self.nodes, *self.sentinels])


def close_sentinel(manager: Any) -> None:
    """Close a ``redis.sentinel.Sentinel``'s clients of its sentinels: its ``close()`` where
    redis-py has one; redis-py 7.0 (the newest on Python 3.9) has none, so one by one."""
    close = getattr(manager, "close", None)
    if close is not None:
        close()
        return
    for sentinel in manager.sentinels:
        sentinel.close()


async def aclose_sentinel(manager: Any) -> None:
    """``close_sentinel`` for ``redis.asyncio.sentinel.Sentinel`` (``aclose()``)."""
    aclose = getattr(manager, "aclose", None)
    if aclose is not None:
        await aclose()
        return
    for sentinel in manager.sentinels:
        await sentinel.aclose()
