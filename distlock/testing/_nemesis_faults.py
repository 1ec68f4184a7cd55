"""The faults of ``python -m distlock.testing.nemesis``, one function per kind of fault:
``act(nemesis, workers, lease)`` does the phase's nemesis to the servers, proxies and worker
processes of a ``nemesis._Workers`` and returns the fault's window. A fault aimed at one worker
is aimed at a holder (``_holder``). Kept apart from the command so that each reads in one
sitting; it does not import it (``workers`` is duck-typed).
"""

from __future__ import annotations

import signal
import time
from typing import Any, Callable, List, Tuple

import redis

from .cluster import Cluster
from .proxy import FaultProxy

__all__ = ["act"]


def _for_a_while(proxies: List[FaultProxy], fault: Callable[[FaultProxy], object],
                 span: float) -> None:
    """Put ``fault`` on every one of ``proxies`` for ``span`` seconds, then heal them."""
    for proxy in proxies:
        fault(proxy)
    time.sleep(span)
    for proxy in proxies:
        proxy.heal()


def _holder(workers: Any) -> int:
    """The worker that holds one of the names now, as the lock's hash says (its ``:i``,
    ``host:pid``, then a leader's value after a space, read from any node that answers for
    it); worker 0 if none does."""
    pids = {proc.pid: i for i, proc in enumerate(workers.procs)}
    for name in workers.phase.names:
        for host, port in workers.nodes:
            try:
                with redis.Redis(host=host, port=port, socket_timeout=0.5,
                                 socket_connect_timeout=0.5) as node:
                    info = node.hget(f"distlock:{{{name}}}", ":i")
            except redis.RedisError:  # down, or not the slot's owner (MOVED)
                continue
            if info:
                holder = pids.get(int(info.split(b" ", 1)[0].rsplit(b":", 1)[1]))
                if holder is not None:
                    return holder
    return 0


def act(nemesis: str, workers: Any, lease: float) -> Tuple[float, float, str]:
    """Do ``nemesis`` now; return (start, end, detail) of the fault. A fault aimed at one
    worker (partition, drop-replies, pause, kill) is aimed at a holder (``_holder``)."""
    span = 2 * lease
    victim = workers.victim = _holder(workers) if nemesis in (
        "partition", "drop-replies", "pause", "kill") else 0
    start = time.monotonic()
    if nemesis == "partition":
        _for_a_while(workers.proxies[victim], FaultProxy.blackhole, span)
    elif nemesis == "drop-replies":
        _for_a_while(workers.proxies[victim], FaultProxy.drop_replies, span)
    elif nemesis == "delay":
        everyone = [proxy for proxies in workers.proxies for proxy in proxies]
        _for_a_while(everyone, lambda proxy: proxy.delay(lease * 1000 / 5), span)
    elif nemesis == "pause":
        workers.procs[victim].send_signal(signal.SIGSTOP)
        time.sleep(span)
        workers.procs[victim].send_signal(signal.SIGCONT)
    elif nemesis == "kill":
        workers.procs[victim].kill()
    elif nemesis in ("restart", "failover", "reshard") and workers.cluster is not None:
        return _act_on_cluster(nemesis, workers.cluster, workers.phase.names[0], start)
    elif nemesis == "restart" and workers.sentinel is not None:
        master = workers.sentinel.restart_master()
        return start, time.monotonic(), f"master {master[1]}"
    elif nemesis in ("restart", "restart-persisted"):
        for server in workers.servers:
            server.restart()  # the same directory: restart-persisted reloads its AOF
    elif nemesis == "failover":
        assert workers.sentinel is not None
        old = workers.sentinel.master_addr()
        workers.sentinel.pause(old)
        try:
            new = workers.sentinel.wait_promotion(old, timeout=30.0)
        finally:
            workers.sentinel.resume_replicas()
        # healed once the old master is a replica of the new one again: the sentinels wait
        # 8 s after it comes back before they demote it, and a grant that waits for every
        # replica (sentinel-acked) is refused until then
        workers.sentinel.wait_replicas(60.0)
        return start, time.monotonic(), f"master {old[1]} -> {new[1]}"
    elif nemesis == "minority-down":
        workers.servers[0].kill()
        time.sleep(span)
        workers.servers[0].start()
        return start, time.monotonic(), "master 0"
    return start, time.monotonic(), f"worker {victim}, a holder" if nemesis not in (
        "delay", "restart", "restart-persisted") else "all"


def _act_on_cluster(nemesis: str, cluster: Cluster, name: str,
                    start: float) -> Tuple[float, float, str]:
    """``restart``, ``failover`` or ``reshard`` on the master of ``name``'s slot (the keys of a
    name share its hash tag, ``{name}``: docs/how-it-works.rst)."""
    slot = cluster.keyslot("{" + name + "}")
    master = cluster.slot_owner(slot)
    if nemesis == "restart":  # back within the node timeout: no failover, every key gone
        cluster.restart(master)
        cluster.wait_agreement(30.0)
        return start, time.monotonic(), f"master {master[1]}"
    if nemesis == "failover":
        cluster.pause(master)
        try:
            new = cluster.wait_promoted(master, 30.0)
        finally:
            cluster.resume()
        cluster.wait_agreement(60.0)  # the old master a replica of the new one
        return start, time.monotonic(), f"master {master[1]} -> {new[1]}"
    to = next(m for m in cluster.masters() if m != master)
    cluster.reshard_slot(slot, to)
    return start, time.monotonic(), f"slot {slot}: {master[1]} -> {to[1]}"
