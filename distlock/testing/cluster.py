"""A real Redis Cluster for tests: 3 masters and 3 replicas on free 127.0.0.1 ports.

``Cluster.start()`` starts six server processes at once (``redis-server`` from PATH, or the
binary that ``$DISTLOCK_SERVER_BIN`` names: a ``valkey-server``, say) with
``--cluster-enabled yes``, no persistence, a cluster node timeout of one second (so that a
failover takes a few seconds) and each node in a temporary directory of its own (its
``nodes.conf`` is there), joins them with ``redis-cli --cluster create ... --cluster-replicas 1
--cluster-yes``, and waits until every node says ``cluster_state:ok``, every node reports the
same slot map (CLUSTER SLOTS) and every replica is attached (its link up, listed under its
master). ``close()`` ends every node and removes the directories; so does an ``atexit`` hook
for a cluster still open when the interpreter exits, and on Linux each node is started under
``setpriv --pdeathsig KILL``, so that it dies with the test process even when that is killed.

Faults and topology changes, for the tests of what they do to holds:

- ``kill(addr)`` SIGKILLs a node; ``wait_failover(old_master)`` waits until one of its replicas
  has taken over; ``restart(addr)`` starts the node again on its port, directory and
  ``nodes.conf``, so that it rejoins with its node id (an ex-master comes back as a replica of
  the node that took its slots over).
- ``reshard_slot(slot, to)`` moves one slot with its keys, as ``redis-cli`` does it (IMPORTING,
  MIGRATING, MIGRATE in batches, SETSLOT NODE everywhere); ``reshard_with_cli`` has
  ``redis-cli --cluster reshard`` move N slots; ``setslot_bare(slot, to)`` reassigns a slot
  without its keys.
- ``pause(addr)`` SIGSTOPs a node and ``resume()`` continues it (a master paused past the node
  timeout is failed over: ``wait_promoted`` asks only its replicas).
- ``heal()`` (the ``healthy_cluster`` fixture) restarts what was killed, settles slots left
  half-migrated, waits until the cluster is whole again and flushes it.

Node ports are picked free, with the cluster bus port given explicitly (``--cluster-port``,
Redis 7.0+ and Valkey), so a port near the top of the range never makes the default bus port
(port + 10000) invalid. Only processes this module started are ever signalled.
"""

from __future__ import annotations

import atexit
import signal
import subprocess
import threading
import time
from typing import Any, Dict, List, Optional, Sequence, Set

import redis
import redis.asyncio
import redis.asyncio.cluster
from redis.backoff import NoBackoff
from redis.cluster import ClusterNode
from redis.retry import Retry

from ._nodes import HOST, POLL, Addr, Node, free_ports, ping, stop_all, text, wait_settled
from ._slots import SLOTS, SlotMoves, SlotRange, _ClusterNode, cluster_cli, slot_map
from .server import redis_server_binary

__all__ = ["Addr", "Cluster", "cluster_cli", "slot_map", "SLOTS"]

#: Every cluster not yet closed, for the atexit hook.
_OPEN: Set[Cluster] = set()
_OPEN_LOCK = threading.Lock()


@atexit.register
def _close_all() -> None:
    with _OPEN_LOCK:
        clusters = list(_OPEN)
    for cluster in clusters:
        cluster.close()


