"""A private Redis Cluster for the benchmarks: 3 masters and 3 replicas on free 127.0.0.1 ports.

``LocalCluster()`` starts six ``redis-server --cluster-enabled yes`` processes (each through
``distlock.testing.server.RedisServer``: no persistence, loopback only, a temporary directory), joins
them with ``redis-cli --cluster create ... --cluster-replicas 1 --cluster-yes``, and waits
until every node says ``cluster_state:ok``, every node reports the same slot map (CLUSTER
SLOTS) and every replica's link to its master is up (so that no full resync forks a server in
the middle of a measurement). ``stop()`` ends every node and removes the directories, also
when the start failed half-way; it is a context manager.

Each node gets its cluster bus port explicitly (``--cluster-port``, Redis 7.0+), so a free
port near the top of the range never makes the default bus port (port + 10000) invalid.

The benchmarks must not import the tests, so this is a compact starter of their own; it
never touches a server it did not start.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from typing import Any, Dict, List, Optional, Tuple

import redis

from benchmarks._internals import RedisServer, free_port, redis_server_binary

__all__ = ["LocalCluster", "slot_map"]

Node = Tuple[str, int]


def _cli_binary(server_binary: str) -> str:
    """``redis-cli`` from PATH (it creates a Valkey cluster too), else ``valkey-cli``."""
    for name in ("redis-cli", "valkey-cli"):
        found = shutil.which(name)
        if found:
            return found
    raise FileNotFoundError("redis-cli is not on PATH: it creates the cluster")


def slot_map(client: redis.Redis[Any]) -> List[Tuple[int, int, Node, Tuple[Node, ...]]]:
    """One node's CLUSTER SLOTS, normalised: (first slot, last slot, master, replicas), sorted."""
    out = []
    for entry in client.execute_command("CLUSTER SLOTS"):
        start, end, master, *replicas = entry
        node = (_text(master[0]), int(master[1]))
        reps = tuple(sorted((_text(r[0]), int(r[1])) for r in replicas))
        out.append((int(start), int(end), node, reps))
    return sorted(out)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class LocalCluster:
    """``masters`` masters with ``replicas`` replicas each, on free loopback ports."""

    def __init__(self, masters: int = 3, replicas: int = 1, node_timeout_ms: int = 2000,
                 timeout: float = 60.0) -> None:
        binary = redis_server_binary()
        if binary is None:
            raise FileNotFoundError("redis-server is not on PATH")
        self.binary = binary
        self.masters_wanted = masters
        self.replicas = replicas
        self.dir = tempfile.mkdtemp(prefix="distlock-cluster-")
        self.servers: List[RedisServer] = []
        self._clients: Dict[int, redis.Redis[Any]] = {}
        try:
            for _ in range(masters * (1 + replicas)):
                port, bus = free_port(), free_port()
                while bus == port:
                    bus = free_port()
                self.servers.append(RedisServer(port=port, binary=binary, extra_args=[
                    "--cluster-enabled", "yes",
                    "--cluster-config-file", f"{self.dir}/nodes-{port}.conf",
                    "--cluster-node-timeout", str(node_timeout_ms),
                    "--cluster-port", str(bus),
                    # a replica's first sync starts at once, not 5 s later
                    "--repl-diskless-sync-delay", "0",
                ]))
            self._create(timeout)
            self._wait_ready(timeout)
        except BaseException:
            self.stop()
            raise

    # --- start ----------------------------------------------------------------------------------

    @property
    def ports(self) -> List[int]:
        return [s.port for s in self.servers]

    def node(self, port: int) -> redis.Redis[Any]:
        """A plain client of one node (for INFO, CLUSTER SLOTS, SCAN); one per node, kept."""
        found = self._clients.get(port)
        if found is None:
            found = self._clients[port] = redis.Redis(host="127.0.0.1", port=port, socket_timeout=10.0)
        return found

    def _create(self, timeout: float) -> None:
        cmd = [_cli_binary(self.binary), "--cluster", "create",
               *(f"127.0.0.1:{p}" for p in self.ports),
               "--cluster-replicas", str(self.replicas), "--cluster-yes"]
        proc = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                              timeout=timeout)
        if proc.returncode != 0:
            raise RuntimeError(f"redis-cli --cluster create failed ({proc.returncode}): "
                               f"{(proc.stdout + proc.stderr)[-2000:]}")

    def _problem(self) -> Optional[str]:
        """Why the cluster is not ready yet, or None when it is."""
        maps = []
        for port in self.ports:
            node = self.node(port)
            info = node.execute_command("CLUSTER INFO")  # parsed into a dict by redis-py
            state = info.get("cluster_state") if isinstance(info, dict) else None
            if state is None:
                state = "ok" if "cluster_state:ok" in _text(info) else "?"
            if state != "ok":
                return f"node {port}: cluster_state not ok"
            maps.append(slot_map(node))
        if any(m != maps[0] for m in maps):
            return "the nodes disagree on CLUSTER SLOTS"
        masters = maps[0]
        if len({m[2] for m in masters}) != self.masters_wanted:
            return f"{len({m[2] for m in masters})} masters serve slots"
        if sum(end - start + 1 for start, end, _, _ in masters) != 16384:
            return "not every slot is served"
        replicas = {r for m in masters for r in m[3]}
        if len(replicas) != self.masters_wanted * self.replicas:
            return f"{len(replicas)} replicas in the slot map"
        for _, port in replicas:
            rep = self.node(port).info("replication")
            if rep.get("master_link_status") != "up" or rep.get("master_sync_in_progress"):
                return f"replica {port}: link to its master not up"
        return None

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        problem: Optional[str] = "not asked yet"
        while time.monotonic() < deadline:
            try:
                problem = self._problem()
            except redis.RedisError as exc:
                problem = repr(exc)
            if problem is None:
                return
            time.sleep(0.1)
        raise TimeoutError(f"the cluster was not ready within {timeout:g} s: {problem}")

    # --- use ------------------------------------------------------------------------------------

    def slots(self) -> List[Tuple[int, int, Node, Tuple[Node, ...]]]:
        return slot_map(self.node(self.ports[0]))

    def master_ports(self) -> List[int]:
        """The masters' ports, in the order of their first slot."""
        seen: List[int] = []
        for _, _, (_, port), _ in self.slots():
            if port not in seen:
                seen.append(port)
        return seen

    def client(self, **kwargs: Any) -> redis.RedisCluster:
        """A ``redis.RedisCluster`` started from the first node."""
        return redis.RedisCluster(host="127.0.0.1", port=self.ports[0], **kwargs)

    def pids(self) -> List[int]:
        return [s.proc.pid for s in self.servers if s.proc is not None]

    # --- stop -----------------------------------------------------------------------------------

    def stop(self) -> None:
        for client in self._clients.values():
            try:
                client.close()
            except Exception:  # noqa: BLE001 - going away
                pass
        self._clients.clear()
        for server in self.servers:
            try:
                server.stop()
            except Exception:  # noqa: BLE001 - stop the others all the same
                if server.proc is not None and server.proc.poll() is None:
                    server.proc.kill()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> LocalCluster:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
