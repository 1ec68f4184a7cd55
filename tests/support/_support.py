"""Small helpers the test suites share."""

from __future__ import annotations

import gc
import itertools
import math
import re
import selectors
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

import redis

from distlock._redis.urls import client_from_url

#: The loosest upper bound on anything that should be quick: only a hang fails it.
BOUND = 20.0


def scan_keys(client: Any, pattern: str) -> List[bytes]:
    """The keys matching ``pattern`` on the server, or on every master of a cluster, sorted
    (SCAN, never KEYS)."""
    if isinstance(client, redis.RedisCluster):
        return sorted(client.scan_iter(match=pattern, count=1000, target_nodes=redis.RedisCluster.PRIMARIES))
    return sorted(client.scan_iter(match=pattern, count=1000))


def distlock_keys(client: Any) -> List[str]:
    """Every distlock key, sorted (``scan_keys``)."""
    return [k.decode() for k in scan_keys(client, "distlock:*")]


def sem_permits(client: Any, key: str) -> List[Tuple[bytes, float]]:
    """The permits recorded in semaphore key ``key`` (expired ones included, counters left
    out), as (id, lease deadline in server ms), by deadline. A permit taken at rest is scored
    +inf in Redis: its deadline is the key's expiry, read here as the server's time + PTTL."""
    if isinstance(client, redis.RedisCluster):  # its pipelines refuse TIME: ask the key's node
        client = client.get_redis_connection(client.nodes_manager.get_node_from_slot(client.keyslot(key)))
    with client.pipeline(transaction=False) as pipe:
        pipe.zrangebyscore(key, 0, "+inf", withscores=True)
        pipe.time()
        pipe.pttl(key)
        rows, (seconds, micros), pttl = pipe.execute()
    expiry = seconds * 1000 + micros // 1000 + pttl
    return sorted(((member, expiry if math.isinf(score) else score) for member, score in rows),
                  key=lambda row: row[1])


def stacks(threads: Any) -> Dict[str, str]:
    """Where each of ``threads`` is now (its innermost frames), for a failure's message."""
    frames = sys._current_frames()
    out = {}
    for thread in threads:
        frame = frames.get(thread.ident or -1)
        out[thread.name] = "".join(traceback.format_stack(frame)[-8:]) if frame else "?"
    return out


def settle(check: Callable[[], Any], bound: float) -> bool:
    """Wait until ``check()`` is true, at most ``bound`` seconds; return whether it became so."""
    deadline = time.monotonic() + bound
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def collect_garbage(bound: float = BOUND) -> None:
    """A full garbage collection that really ran. ``gc.collect()`` does nothing, and returns 0,
    while another thread's collection is under way; in a full run, with distlock's workers and
    the suite's own threads allocating, that happens. Objects in reference cycles (a redis-py
    client is one) then wait for the next full collection, which a large heap makes rare."""
    seen: List[str] = []

    def watch(phase: str, info: Dict[str, int]) -> None:
        if info.get("generation") == 2 and (phase == "start" or seen):
            seen.append(phase)

    gc.callbacks.append(watch)
    try:
        deadline = time.monotonic() + bound
        while "stop" not in seen:
            assert time.monotonic() < deadline, f"no full collection ran within {bound} s"
            gc.collect()
            if "stop" not in seen:
                time.sleep(0.01)
    finally:
        gc.callbacks.remove(watch)


def until(check: Callable[[], Any], bound: float = BOUND, what: str = "condition") -> None:
    """Wait until ``check()`` is true; fail the test after ``bound`` seconds (``what``: what
    the failure names)."""
    deadline = time.monotonic() + bound
    while not check():
        assert time.monotonic() < deadline, f"{what} not reached within {bound} s"
        time.sleep(0.02)