class Cluster(SlotMoves):
    """A Redis Cluster of 3 masters with 1 replica each, on 127.0.0.1 (see the module's
    docstring). Make one with ``Cluster.start()``; it is a context manager."""

    MASTERS = 3
    REPLICAS = 1

    def __init__(self, binary: str, cli: str) -> None:
        self.binary = binary
        self.cli = cli
        self._nodes: List[Node] = []
        self._conns: Dict[Addr, Any] = {}  # redis.Redis, whose execute_command is untyped
        self._replicas_at_kill: Dict[Addr, List[Addr]] = {}
        self._paused: List[Node] = []  # stopped by ``pause``, continued by ``resume``
        self._url_port = 0
        self._closed = False
        self._cli_output = ""
        #: How long the phases of ``start()`` took, in seconds: "spawn" (all six answer PING),
        #: "create" (redis-cli), "agree" (whole and in agreement) and "total".
        self.timings: Dict[str, float] = {}
        with _OPEN_LOCK:
            _OPEN.add(self)

    # --- start and stop ----------------------------------------------------------------------

    @classmethod
    def start(cls, binary: Optional[str] = None, timeout: float = 60.0) -> Cluster:
        """Start the six nodes (in parallel), create the cluster with ``redis-cli --cluster
        create`` and wait until it is whole (``wait_agreement``); ``binary`` defaults to
        ``redis_server_binary()``. Everything started is stopped again if this fails."""
        found = binary or redis_server_binary()
        if found is None:
            raise FileNotFoundError("no redis-server on PATH (nor $DISTLOCK_SERVER_BIN)")
        cli = cluster_cli()
        if cli is None:
            raise FileNotFoundError("no redis-cli on PATH: it creates the cluster")
        cluster = cls(found, cli)
        try:
            cluster._boot(timeout)
        except BaseException:
            cluster.close()
            raise
        return cluster

    def _boot(self, timeout: float) -> None:
        began = time.monotonic()
        count = self.MASTERS * (1 + self.REPLICAS)
        ports = free_ports(2 * count)
        self._nodes = [_ClusterNode(self.binary, ports[2 * i], ports[2 * i + 1]) for i in range(count)]
        for node in self._nodes:
            node.spawn()
        self._wait_pings(self._nodes, min(timeout, 15.0), retries=3)
        spawned = time.monotonic()
        cmd = [self.cli, "--cluster", "create", *(f"{h}:{p}" for h, p in self.addrs),
               "--cluster-replicas", str(self.REPLICAS), "--cluster-yes"]
        self._run_cli(cmd, timeout)
        created = time.monotonic()
        self.wait_agreement(timeout)
        for node in self._nodes:
            node.id = text(self._conn(node.addr).execute_command("CLUSTER", "MYID"))
        self._url_port = self.masters()[0][1]
        done = time.monotonic()
        self.timings = {"spawn": spawned - began, "create": created - spawned,
                        "agree": done - created, "total": done - began}

    def _wait_pings(self, nodes: Sequence[Node], timeout: float, retries: int = 0) -> None:
        """Wait until every node answers PING (polled every 20 ms). A node that exits first
        (its port taken meanwhile, say) gets new ports and another start, ``retries`` times."""
        waiting = list(nodes)
        deadline = time.monotonic() + timeout
        while waiting:
            for node in list(waiting):
                if ping(node.addr):
                    waiting.remove(node)
                elif not node.alive():
                    tail = node.log_tail()
                    if retries <= 0:
                        raise RuntimeError(f"{self.binary} on port {node.port} exited with "
                                           f"{node.proc.returncode if node.proc else '?'}: {tail}")
                    retries -= 1
                    node.port, node.bus_port = free_ports(2)
                    node.spawn()
            if not waiting:
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"nodes {[n.port for n in waiting]} did not answer PING "
                                   f"within {timeout:g} s\n{self.logs()}")
            time.sleep(POLL)

    def _run_cli(self, cmd: List[str], timeout: float) -> str:
        try:
            proc = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                                  timeout=timeout)
        except subprocess.TimeoutExpired as exc:
            self._cli_output = text(exc.stdout or "") + text(exc.stderr or "")
            raise TimeoutError(f"{' '.join(cmd[:3])} did not end within {timeout:g} s\n"
                               f"{self.logs()}") from exc
        self._cli_output = proc.stdout + proc.stderr
        if proc.returncode != 0 or "[ERR]" in self._cli_output:
            raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{self.logs()}")
        return self._cli_output

    def close(self) -> None:
        """Stop every node (SIGTERM, then SIGKILL after 5 s) and remove their directories.
        Idempotent; also run at interpreter exit for a cluster still open."""
        if self._closed:
            return
        self._closed = True
        with _OPEN_LOCK:
            _OPEN.discard(self)
        for conn in self._conns.values():
            try:
                conn.close()
            except Exception:  # noqa: BLE001 - going away
                pass
        self._conns.clear()
        self.resume()  # a stopped node would take SIGTERM only once continued
        stop_all(self._nodes)

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<Cluster {[n.port for n in self._nodes]}{' closed' if self._closed else ''}>"

    # --- addresses and clients -----------------------------------------------------------------

    @property
    def addrs(self) -> List[Addr]:
        """Every node's address, masters and replicas, in the order they were started."""
        return [n.addr for n in self._nodes]

    @property
    def url(self) -> str:
        """``redis+cluster://127.0.0.1:<port>``, the port of the first master at start (any
        node serves as a startup node: it stays valid while that node runs)."""
        return f"redis+cluster://{HOST}:{self._url_port}"

    def pids(self) -> List[int]:
        """The process ids of the nodes that run now."""
        return [n.proc.pid for n in self._nodes if n.proc is not None and n.alive()]

    def down(self) -> List[Addr]:
        """The nodes whose process is not running (killed, or crashed)."""
        return [n.addr for n in self._nodes if not n.alive()]

    def _startup_nodes(self) -> List[Addr]:
        """Every node, the running ones first (a client tries them in order)."""
        return sorted(self.addrs, key=lambda a: not self._node(a).alive())

    def client(self, **kwargs: Any) -> redis.RedisCluster:
        """A new ``redis.RedisCluster`` with every node as a startup node (bytes replies unless
        ``decode_responses=True`` is given; other keyword arguments are passed through)."""
        kwargs.setdefault("decode_responses", False)
        if not {"host", "url", "startup_nodes"} & set(kwargs):
            kwargs["startup_nodes"] = [ClusterNode(h, p)  # type: ignore[no-untyped-call]
                                   for h, p in self._startup_nodes()]
        return redis.RedisCluster(**kwargs)

    def aclient(self, **kwargs: Any) -> redis.asyncio.RedisCluster:
        """``client``'s asyncio twin: a new ``redis.asyncio.RedisCluster`` (it connects on
        first use, in the loop that uses it)."""
        kwargs.setdefault("decode_responses", False)
        if not {"host", "url", "startup_nodes"} & set(kwargs):
            kwargs["startup_nodes"] = [redis.asyncio.cluster.ClusterNode(h, p)
                                       for h, p in self._startup_nodes()]
        return redis.asyncio.RedisCluster(**kwargs)

    def node_client(self, addr: Addr) -> redis.Redis:
        """A plain (not cluster) client of one node, bytes replies, commands bounded at 5 s;
        the caller closes it."""
        return redis.Redis(host=addr[0], port=addr[1], socket_timeout=5.0,
                           socket_connect_timeout=2.0, retry=Retry(NoBackoff(), 0))

    def _node(self, addr: Addr) -> Node:
        for node in self._nodes:
            if node.addr == tuple(addr):
                return node
        raise KeyError(f"{addr} is not a node of {self!r}")

    def _conn(self, addr: Addr) -> Any:
        """This module's own client of one node (kept; no retries, short timeouts)."""
        conn = self._conns.get(addr)
        if conn is None:
            conn = self._conns[addr] = redis.Redis(
                host=addr[0], port=addr[1], socket_timeout=2.0, socket_connect_timeout=1.0,
                retry=Retry(NoBackoff(), 0))
        return conn

    def _drop_conn(self, addr: Addr) -> None:
        conn = self._conns.pop(addr, None)
        if conn is not None:
            conn.close()

    def _ask(self, *args: Any) -> Any:
        """``args`` run on the first running node that answers (raw reply)."""
        error: Optional[Exception] = None
        for node in self._nodes:
            if node.alive():
                try:
                    return self._conn(node.addr).execute_command(*args)
                except redis.RedisError as exc:
                    error = exc
        raise RuntimeError(f"no node of {self!r} answers {args[:2]}: {error!r}")

    # --- topology --------------------------------------------------------------------------------

    def slots(self) -> List[SlotRange]:
        """The slot map (CLUSTER SLOTS) as the first running node sees it."""
        return slot_map(self._ask("CLUSTER", "SLOTS"))

    def _table(self) -> List[Dict[str, Any]]:
        """CLUSTER NODES of the first running node: id, addr, flags, master id."""
        rows = []
        for line in text(self._ask("CLUSTER", "NODES")).splitlines():
            fields = line.split()
            if len(fields) < 8:
                continue
            host, _, port = fields[1].split("@")[0].rpartition(":")
            rows.append({"id": fields[0], "addr": (host, int(port)),
                         "flags": set(fields[2].split(",")), "master": fields[3]})
        return rows

    def _order(self, addrs: Any) -> List[Addr]:
        index = {a: i for i, a in enumerate(self.addrs)}
        return sorted(addrs, key=lambda a: index.get(a, len(index)))

    def masters(self) -> List[Addr]:
        """The running masters, as the cluster sees them (CLUSTER NODES: neither failed nor
        suspected), in the order the nodes were started."""
        return self._order(
            row["addr"] for row in self._table()
            if "master" in row["flags"] and not {"fail", "fail?"} & row["flags"]
            and row["addr"] in self.addrs and self._node(row["addr"]).alive())

    def replicas_of(self, addr: Addr) -> List[Addr]:
        """The running replicas of master ``addr`` (CLUSTER NODES), in start order."""
        master_id = self.node_id(addr)
        return self._order(
            row["addr"] for row in self._table()
            if row["master"] == master_id and not {"fail", "fail?"} & row["flags"]
            and row["addr"] in self.addrs and self._node(row["addr"]).alive())

    def node_id(self, addr: Addr) -> str:
        """The cluster node id of ``addr`` (kept across restarts: it is in its nodes.conf)."""
        node = self._node(addr)
        if not node.id:
            node.id = text(self._conn(node.addr).execute_command("CLUSTER", "MYID"))
        return node.id

    def keyslot(self, key: Any) -> int:
        """CLUSTER KEYSLOT ``key``."""
        return int(self._ask("CLUSTER", "KEYSLOT", key))

    def slot_owner(self, slot: int) -> Addr:
        """The master that serves ``slot`` in the slot map (CLUSTER SLOTS)."""
        for start, end, master, _ in self.slots():
            if start <= slot <= end:
                return master
        raise LookupError(f"no node serves slot {slot}")

    def master_of_key(self, key: Any) -> Addr:
        """The master that serves ``key`` (CLUSTER KEYSLOT, then CLUSTER SLOTS)."""
        return self.slot_owner(self.keyslot(key))

    # --- waiting for the cluster ---------------------------------------------------------------

    def _problem(self, replicas: bool) -> Optional[str]:
        """Why the running nodes are not yet a whole, agreed cluster, or None. Always: each
        says cluster_state:ok, all report the same CLUSTER SLOTS, every slot is served by a
        running master, every replica's link is up and it is listed under its master. With
        ``replicas``, also: every master has a replica, every running node is listed and
        every listed node runs."""
        live = [n for n in self._nodes if n.alive()]
        if not live:
            return "no node runs"
        maps: Dict[Addr, List[SlotRange]] = {}
        roles: Dict[Addr, List[Any]] = {}
        for node in live:
            conn = self._conn(node.addr)
            try:
                info = text(conn.execute_command("CLUSTER", "INFO"))
                if "cluster_state:ok" not in info:
                    return f"{node.addr}: cluster_state is not ok"
                maps[node.addr] = slot_map(conn.execute_command("CLUSTER", "SLOTS"))
                roles[node.addr] = conn.execute_command("ROLE")
            except redis.RedisError as exc:
                return f"{node.addr}: {exc!r}"
        first = maps[live[0].addr]
        for addr, other in maps.items():
            if other != first:
                return f"the slot maps differ: {live[0].addr} sees {first}, {addr} sees {other}"
        if sum(end - start + 1 for start, end, _, _ in first) != SLOTS:
            return "not every slot is served"
        listed: Dict[Addr, Set[Addr]] = {}
        for _, _, master, reps in first:
            if not self._node(master).alive():
                return f"{master} serves slots but does not run"
            listed.setdefault(master, set()).update(reps)
        for addr, role in roles.items():
            if text(role[0]) == "slave":
                master = (text(role[1]), int(role[2]))
                if text(role[3]) != "connected":
                    return f"replica {addr}: its link to {master} is {text(role[3])}"
                if master in listed and addr not in listed[master]:
                    return f"replica {addr} is not yet listed under {master}"
            elif replicas and addr not in listed:
                return f"master {addr} serves no slot"
        if replicas:
            for master, under in listed.items():
                gone = [r for r in under if not self._node(r).alive()]
                if gone:
                    return f"replica {gone[0]} is still listed under {master} but does not run"
                if len(under) < self.REPLICAS:
                    return f"master {master} has no replica"
        return None

    def wait_agreement(self, timeout: float = 30.0, replicas: bool = True) -> None:
        """Wait until the running nodes are a whole cluster that agrees on its slot map (see
        ``_problem``; ``replicas=False`` when a master is down for good and its replica took
        over, leaving a master without replica); TimeoutError with the logs' tails if not."""
        wait_settled(self.logs, "the cluster is not whole and agreed", timeout,
                   lambda: self._problem(replicas))

    def wait_failover(self, old_master: Addr, timeout: float = 30.0) -> Addr:
        """Wait until one of ``old_master``'s replicas (as they were when it was killed) says
        ROLE master and the running nodes all say cluster_state:ok and agree on the slot map,
        with no slot left on ``old_master``; return that replica."""
        old = (old_master[0], int(old_master[1]))
        candidates = self._replicas_at_kill.get(old) or self.replicas_of(old)
        promoted: List[Addr] = []

        def problem() -> Optional[str]:
            promoted.clear()
            for addr in candidates:
                if self._node(addr).alive():
                    try:
                        if text(self._conn(addr).execute_command("ROLE")[0]) == "master":
                            promoted.append(addr)
                    except redis.RedisError:
                        pass
            if not promoted:
                return f"no replica of {old_master} ({candidates}) is master yet"
            return self._problem(replicas=False)

        wait_settled(self.logs, f"failover of {old_master}", timeout, problem)
        return promoted[0]

    # --- faults ----------------------------------------------------------------------------------

    def kill(self, addr: Addr) -> None:
        """SIGKILL node ``addr`` (its replicas are noted first, for ``wait_failover``)."""
        node = self._node(addr)
        try:
            self._replicas_at_kill[node.addr] = self.replicas_of(node.addr)
        except (RuntimeError, redis.RedisError):
            self._replicas_at_kill[node.addr] = []
        node.kill()
        self._drop_conn(node.addr)

    def restart(self, addr: Addr, timeout: float = 10.0) -> None:
        """Start node ``addr`` again (killing it first if it runs) on its port, directory and
        nodes.conf, and wait until it answers PING. It rejoins with its node id, empty (no
        persistence); an ex-master whose slots were taken over comes back as a replica of the
        node that took them. ``wait_agreement`` waits for that."""
        node = self._node(addr)
        node.kill()
        self._drop_conn(node.addr)
        node.spawn()
        self._wait_pings([node], timeout)

    def pause(self, addr: Addr) -> None:
        """SIGSTOP node ``addr``: its clients' connections stay open and nothing answers on
        them, as across a partition; ``resume`` continues it. A master paused past the node
        timeout is failed over (``wait_promoted``); continued, it learns the new epoch from
        its peers and turns replica of the node that took its slots."""
        node = self._node(addr)
        self._replicas_at_kill[node.addr] = self.replicas_of(node.addr)
        if node.proc is not None and node.proc.poll() is None:
            node.proc.send_signal(signal.SIGSTOP)
            self._paused.append(node)
        self._drop_conn(node.addr)

    def resume(self) -> None:
        """SIGCONT every node ``pause`` stopped."""
        paused, self._paused = self._paused, []
        for node in paused:
            if node.proc is not None and node.proc.poll() is None:
                node.proc.send_signal(signal.SIGCONT)

    def wait_promoted(self, old_master: Addr, timeout: float = 30.0) -> Addr:
        """Wait until one of ``old_master``'s replicas says ROLE master (asking only them:
        ``old_master`` may be paused); return it."""
        candidates = self._replicas_at_kill.get((old_master[0], int(old_master[1]))) or []
        promoted: List[Addr] = []

        def problem() -> Optional[str]:
            promoted.clear()
            for addr in candidates:
                try:
                    if text(self._conn(addr).execute_command("ROLE")[0]) == "master":
                        promoted.append(addr)
                except redis.RedisError:
                    self._drop_conn(addr)
            return None if promoted else f"no replica of {old_master} ({candidates}) is master yet"

        wait_settled(self.logs, f"promotion of a replica of {old_master}", timeout, problem)
        return promoted[0]

    def flush(self) -> None:
        """FLUSHALL on every running master (a node that is down or not a master is passed)."""
        for node in self._nodes:
            if not node.alive():
                continue
            conn = self._conn(node.addr)
            try:
                if text(conn.execute_command("ROLE")[0]) == "master":
                    conn.execute_command("FLUSHALL")
            except redis.RedisError:
                pass

    def heal(self, timeout: float = 30.0) -> None:
        """Make the cluster whole again after a test: restart every node that is down, settle
        every slot left IMPORTING or MIGRATING (CLUSTER SETSLOT STABLE), wait for agreement
        with every replica attached, and flush. An ex-master stays a replica."""
        for addr in self.down():
            self.restart(addr)
        for node in self._nodes:
            self._settle_open_slots(node)
        self.wait_agreement(timeout)
        self.flush()

    # --- diagnostics -----------------------------------------------------------------------------

    def logs(self, chars: int = 1200) -> str:
        """The tail of every node's log, and of the last redis-cli run, for error messages."""
        parts = [f"--- node {n.port} ({'running' if n.alive() else 'down'}):\n{n.log_tail(chars)}"
                 for n in self._nodes]
        if self._cli_output:
            parts.append(f"--- redis-cli:\n{self._cli_output[-chars:]}")
        return "\n".join(parts)
