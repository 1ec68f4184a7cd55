"""The ``distlock`` command line on a real Redis Cluster (3 masters, 3 replicas: the ``cluster``
fixture), through real subprocesses (``python -m distlock``), as in ``test_cli.py``.

The names held here are chosen so that their slots are on different masters: ``status`` and
``list`` must find them all (``list`` SCANs every master), ``release --force`` must break a hold
that is not on the first master, ``run`` must hold, renew and check its lock on the cluster,
and ``top``, ``demo --url`` and ``bench --cluster`` (on a private cluster of its own) must run
there. In process: the reads follow a slot that moved, fail at once on a dead master that is
still in the slot map, and read its replica once it took over. Child processes are waited for
with a bound and killed in ``finally``; every test flushes the cluster after itself
(``cluster_client``; ``healthy_cluster`` also heals what the test moved or killed).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from typing import Any, Dict, List, Optional

import pytest
import redis
from _support import kill, read_line, until

from distlock import DistLock, DistReadWriteLock, DistRLock, LockLostError
from distlock._cli import state as _cli  # fetch_states, list_names
from distlock._cli.bench import cluster_bench_script
from distlock._cli.servers import by_server, servers
from distlock._core.keys import Keys
from distlock._core.settings import settings

pytestmark = pytest.mark.real_redis

TIMEOUT = 60  # seconds: the bound of every subprocess call here

SLEEPING_CHILD = """
import time
print("ready", flush=True)
time.sleep(60)
"""


def _env(url: Optional[str] = None) -> Dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "DISTLOCK_URL"}
    if url is not None:
        env["DISTLOCK_URL"] = url
    return env


def cli(*args: str, url: Optional[str] = None,
        timeout: float = TIMEOUT) -> subprocess.CompletedProcess[str]:
    """Run ``python -m distlock ARGS`` to completion, $DISTLOCK_URL set to ``url``."""
    return subprocess.run(
        [sys.executable, "-m", "distlock", *args], env=_env(url), stdin=subprocess.DEVNULL,
        capture_output=True, text=True, timeout=timeout)


def start(*args: str, url: str) -> subprocess.Popen[str]:
    """Start ``python -m distlock ARGS`` in the background, its output piped."""
    return subprocess.Popen(
        [sys.executable, "-m", "distlock", *args], env=_env(url), stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(proc: subprocess.Popen[str], timeout: float = TIMEOUT) -> tuple[int, str, str]:
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, out, err


def as_json(result: subprocess.CompletedProcess[str]) -> Any:
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def lock_key(name: str) -> str:
    return Keys(settings().prefix, name).lock


def master_of(cluster: Any, name: str) -> Any:
    return cluster.master_of_key(lock_key(name))


def spread_names(cluster: Any, tag: str, count: int = 3) -> List[str]:
    """``count`` names (at most one per master) whose slots are on as many masters as there are
    (``count`` <= 3), under the prefix ``tag``."""
    found: Dict[Any, str] = {}
    for i in range(2000):
        name = f"{tag}:{i}"
        found.setdefault(master_of(cluster, name), name)
        if len(found) >= count:
            break
    return sorted(found.values())


@pytest.fixture
def tag(cluster_client: Any) -> str:
    """A fresh name prefix (``cluster_client`` flushes every master after the test)."""
    return f"clicl:{uuid.uuid4().hex[:8]}"


def keys_on_masters(cluster_client: Any, match: str) -> List[str]:
    """Keys matching ``match`` on every master (SCAN, never KEYS)."""
    found: List[str] = []
    for server in servers(cluster_client):
        found += [k.decode() for k in server.scan_iter(match=match, count=1000)]
    return sorted(found)


def replicated(replica: Any, key: str) -> bool:
    """``key`` exists on ``replica`` (a plain client of a replica node: READONLY first, on the
    same connection)."""
    pipe = replica.pipeline(transaction=False)
    pipe.execute_command("READONLY")
    pipe.exists(key)
    return bool(pipe.execute()[1])


# --- status and list ----------------------------------------------------------------------------

def test_status_and_list_see_holds_on_every_master(
        cluster: Any, cluster_client: Any, tag: str) -> None:
    names = spread_names(cluster, tag)
    assert len({master_of(cluster, n) for n in names}) == len(names) == 3, names  # 3 masters
    # the command line's helpers agree: one server per master, the names on different ones
    assert len(servers(cluster_client)) == len(cluster.masters()) == 3
    assert len(by_server(cluster_client, [lock_key(n) for n in names])) == len(names)
    plain = DistLock(names[0], client=cluster_client)
    reentrant = DistRLock(names[1], client=cluster_client)
    reader = DistReadWriteLock(names[2], client=cluster_client).read_lock()
    free = f"{tag}:free"
    assert plain.acquire() and reentrant.acquire() and reentrant.acquire() and reader.acquire()
    try:
        # status: $DISTLOCK_URL
        states = as_json(cli("status", "--json", *names, free, url=cluster.url))
        by_name = {s["name"]: s for s in states}
        assert set(by_name) == {*names, free}
        assert (by_name[names[0]]["kind"], by_name[names[0]]["token"]) == ("DistLock", plain.token)
        assert (by_name[names[1]]["kind"], by_name[names[1]]["count"],
                by_name[names[1]]["token"]) == ("DistRLock", 2, reentrant.token)
        assert (by_name[names[2]]["kind"], by_name[names[2]]["token"]) == \
            ("DistReadWriteLock", reader.token)
        assert [o["mode"] for o in by_name[names[2]]["owners"]] == ["read"]
        assert 0 < by_name[names[2]]["lease_ms"] <= 30_000  # the reader's deadline, its master's clock
        assert by_name[free]["held"] is False
        for name in names:
            (owner,) = by_name[name]["owners"]
            assert (owner["host"], owner["pid"]) == (os.uname().nodename, os.getpid())
        # list: --url, every master scanned
        listed = as_json(cli("list", "--json", f"{tag}:*", "--url", cluster.url))
        assert sorted(s["name"] for s in listed) == names
        text = cli("list", f"{tag}:*", "--url", cluster.url)
        assert text.returncode == 0, text.stderr
        for name in names:
            assert f"{name}: held" in text.stdout
        nothing = cli("list", f"{tag}:none*", "--url", cluster.url)
        assert nothing.returncode == 0 and "nothing held, waited on or set matches" in nothing.stdout
    finally:
        plain.release()
        reentrant.release()
        reentrant.release()
        reader.release()
    assert as_json(cli("list", "--json", f"{tag}:*", url=cluster.url)) == []


def test_top_once_json_scans_every_master(cluster: Any, cluster_client: Any, tag: str) -> None:
    names = spread_names(cluster, tag)
    locks = [DistLock(n, client=cluster_client) for n in names]
    assert all(lock.acquire() for lock in locks)
    try:
        data = as_json(cli("top", "--json", "--url", cluster.url))
        rows = {r["name"]: r for r in data["rows"]}
        assert set(names) <= set(rows)
        for lock in locks:
            assert (rows[lock.name]["kind"], rows[lock.name]["token"]) == ("DistLock", lock.token)
        assert data["scan_calls"] >= 3  # one SCAN per master at least
        assert data["url"] == cluster.url
    finally:
        for lock in locks:
            lock.release()


def test_status_and_list_read_again_after_a_slot_moved(
        healthy_cluster: Any, cluster_client: Any, tag: str) -> None:
    """A slot that moved since the client read the slot map: the old master answers MOVED, the
    map is read again, the reads are done again on the new master (in process: the client
    must be one whose map is stale)."""
    cluster = healthy_cluster
    name = f"{tag}:moving"
    key = lock_key(name)
    lock = DistLock(name, client=cluster_client, lease=60)  # no watchdog
    assert lock.acquire()
    try:
        source = cluster.master_of_key(key)
        target = next(m for m in cluster.masters() if m != source)
        assert _cli.fetch_states(cluster_client, [name])[0].held
        cluster.reshard_slot(cluster.keyslot(key), target)
        stale = cluster_client.get_node_from_key(key)
        assert (stale.host, stale.port) == source  # the client does not know yet
        (state,) = _cli.fetch_states(cluster_client, [name])
        assert state.held and state.token == lock.token
        moved = cluster_client.get_node_from_key(key)
        assert (moved.host, moved.port) == target
        assert _cli.list_names(cluster_client, f"{tag}:*") == [name]
    finally:
        lock.release()


@pytest.mark.slow
def test_status_fails_at_once_on_a_dead_master_and_reads_its_successor_after_failover(
        healthy_cluster: Any, cluster_client: Any, tag: str) -> None:
    """A master that cannot be reached and is still in the slot map: an error at once (the
    command line does not wait for a failover); once a replica took over, the reads go there."""
    cluster = healthy_cluster
    name = f"{tag}:failover"
    key = lock_key(name)
    lock = DistLock(name, client=cluster_client, lease=60)  # no watchdog
    assert lock.acquire()
    master = cluster.master_of_key(key)
    (replica,) = cluster.replicas_of(master)
    replica_client = cluster.node_client(replica)
    try:
        until(lambda: replicated(replica_client, key))  # the hold reached the replica
        assert _cli.fetch_states(cluster_client, [name])[0].held  # the client maps the slot
        cluster.kill(master)
        began = time.monotonic()
        with pytest.raises(redis.ConnectionError):
            _cli.fetch_states(cluster_client, [name])
        assert time.monotonic() - began < 1.5  # not READ_AGAIN_BOUND: no failover to follow
        assert cluster.wait_failover(master) == replica
        (state,) = _cli.fetch_states(cluster_client, [name])  # the client's map is stale
        assert state.held and state.token == lock.token
        assert _cli.list_names(cluster_client, f"{tag}:*") == [name]
    finally:
        replica_client.close()
        try:
            lock.release()
        except (redis.RedisError, LockLostError):
            pass  # the test failed before the failover: healthy_cluster restores the cluster


# --- release --force ------------------------------------------------------------------------------

def test_release_force_breaks_a_hold_on_a_later_master(
        cluster: Any, cluster_client: Any, tag: str) -> None:
    first = cluster.slot_owner(0)  # the first master in slot order
    names = [n for n in spread_names(cluster, tag) if master_of(cluster, n) != first]
    assert names, "no name off the first master"
    name = names[-1]
    lock = DistLock(name, client=cluster_client)
    assert lock.acquire()
    token = lock.token
    try:
        refused = cli("release", name, "--url", cluster.url)
        assert refused.returncode == 1
        assert f"pid {os.getpid()}" in refused.stderr and "--force" in refused.stderr
        forced = cli("release", "--force", name, url=cluster.url)
        assert forced.returncode == 0, forced.stderr
        assert "released by force" in forced.stdout
        assert cluster_client.exists(lock_key(name)) == 0
        again = cli("release", "--force", name, url=cluster.url)
        assert again.returncode == 0 and "not held" in again.stdout
        other = DistLock(name, client=cluster_client)
        assert other.acquire(blocking=False)
        assert other.token is not None and token is not None and other.token > token
        other.release()
        with pytest.raises(LockLostError):  # the old holder finds out at its release
            lock.release()
    finally:
        if lock.owned():
            lock.release()


# --- run ---------------------------------------------------------------------------------------------

def test_run_holds_its_lock_on_the_cluster(cluster: Any, cluster_client: Any, tag: str) -> None:
    name = f"{tag}:job"
    code = ("import os, sys; print(os.environ['DISTLOCK_TOKEN'], os.environ['DISTLOCK_NAME']); "
            "sys.exit(7)")
    result = cli("run", name, "--url", cluster.url, "--", sys.executable, "-c", code)
    assert result.returncode == 7, result.stderr
    token, shown = result.stdout.split()
    assert shown == name and int(token) > 0
    assert as_json(cli("status", "--json", name, url=cluster.url))[0]["held"] is False
    holder = DistLock(name, client=cluster_client)
    assert holder.acquire()
    try:
        busy = cli("run", name, "-n", "--", "true", url=cluster.url)
        assert busy.returncode == 75
        assert f"pid {os.getpid()}" in busy.stderr
    finally:
        holder.release()


def test_run_stops_when_its_hold_is_force_released(
        cluster: Any, cluster_client: Any, tag: str) -> None:
    name = f"{tag}:long"
    proc = start("run", name, "--kill-after", "1", "--", sys.executable, "-c", SLEEPING_CHILD,
                 url=cluster.url)
    try:
        assert read_line(proc) == "ready"
        (state,) = as_json(cli("status", "--json", name, url=cluster.url))
        assert state["held"] and state["owners"][0]["pid"] == proc.pid
        forced = cli("release", "--force", name, "--url", cluster.url)
        assert forced.returncode == 0, forced.stderr
        status, _, err = finish(proc, timeout=20)  # the command sleeps 60 s
        assert status == 76, err
        assert "lost the lock" in err
    finally:
        kill(proc)


# --- demo and bench -----------------------------------------------------------------------------------

@pytest.mark.slow
def test_demo_on_the_cluster_leaves_nothing_behind(
        cluster: Any, cluster_client: Any, tag: str) -> None:
    result = cli("demo", "--url", cluster.url, "--workers", "2", "--increments", "10",
                 timeout=180)
    assert result.returncode == 0, result.stderr
    assert f"Redis Cluster at {cluster.url}" in result.stdout
    rows = {line.split("  ")[0].strip(): line.split() for line in result.stdout.splitlines()
            if line.startswith(("no lock", "DistLock", "DistRLock"))}
    assert set(rows) == {"no lock", "DistLock", "DistRLock, taken twice"}
    assert rows["DistLock"][1:4] == ["20", "20", "0"]
    assert rows["DistRLock, taken twice"][3:6] == ["20", "20", "0"]
    assert keys_on_masters(cluster_client, "distlock-demo:*") == []
    assert keys_on_masters(cluster_client, "distlock:{distlock-demo:*") == []


@pytest.mark.slow
def test_bench_cluster_runs_on_a_private_cluster() -> None:
    if not cluster_bench_script().is_file():
        pytest.skip("benchmarks/bench_cluster.py is not in this tree")
    result = cli("bench", "--cluster", "--quick", "spread", timeout=300)
    assert result.returncode == 0, result.stderr
    assert "spread of" in result.stdout and "Traceback" not in result.stderr


def test_bench_takes_no_url() -> None:
    result = cli("bench", "--url", "redis+cluster://127.0.0.1:7000/", "floor")
    assert result.returncode == 2
    assert "takes no --url" in result.stderr and "--cluster" in result.stderr


# --- bad and unreachable cluster URLs -------------------------------------------------------------------

def test_a_bad_cluster_url_is_a_usage_error() -> None:
    result = cli("status", "x", "--url", "redis+cluster://127.0.0.1:notaport/")
    assert result.returncode == 2
    assert "host:port" in result.stderr and "Traceback" not in result.stderr


def test_an_unreachable_cluster_exits_69_naming_the_url() -> None:
    from distlock.testing.server import free_port

    url = f"redis+cluster://u:secret@127.0.0.1:{free_port()},127.0.0.1:{free_port()}/"
    for args in (["status", "x"], ["list"], ["release", "--force", "x"], ["top", "--once"],
                 ["run", "x", "-n", "--url", url, "--", "true"]):
        result = cli(*args, url=url)  # $DISTLOCK_URL, or --url before run's command
        assert result.returncode == 69, (args, result.stderr)
        lines = [line for line in result.stderr.splitlines() if line.strip()]
        assert len(lines) == 1 and "cannot reach" in lines[0] and "secret" not in lines[0], lines
        assert "redis+cluster://u:***@127.0.0.1" in lines[0]