def lease_left_ms(client: Any, name: str) -> int:
    """The longest remaining lease of a hold of ``name`` (-1 when nothing holds it): a hash's
    PTTL, or for the readers of a read/write lock (sorted-set members ``owner#token`` scored by
    their deadline on the server's clock) the latest deadline from now."""
    best = -1
    for key in client.scan_iter(match=f"distlock:{{{name}}}*"):
        kind = client.type(key)
        if kind == b"hash":
            best = max(best, int(client.pttl(key)))
        elif kind == b"zset":
            seconds, micros = client.time()
            now_ms = seconds * 1000 + micros // 1000
            for member, deadline in client.zrange(key, 0, -1, withscores=True):
                if b"#" in member and deadline > now_ms:
                    best = max(best, int(deadline - now_ms))
    return best


def previous_script(name: str) -> str:
    """The assembled script ``name`` of the previous release (tests/compat), for the rolling
    upgrade tests."""
    return (Path(__file__).parent.parent / "compat" / f"prev_{name}.lua").read_text(encoding="utf-8")


def renewals_seen(left_ms: Callable[[], int], count: int = 2, bound: float = 30.0,
                  what: str = "hold") -> None:
    """Wait until ``count`` renewals of a hold reached the server: each makes its remaining
    lease (``left_ms()``, a PTTL) larger than at the read before. Only a hang fails it: no
    timing is judged, so a loaded machine's late renewal is not taken for a missing one."""
    deadline = time.monotonic() + bound
    last, seen = left_ms(), 0
    while seen < count:
        assert time.monotonic() < deadline, f"{count} renewals of {what} not seen within {bound} s"
        time.sleep(0.02)
        now = left_ms()
        assert now >= 0, f"{what} is gone from the server (PTTL {now})"
        seen += now > last
        last = now


_other_names = itertools.count(1)


def other_client(url: str) -> Any:
    """A client of ``url`` with a session of its own: another process, as far as distlock can
    tell (each gets a client name of its own; a Cluster client always has a session of its
    own)."""
    if url.startswith("redis+cluster://"):
        return client_from_url(url)
    return redis.Redis.from_url(url, client_name=f"other-{next(_other_names)}")


#: the class of ``threading.RLock()`` on this interpreter (``_thread.RLock``, the C one)
THREADING_RLOCK = type(threading.RLock())

#: ``_thread.RLock``'s repr, the same on every CPython this project supports:
#: ``<locked _thread.RLock object owner=139... count=2 at 0x7f...>``
_RLOCK_REPR = re.compile(r"<(?:un)?locked \S+ object owner=(\d+) count=(\d+) at \S+>")


def rlock_depth(lock: Any) -> int:
    """The calling thread's recursion count on a ``threading.RLock``, as
    ``_recursion_count()`` reports it: the depth if this thread owns it, else 0.

    Read through what this interpreter's RLock offers: ``_recursion_count()`` where it has one
    (3.12 and later, and later 3.11 releases such as 3.11.7), else its repr, which has said
    owner and count on every CPython this project supports (3.9, 3.10 and Debian's 3.11.2 have no
    ``_recursion_count``). Only for threading's own RLock, the twin a test compares with: a
    DistRLock's ``_recursion_count()`` is part of its contract, and tests call it directly.
    """
    assert type(lock) is THREADING_RLOCK, f"not a threading.RLock: {lock!r}"
    if hasattr(lock, "_recursion_count"):
        return int(lock._recursion_count())
    match = _RLOCK_REPR.fullmatch(repr(lock))
    assert match is not None, f"unexpected threading.RLock repr: {lock!r}"
    owner, count = (int(group) for group in match.groups())
    return count if owner == threading.get_ident() else 0


def outcome(fn: Callable[[], Any]) -> Tuple[str, Any]:
    """('ok', value) or (exception type name, message): what a call did, for comparison."""
    try:
        return "ok", fn()
    except Exception as exc:  # noqa: BLE001
        return type(exc).__name__, str(exc)


