"""The Redis Cluster fixture itself (distlock/testing/cluster.py), on the real thing: its shape (3
masters, 1 replica each, every slot served), where hash tags put keys, a master killed and
its replica promoted, a slot moved with its keys (by hand and by ``redis-cli``) and without
them, and a cluster that leaves no process behind.

Every wait in ``Cluster`` is bounded, so is every loop here. Tests that kill nodes or move
slots take ``healthy_cluster``, which leaves the cluster whole again for the next test.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
import time
from typing import Any, Dict, List

import pytest
import redis
from redis.crc import key_slot

from distlock.testing.cluster import SLOTS, Cluster, cluster_cli, slot_map

pytestmark = pytest.mark.real_redis

BOUND = 30.0


def _tagged_on_every_master(cluster: Cluster, count: int = 3) -> Dict[Any, str]:
    """A hash tag per master, for ``count`` different masters (at most 200 tries)."""
    found: Dict[Any, str] = {}
    for i in range(200):
        tag = f"tag{i}"
        found.setdefault(cluster.master_of_key(f"{{{tag}}}:a"), tag)
        if len(found) >= count:
            break
    return found


def _other_master(cluster: Cluster, addr: Any) -> Any:
    return next(m for m in cluster.masters() if m != addr)


# --- its shape -------------------------------------------------------------------------------

def test_three_masters_with_one_replica_each_serve_every_slot(cluster: Cluster,
                                                               cluster_client: Any) -> None:
    masters = cluster.masters()
    assert len(masters) == 3
    replicas = {m: cluster.replicas_of(m) for m in masters}
    assert all(len(r) == 1 for r in replicas.values()), replicas
    everyone = set(masters) | {r for rs in replicas.values() for r in rs}
    assert len(cluster.addrs) == 6 and everyone == set(cluster.addrs)
    assert all(host == "127.0.0.1" for host, _ in cluster.addrs)
    slots = cluster.slots()
    assert sum(last - first + 1 for first, last, _, _ in slots) == SLOTS
    assert {m for _, _, m, _ in slots} == set(masters)
    for addr in cluster.addrs:  # every node says so, and sees the same map
        conn = cluster.node_client(addr)
        try:
            info = conn.execute_command("CLUSTER", "INFO")
            assert b"cluster_state:ok" in info and b"cluster_slots_ok:16384" in info
            assert slot_map(conn.execute_command("CLUSTER", "SLOTS")) == slots
            role = conn.execute_command("ROLE")
            if addr in replicas:
                assert role[0] == b"master"
            else:
                master = next(m for m, rs in replicas.items() if addr in rs)
                assert role[0] == b"slave" and (role[1].decode(), role[2]) == master
        finally:
            conn.close()
    assert cluster.url.startswith("redis+cluster://127.0.0.1:")
    assert int(cluster.url.rsplit(":", 1)[1]) in [port for _, port in cluster.addrs]
    assert cluster_client.ping() and cluster_client.get_default_node().host == "127.0.0.1"


def test_keys_with_different_hash_tags_land_on_different_masters(cluster: Cluster,
                                                                 cluster_client: Any) -> None:
    by_master = _tagged_on_every_master(cluster)
    assert len(by_master) == 3, "no tags on three masters in 200 tries"
    for master, tag in by_master.items():
        keys = [f"{{{tag}}}:a", f"{{{tag}}}:b"]
        assert cluster.master_of_key(keys[1]) == master  # one tag, one slot
        assert cluster_client.mset({k: tag for k in keys})  # so a multi-key command works
        conn = cluster.node_client(master)
        try:
            assert conn.mget(keys) == [tag.encode()] * 2  # they live on that master
        finally:
            conn.close()
        for other in set(by_master) - {master}:
            conn = cluster.node_client(other)
            try:
                with pytest.raises(redis.exceptions.MovedError):
                    conn.get(keys[0])
            finally:
                conn.close()


def test_the_asyncio_client_reaches_every_master(cluster: Cluster, cluster_client: Any) -> None:
    tags = list(_tagged_on_every_master(cluster).values())

    async def main() -> List[Any]:
        client = cluster.aclient()
        try:
            for tag in tags:
                await client.set(f"{{{tag}}}:x", tag)
            return [await client.get(f"{{{tag}}}:x") for tag in tags]
        finally:
            await client.aclose()

    assert asyncio.run(asyncio.wait_for(main(), BOUND)) == [t.encode() for t in tags]
    assert cluster_client.get(f"{{{tags[0]}}}:x") == tags[0].encode()


# --- a failover --------------------------------------------------------------------------------

def test_a_killed_master_fails_over_to_its_replica_and_keeps_a_waited_write(
        cluster: Cluster, healthy_cluster: Cluster) -> None:
    key = "{failover}:k"
    master = cluster.master_of_key(key)
    [replica] = cluster.replicas_of(master)
    client = cluster.client()
    try:
        client.set(key, b"before")
        conn = cluster.node_client(master)
        try:
            assert conn.execute_command("WAIT", 1, 5000) == 1  # the replica has it
        finally:
            conn.close()
        started = time.monotonic()
        cluster.kill(master)
        assert master in cluster.down()
        assert cluster.wait_failover(master, BOUND) == replica
        print(f"kill + failover: {time.monotonic() - started:.2f} s")
        assert cluster.master_of_key(key) == replica
        assert master not in cluster.masters()
        fresh = cluster.client()  # its startup nodes begin with the running ones
        try:
            assert fresh.get(key) == b"before"
        finally:
            fresh.close()
    finally:
        client.close()
    started = time.monotonic()
    cluster.restart(master)  # same port, directory and node id: it rejoins as a replica
    cluster.wait_agreement(BOUND)
    print(f"restart + rejoin as a replica: {time.monotonic() - started:.2f} s")
    assert cluster.replicas_of(replica) == [master]
    assert cluster.master_of_key(key) == replica and not cluster.down()


# --- moving a slot -----------------------------------------------------------------------------

def test_reshard_slot_moves_the_slot_with_its_keys(cluster: Cluster, cluster_client: Any,
                                                   healthy_cluster: Cluster) -> None:
    keys = ["{reshard}:a", "{reshard}:b"]
    cluster_client.mset({k: k for k in keys})
    slot = cluster.keyslot(keys[0])
    source = cluster.master_of_key(keys[0])
    target = _other_master(cluster, source)
    slots_before = {m: _slot_count(cluster, m) for m in cluster.masters()}
    cluster.reshard_slot(slot, target)
    assert cluster.master_of_key(keys[0]) == target
    assert cluster_client.get(keys[0]) == keys[0].encode()  # an old client follows MOVED
    fresh = cluster.client()
    src, dst = cluster.node_client(source), cluster.node_client(target)
    try:
        assert fresh.get(keys[1]) == keys[1].encode()
        assert dst.mget(keys) == [k.encode() for k in keys]  # they live on the new master
        assert src.execute_command("CLUSTER", "COUNTKEYSINSLOT", slot) == 0
        with pytest.raises(redis.exceptions.MovedError):
            src.get(keys[0])
    finally:
        fresh.close()
        src.close()
        dst.close()
    assert _slot_count(cluster, source) == slots_before[source] - 1
    assert _slot_count(cluster, target) == slots_before[target] + 1


def test_reshard_with_cli_moves_slots_with_their_keys(cluster: Cluster, cluster_client: Any,
                                                      healthy_cluster: Cluster) -> None:
    source, target = cluster.masters()[:2]
    owned = {s for first, last, m, _ in cluster.slots() if m == source
             for s in range(first, last + 1)}
    keys = _one_key_per_slot(owned)  # so whichever slots redis-cli picks, keys go with them
    with cluster_client.pipeline(transaction=False) as pipe:
        for slot, key in keys.items():
            pipe.set(key, slot)
        pipe.execute()
    before = {m: _slot_count(cluster, m) for m in (source, target)}
    cluster.reshard_with_cli(source, target, 10)
    assert _slot_count(cluster, source) == before[source] - 10
    assert _slot_count(cluster, target) == before[target] + 10
    moved = _moved(cluster, owned, target)
    assert len(moved) == 10
    for slot in moved:
        assert cluster.master_of_key(keys[slot]) == target
        assert cluster_client.get(keys[slot]) == str(slot).encode()
    assert _dbsize(cluster, source) + _dbsize(cluster, target) == len(keys)


def test_setslot_bare_leaves_the_key_unreachable(cluster: Cluster, cluster_client: Any,
                                                 healthy_cluster: Cluster) -> None:
    key = "{bare}:k"
    cluster_client.set(key, b"v")
    slot = cluster.keyslot(key)
    source = cluster.master_of_key(key)
    target = _other_master(cluster, source)
    cluster.setslot_bare(slot, target)
    assert cluster.master_of_key(key) == target
    assert cluster_client.get(key) is None  # MOVED to the new owner, which has no such key
    fresh = cluster.client()
    src, dst = cluster.node_client(source), cluster.node_client(target)
    try:
        assert fresh.get(key) is None
        assert not dst.exists(key)
        with pytest.raises(redis.exceptions.MovedError):
            src.get(key)
        # and the old owner, told by the new owner's higher epoch, dropped its copy
        assert src.execute_command("CLUSTER", "COUNTKEYSINSLOT", slot) == 0
    finally:
        fresh.close()
        src.close()
        dst.close()


# --- start and close ---------------------------------------------------------------------------

def test_a_cluster_that_cannot_start_leaves_nothing_behind(tmp_path: Any,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """A server binary that exits at once: ``start`` fails with its exit status (after
    trying new ports a few times), and the directories it made are gone."""
    false = shutil.which("false")
    if cluster_cli() is None or false is None:
        reason = "needs redis-cli (and false) on PATH"
        if os.environ.get("DISTLOCK_REQUIRE_REDIS") == "1":
            pytest.fail(f"DISTLOCK_REQUIRE_REDIS=1 but this test {reason}")
        pytest.skip(reason)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    with pytest.raises(RuntimeError, match="exited with"):
        Cluster.start(false, timeout=10.0)
    assert os.listdir(tmp_path) == []


def test_close_ends_every_node_and_removes_its_directory(cluster: Cluster) -> None:
    """A second cluster of its own (the session's stays up): closed, none of its processes
    runs and none of its directories is left. Timed: ``timings`` says where start went."""
    other = Cluster.start(cluster.binary, timeout=BOUND)
    try:
        pids = other.pids()
        dirs = [n.dir for n in other._nodes]
        assert len(pids) == 6 and all(os.path.isdir(d) for d in dirs)
        assert other.timings["total"] < BOUND
        print("Cluster.start():", {k: round(v, 2) for k, v in other.timings.items()})
        assert not set(other.addrs) & set(cluster.addrs)
    finally:
        other.close()
    assert all(not _running(pid) for pid in pids)
    assert not any(os.path.exists(d) for d in dirs)
    other.close()  # idempotent


# --- helpers -----------------------------------------------------------------------------------

def _slot_count(cluster: Cluster, master: Any) -> int:
    return sum(last - first + 1 for first, last, m, _ in cluster.slots() if m == master)


def _moved(cluster: Cluster, slots: Any, target: Any) -> List[int]:
    return sorted(s for first, last, m, _ in cluster.slots() if m == target
                  for s in range(first, last + 1) if s in slots)


def _one_key_per_slot(slots: Any, tries: int = 400_000) -> Dict[int, str]:
    keys: Dict[int, str] = {}
    for i in range(tries):
        name = f"cli:{i}"
        slot = key_slot(name.encode())
        if slot in slots and slot not in keys:
            keys[slot] = name
            if len(keys) == len(slots):
                break
    assert len(keys) == len(slots), "could not name a key for every slot"
    return keys


def _dbsize(cluster: Cluster, addr: Any) -> int:
    conn = cluster.node_client(addr)
    try:
        return int(conn.dbsize())
    finally:
        conn.close()


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as fh:
            return fh.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False
