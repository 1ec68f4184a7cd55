"""The slots of ``distlock.testing.cluster``: the cluster's node processes, its slot map, and how
slots move (``SlotMoves``, which ``Cluster`` inherits: a slot moved as ``redis-cli`` moves it,
by ``redis-cli --cluster reshard`` itself, or reassigned without its keys).
"""

from __future__ import annotations

import shutil
import time
from typing import Any, List, Optional, Sequence, Tuple

import redis

from ._nodes import HOST, Addr, Node, text

__all__ = ["SLOTS", "NODE_TIMEOUT_MS", "SlotRange", "SlotMoves", "cluster_cli", "slot_map"]

#: One row of a slot map: (first slot, last slot, master, replicas sorted).
SlotRange = Tuple[int, int, Addr, Tuple[Addr, ...]]

SLOTS = 16384
NODE_TIMEOUT_MS = 1000


def cluster_cli() -> Optional[str]:
    """``redis-cli`` from PATH (``valkey-cli`` where there is no redis-cli), else None."""
    return shutil.which("redis-cli") or shutil.which("valkey-cli")


def slot_map(reply: Sequence[Any]) -> List[SlotRange]:
    """A CLUSTER SLOTS reply, normalised and sorted: (first, last, master, replicas). Extra
    fields (node ids, Valkey's hostname metadata) are left out, so that maps compare."""
    rows = []
    for entry in reply:
        start, end, master, *replicas = entry
        reps = tuple(sorted((text(r[0]), int(r[1])) for r in replicas))
        rows.append((int(start), int(end), (text(master[0]), int(master[1])), reps))
    return sorted(rows)


class _ClusterNode(Node):
    """One server process of the cluster."""

    def __init__(self, binary: str, port: int, bus_port: int) -> None:
        super().__init__(binary, port, bus_port, prefix="distlock-cluster")

    def args(self) -> List[str]:
        return [
            self.binary, "--port", str(self.port), "--bind", HOST,
            "--cluster-enabled", "yes", "--cluster-port", str(self.bus_port),
            "--cluster-config-file", "nodes.conf",
            "--cluster-node-timeout", str(NODE_TIMEOUT_MS),
            # a replica may always take over (its data is never "too old" in a test), and
            # topology only changes when a test changes it: no replica moves to another master
            "--cluster-replica-validity-factor", "0",
            "--cluster-allow-replica-migration", "no",
            # a replica's (diskless) sync starts at once, not 5 s later; and it is listed in
            # CLUSTER SLOTS once its replication offset is not 0, which on an idle master
            # takes the first replication PING: every second, not every 10 s
            "--repl-diskless-sync-delay", "0", "--repl-ping-replica-period", "1",
            "--save", "", "--appendonly", "no", "--dir", self.dir,
            "--daemonize", "no", "--protected-mode", "yes",
            "--loglevel", "notice", "--logfile", self.logfile,
        ]