def read_line(proc: subprocess.Popen[str], timeout: float = 60.0) -> str:
    """The next line of ``proc``'s stdout, waiting at most ``timeout`` seconds."""
    assert proc.stdout is not None
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        if not sel.select(timeout):
            raise AssertionError(f"no output from {proc.args} within {timeout} s")
    return proc.stdout.readline().strip()


def kill(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.kill()
    try:
        proc.communicate(timeout=10)
    except (subprocess.TimeoutExpired, ValueError):
        pass


# --- the same contract on a Redis Cluster ---------------------------------------------------

#: A contract suite's type id with this suffix runs on the session's Redis Cluster
#: (distlock/testing/cluster.py) instead of the single test server: ``"DistLock@cluster"``.
ON_CLUSTER = "@cluster"
#: the suffix of a lock type on a Redlock quorum of five masters (distlock/testing/redlock.py)
ON_REDLOCK = "@redlock"


#: ... and with this one through a Sentinel master client of the session's Sentinel set
#: (distlock/testing/sentinel.py): ``"DistLock@sentinel"``.
ON_SENTINEL = "@sentinel"


def base_type(type_id: str) -> str:
    """``type_id`` without its topology suffix."""
    for suffix in (ON_CLUSTER, ON_SENTINEL, ON_REDLOCK):
        if type_id.endswith(suffix):
            return type_id[: -len(suffix)]
    return type_id


def client_for(type_id: str, request: Any) -> Any:
    """The blocking client a contract test of ``type_id`` talks through (a fixture's: cleaned
    up after the test); for ``@redlock``, a list of five masters' clients."""
    if type_id.endswith(ON_SENTINEL):
        return request.getfixturevalue("sentinel_client")
    if type_id.endswith(ON_REDLOCK):
        return request.getfixturevalue("redlock_clients")
    return request.getfixturevalue("cluster_client" if type_id.endswith(ON_CLUSTER) else "client")


def url_for(type_id: str, request: Any) -> str:
    """The URL of the server (or cluster, or Sentinel set) a contract test of ``type_id``
    talks to."""
    if type_id.endswith(ON_SENTINEL):
        return str(request.getfixturevalue("sentinel_url"))
    return str(request.getfixturevalue("cluster_url" if type_id.endswith(ON_CLUSTER) else "url"))


def subscribers(client: Any, channel: str, sharded: bool = False) -> int:
    """How many connections wait for hints on ``channel``: subscribed to it on the server (with
    SSUBSCRIBE when ``sharded``), or on a cluster subscribed with SSUBSCRIBE on the master of its
    slot."""
    if isinstance(client, redis.RedisCluster):
        client = client.get_redis_connection(client.nodes_manager.get_node_from_slot(client.keyslot(channel)))
        sharded = True
    if sharded:
        return int(client.execute_command("PUBSUB", "SHARDNUMSUB", channel)[1])
    return int(client.pubsub_numsub(channel)[0][1])





class Worker(threading.Thread):
    """A thread that runs ``fn`` once and keeps its result, exception and timing."""

    def __init__(self, fn: Callable[[], Any], name: str = "fault-worker") -> None:
        super().__init__(name=name, daemon=True)
        self.fn = fn
        self.result: Any = None
        self.error: Optional[BaseException] = None
        self.started_at = 0.0
        self.ended_at = 0.0

    def run(self) -> None:
        self.started_at = time.monotonic()
        try:
            self.result = self.fn()
        except BaseException as exc:  # noqa: BLE001 - inspected by the test
            self.error = exc
        finally:
            self.ended_at = time.monotonic()

    @property
    def elapsed(self) -> float:
        return self.ended_at - self.started_at

    def finish(self, timeout: float) -> Worker:
        self.join(timeout)
        assert not self.is_alive(), f"{self.name} still running after {timeout}s: it hangs"
        return self


def start(fn: Callable[[], Any], name: str = "fault-worker") -> Worker:
    worker = Worker(fn, name)
    worker.start()
    return worker