class SlotMoves:
    """How a cluster's slots move. ``Cluster`` gives what this uses: its ``redis-cli``, its
    nodes, a connection per node, and its waits."""

    cli: str
    _nodes: List[Node]

    def _conn(self, addr: Addr) -> Any:
        raise NotImplementedError

    def _run_cli(self, cmd: List[str], timeout: float) -> str:
        raise NotImplementedError

    def masters(self) -> List[Addr]:
        raise NotImplementedError

    def node_id(self, addr: Addr) -> str:
        raise NotImplementedError

    def slot_owner(self, slot: int) -> Addr:
        raise NotImplementedError

    def wait_agreement(self, timeout: float = 30.0, replicas: bool = True) -> None:
        raise NotImplementedError

    def reshard_slot(self, slot: int, to_addr: Addr, timeout: float = 30.0,
                     batch: int = 100) -> None:
        """Move ``slot`` with its keys to master ``to_addr``, as redis-cli does: SETSLOT
        IMPORTING on the target, MIGRATING on the source, MIGRATE the keys in batches
        (CLUSTER GETKEYSINSLOT), then SETSLOT NODE on the target, the source and every other
        master; then wait until all nodes agree."""
        source = self.slot_owner(slot)
        target = (to_addr[0], int(to_addr[1]))
        if source == target:
            return
        src_id, dst_id = self.node_id(source), self.node_id(target)
        src, dst = self._conn(source), self._conn(target)
        dst.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", src_id)
        src.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", dst_id)
        deadline = time.monotonic() + timeout
        while True:
            keys = src.execute_command("CLUSTER", "GETKEYSINSLOT", slot, batch)
            if not keys:
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"slot {slot}: keys still on {source} after {timeout:g} s")
            src.execute_command("MIGRATE", target[0], target[1], "", 0, 10000, "KEYS", *keys)
        others = [m for m in self.masters() if m not in (source, target)]
        for addr in [target, source, *others]:
            self._conn(addr).execute_command("CLUSTER", "SETSLOT", slot, "NODE", dst_id)
        self.wait_agreement(timeout)

    def reshard_with_cli(self, from_addr: Addr, to_addr: Addr, nslots: int,
                         timeout: float = 120.0) -> str:
        """``redis-cli --cluster reshard --cluster-from <id> --cluster-to <id>
        --cluster-slots N --cluster-yes``: move ``nslots`` slots (redis-cli picks which) with
        their keys; wait until all nodes agree; return redis-cli's output."""
        self.wait_agreement(timeout)  # redis-cli refuses a cluster whose nodes disagree
        entry = next(n.addr for n in self._nodes if n.alive())
        out = self._run_cli([
            self.cli, "--cluster", "reshard", f"{entry[0]}:{entry[1]}",
            "--cluster-from", self.node_id(from_addr), "--cluster-to", self.node_id(to_addr),
            "--cluster-slots", str(nslots), "--cluster-yes"], timeout)
        self.wait_agreement(timeout)
        return out

    def setslot_bare(self, slot: int, to_addr: Addr, timeout: float = 30.0) -> None:
        """Reassign ``slot`` to master ``to_addr`` without migrating its keys: ``CLUSTER
        BUMPEPOCH`` on the target (so that its claim outranks the old owner's), then a bare
        ``CLUSTER SETSLOT <slot> NODE <id>`` on the target, every other master and the old
        owner; then wait until all nodes agree (and check that they agree on the target).

        The keys are not moved. They stay behind on the old node, where they are no longer
        reachable through the slot (it answers MOVED for them, and the new owner has none),
        which is how Redis drops them. The old owner itself refuses the SETSLOT while it holds
        keys in the slot ("Can't assign hashslot ... while I still hold keys"); it learns of
        the new owner from the target's higher config epoch, and then (Redis 7 and Valkey 8
        alike) deletes its own keys of that slot: soon they are not only unreachable but
        gone. Without the epoch bump the old owner's claim could win and undo the move."""
        target = (to_addr[0], int(to_addr[1]))
        source = self.slot_owner(slot)
        if source == target:
            return
        dst_id = self.node_id(target)
        self._conn(target).execute_command("CLUSTER", "BUMPEPOCH")
        for addr in [target, *(m for m in self.masters() if m not in (target, source)), source]:
            try:
                self._conn(addr).execute_command("CLUSTER", "SETSLOT", slot, "NODE", dst_id)
            except redis.ResponseError:
                if addr != source:
                    raise
                # the old owner refuses while it holds keys in the slot: the epoch decides
        self.wait_agreement(timeout)
        owner = self.slot_owner(slot)
        if owner != target:
            raise RuntimeError(f"slot {slot} went back to {owner}, not to {target}")

    def _settle_open_slots(self, node: Node) -> None:
        try:
            conn = self._conn(node.addr)
            for line in text(conn.execute_command("CLUSTER", "NODES")).splitlines():
                fields = line.split()
                if len(fields) > 2 and "myself" in fields[2].split(","):
                    for field in fields[8:]:
                        if field.startswith("["):  # [slot->-id] or [slot-<-id]
                            slot = int(field[1:].split("-")[0])
                            conn.execute_command("CLUSTER", "SETSLOT", slot, "STABLE")
        except redis.RedisError:
            pass
