"""One worker process of ``distlock.testing.nemesis``: threads (or tasks) that take locks on a few
names, write to a fenced store while they believe they hold them, and record every belief and
write in a shared ``History``. Under the ``election`` workload they campaign instead
(``DistElection``, a short timeout): a leadership is recorded as a hold, its epoch the token of
its writes, from ``campaign``'s return until ``resign`` or until it is no longer believed.

Run by the nemesis as ``python -m distlock.testing._nemesis_worker CONFIG_JSON``. A holder follows
the belief rule of docs/safety.rst: before each write it asks ``valid_for()``, and when that is 0
it stops believing, at the hold's local deadline, and writes no more. Its lease is explicit (no
renewals), so that the deadline is fixed when ``acquire`` returns.
"""

from __future__ import annotations

import asyncio
import faulthandler
import json
import os
import random
import signal
import sys
import threading
import time
from typing import Any, Dict, Iterator, List, Optional

import redis
import redis.asyncio
import redis.asyncio.sentinel
import redis.sentinel

from distlock._core.errors import NotEnoughReplicasError, QuorumError

from .fenced import FencedStore
from .history import History
from .sentinel import aclose_sentinel

__all__ = ["main"]

#: What a worker shrugs off and tries again after: the server or the network failed it (or,
#: under Redlock, too few masters answered; under Sentinel with ``min_replicas``, too few
#: replicas acknowledged; a sentinel named no master: MasterNotFoundError is a ConnectionError;
#: redis-py's cluster client could reach no node: RedisClusterException, not a RedisError).
_TRANSIENT = (redis.ConnectionError, redis.TimeoutError, redis.ResponseError, OSError,
              QuorumError, NotEnoughReplicasError, redis.exceptions.RedisClusterException)


class _Plan:
    def __init__(self, config: Dict[str, Any]) -> None:
        #: one URL, or a Redlock's masters' (each through its proxy)
        self.urls: List[str] = list(config["urls"])
        self.names = list(config["names"])
        self.threads = int(config["threads"])
        self.lease = float(config["lease"])
        self.until = time.monotonic() + float(config["seconds"])  # until the nemesis says
        self.history = History(config["history"])
        self.store = FencedStore(config["store"])
        self.shell: str = config.get("shell", "threads")
        self.writes = int(config.get("writes", 3))
        #: Sentinel: the sentinels' addresses, and each data node's address -> this worker's
        #: proxy of it (``_remapped``); None on the other topologies
        self.sentinels: Optional[List[List[Any]]] = config.get("sentinels")
        self.remap = {(h, int(p)): (ph, int(pp)) for h, p, ph, pp in config.get("remap", [])}
        #: the locks' ``min_replicas`` (Sentinel), or None
        self.min_replicas: Optional[int] = config.get("min_replicas")
        #: Redis Cluster: the client maps every node's address to this worker's proxy of it
        #: (redis-py's ``address_remap``), the first proxy its startup node
        self.cluster = bool(config.get("cluster", False))
        #: ``lock`` (DistLock) or ``election`` (DistElection): what the threads (tasks) contend with
        self.workload: str = config.get("workload", "lock")

    def lock_options(self) -> Dict[str, Any]:
        options: Dict[str, Any] = {"lease": self.lease}
        if self.min_replicas is not None:
            options.update(min_replicas=self.min_replicas, replica_timeout=self.lease / 2)
        return options


def _believing(plan: _Plan, lock: Any, name: str, token: Optional[int]) -> Iterator[float]:
    """While the hold is believed: write, pause a little (the caller sleeps what this yields,
    in its own way), write again. The belief's end is recorded before any release, at the
    moment the holder stopped believing and no later than its local deadline: a holder paused
    between its last look and its record must not seem to have believed longer than it could."""
    left = lock.valid_for()
    if left <= 0 or token is None:
        return  # paused between acquire and here: it never believed in time to act
    deadline = time.monotonic() + left
    hold = plan.history.begin(name, token)
    cause = "released"
    for _ in range(plan.writes):
        if lock.valid_for() <= 0:
            cause = "lost"  # suspended, lost, or past its deadline (then it ends there)
            break
        accepted, decided = plan.store.write(name, token)
        plan.history.write(name, token, accepted, at=decided)
        yield plan.lease / 20
    else:
        if lock.valid_for() <= 0:
            cause = "lost"
    now = time.monotonic()
    if now >= deadline:
        plan.history.end(hold, "deadline", at=max(deadline, hold.start))
    elif cause == "lost":
        plan.history.end(hold, cause, at=max(_unbelieved_at(lock, now), hold.start))
    else:
        plan.history.end(hold, cause, at=now)


def _unbelieved_at(lock: Any, now: float) -> float:
    """When distlock stopped believing the lock's hold (suspended on a reset connection, or
    lost), which a holder that looks only between its writes sees up to a pause late: the
    hold's own record (``Hold.unbelieved_at``); ``now`` if it has none."""
    try:
        hold = lock._current(lock._session())  # distlock's own tool may look inside
    except Exception:  # noqa: BLE001 - released meanwhile: the holder's own look is the end
        return now
    return min(now, getattr(hold, "unbelieved_at", 0.0) or now)


def _thread_loop(plan: _Plan, client: Any, failures: List[BaseException]) -> None:
    try:
        (_electing if plan.workload == "election" else _locking)(plan, client)
    except BaseException as exc:  # noqa: BLE001 - reported by the process' exit status
        failures.append(exc)
        raise


def _locking(plan: _Plan, client: Any) -> None:
    import distlock

    rng = random.Random()
    while time.monotonic() < plan.until:
        name = rng.choice(plan.names)
        lock = distlock.DistLock(name, client=client, **plan.lock_options())
        try:
            if not lock.acquire(timeout=plan.lease):
                continue
        except _TRANSIENT:
            time.sleep(plan.lease / 10)
            continue
        for pause in _believing(plan, lock, name, lock.token):
            time.sleep(pause)
        try:
            lock.release()
        except (distlock.LockLostError, distlock.LockNotOwnedError, *_TRANSIENT):
            pass  # its belief had ended already: nothing to undo here


async def _task_loop(plan: _Plan, client: Any) -> None:
    import distlock
    import distlock.asyncio as dla

    rng = random.Random()
    while time.monotonic() < plan.until:
        name = rng.choice(plan.names)
        lock = dla.DistLock(name, client=client, **plan.lock_options())
        try:
            await asyncio.wait_for(lock.acquire(), plan.lease)
        except asyncio.TimeoutError:
            continue
        except _TRANSIENT:
            await asyncio.sleep(plan.lease / 10)
            continue
        for pause in _believing(plan, lock, name, lock.token):  # its writes: short file I/O
            await asyncio.sleep(pause)
        try:
            await lock.release()
        except (distlock.LockLostError, distlock.LockNotOwnedError, *_TRANSIENT):
            pass


class _Leading:
    """A leadership as ``_believing`` reads a lock: believed while ``is_leader()`` is true and
    ``valid_for()`` above 0; when distlock stopped believing it, its candidate lock's hold
    says (``_unbelieved_at``)."""

    def __init__(self, leadership: Any) -> None:
        self.leadership = leadership
        self._lock = leadership.election._lock  # distlock's own tool may look inside

    def valid_for(self) -> float:
        return float(self.leadership.valid_for()) if self.leadership.is_leader() else 0.0

    def _session(self) -> Any:
        return self._lock._session()

    def _current(self, session: Any) -> Any:
        return self._lock._current(session)


def _electing(plan: _Plan, client: Any) -> None:
    """The ``election`` workload, in a thread: campaign for one of the names (a lease's
    timeout), write with the epoch while leading, resign."""
    import distlock

    rng = random.Random()
    value = f"worker {os.getpid()} {threading.current_thread().name}"
    while time.monotonic() < plan.until:
        name = rng.choice(plan.names)
        election = distlock.DistElection(name, client=client, **plan.lock_options())
        try:
            leadership = election.campaign(value, timeout=plan.lease)
        except TimeoutError:  # not elected in time (a builtin TimeoutError, not redis')
            continue
        except _TRANSIENT:
            time.sleep(plan.lease / 10)
            continue
        for pause in _believing(plan, _Leading(leadership), name, leadership.epoch):
            time.sleep(pause)
        try:
            leadership.resign()
        except (distlock.LockLostError, distlock.LockNotOwnedError, *_TRANSIENT):
            pass  # its belief had ended already: nothing to give up


async def _task_electing(plan: _Plan, client: Any) -> None:
    """The ``election`` workload, in a task (``_electing``)."""
    import distlock
    import distlock.asyncio as dla

    rng = random.Random()
    value = f"worker {os.getpid()} task {id(asyncio.current_task())}"
    while time.monotonic() < plan.until:
        name = rng.choice(plan.names)
        election = dla.DistElection(name, client=client, **plan.lock_options())
        try:
            leadership = await election.campaign(value, timeout=plan.lease)
        except TimeoutError:
            continue
        except _TRANSIENT:
            await asyncio.sleep(plan.lease / 10)
            continue
        for pause in _believing(plan, _Leading(leadership), name, leadership.epoch):
            await asyncio.sleep(pause)
        try:
            await leadership.resign()
        except (distlock.LockLostError, distlock.LockNotOwnedError, *_TRANSIENT):
            pass


def _client(plan: _Plan, module: Any = redis) -> Any:
    """The ``client=`` of the worker's locks: one client, a list of them (Redlock), or a
    Sentinel master client, of ``module`` (``redis`` or ``redis.asyncio``). A partitioned
    holder's calls give up after half a lease, so that it keeps trying."""
    timeouts = {"socket_timeout": plan.lease / 2, "socket_connect_timeout": plan.lease / 2}
    if plan.sentinels is not None:
        return _remapped(plan, module).master_for("distlock", **timeouts)
    if plan.cluster:
        remap = plan.remap

        def address_remap(addr: Any) -> Any:
            return remap.get((addr[0], int(addr[1])), addr)
        first = redis.Redis.from_url(plan.urls[0]).connection_pool.connection_kwargs
        return module.RedisCluster(host=first["host"], port=first["port"],
                                   address_remap=address_remap, **timeouts)
    clients = [module.Redis.from_url(url, **timeouts) for url in plan.urls]
    return clients[0] if len(clients) == 1 else clients


def _remapped(plan: _Plan, module: Any) -> Any:
    """A Sentinel (``module``'s) whose master is reached through this worker's proxy of it:
    the sentinels name the nodes' own addresses, which would bypass the proxies, so the
    address they name is mapped to the proxy's (docs/guides/testing.rst). The sentinels
    themselves are reached directly: a worker cut off from the data is not cut off from them."""
    remap = plan.remap
    sentinels = [(h, int(p)) for h, p in plan.sentinels or []]
    kwargs: Dict[str, Any] = {"sentinel_kwargs": {"socket_timeout": 1.0, "socket_connect_timeout": 1.0}}
    if module is redis:
        class Remapped(redis.sentinel.Sentinel):
            def discover_master(self, service_name: str) -> Any:
                found = super().discover_master(service_name)  # type: ignore[no-untyped-call,unused-ignore]
                return remap.get((found[0], int(found[1])), found)
        return Remapped(sentinels, **kwargs)  # type: ignore[no-untyped-call,unused-ignore]

    class AsyncRemapped(redis.asyncio.sentinel.Sentinel):
        async def discover_master(self, service_name: str) -> Any:
            found = await super().discover_master(service_name)
            return remap.get((found[0], int(found[1])), found)
    return AsyncRemapped(sentinels, **kwargs)  # type: ignore[no-untyped-call,unused-ignore]


def _run_threads(plan: _Plan) -> int:
    """Run the threads; 1 if one of them failed or did not end in time."""
    client = _client(plan)
    failures: List[BaseException] = []
    threads = [threading.Thread(target=_thread_loop, args=(plan, client, failures), daemon=True,
                                name=f"nemesis-worker-{i}") for i in range(plan.threads)]
    for thread in threads:
        thread.start()
    for thread in threads:  # ``until`` may move later meanwhile: read it afresh
        while thread.is_alive() and time.monotonic() <= plan.until + 30 * plan.lease + 10:
            thread.join(0.1)
    hung = [t.name for t in threads if t.is_alive()]
    if hung:
        print(f"nemesis worker: threads did not end: {', '.join(hung)}", file=sys.stderr)
    return 1 if failures or hung else 0


async def _run_tasks(plan: _Plan) -> None:
    client = _client(plan, redis.asyncio)
    # a worker that hangs is asked for its tasks' stacks too (SIGUSR2), which faulthandler
    # cannot give: the loop answers it, if it still runs
    asyncio.get_running_loop().add_signal_handler(signal.SIGUSR2, _print_tasks)
    try:
        loop = _task_electing if plan.workload == "election" else _task_loop
        await asyncio.gather(*(loop(plan, client) for _ in range(plan.threads)))
    finally:
        for each in client if isinstance(client, list) else [client]:
            closer = getattr(each, "aclose", None) or each.close
            await closer()
        if plan.sentinels is not None:
            await aclose_sentinel(client.connection_pool.sentinel_manager)


def _print_tasks() -> None:
    for task in asyncio.all_tasks():
        task.print_stack(file=sys.stderr)
    sys.stderr.flush()


def _follow(plan: _Plan) -> None:
    """Read the ends of the run the nemesis sends later (``_Workers.tell``). A pipe that
    closes while the end is still open (the nemesis died during a fault) ends the run now:
    a worker never outlives its nemesis for good."""
    for line in sys.stdin:
        try:
            plan.until = float(line)
        except ValueError:
            pass
    if plan.until == float("inf"):
        plan.until = time.monotonic()


def main(argv: Optional[List[str]] = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    plan = _Plan(json.loads(args[0]))
    # a worker that hangs is asked for its threads' stacks (SIGUSR1) before it is killed
    faulthandler.register(signal.SIGUSR1, file=sys.stderr, all_threads=True)
    signal.signal(signal.SIGUSR2, signal.SIG_IGN)  # the asyncio shell answers it (_print_tasks)
    import distlock  # noqa: F401 - imported before "ready", so that every worker starts alike

    print("ready", flush=True)
    # the nemesis answers with when the run ends (time.monotonic() is one clock for the host),
    # and may move it (while a fault lasts, and after it healed) until it closes the pipe
    plan.until = float(sys.stdin.readline())
    threading.Thread(target=_follow, args=(plan,), daemon=True, name="nemesis-until").start()
    if plan.shell == "asyncio":
        asyncio.run(_run_tasks(plan))
        signal.signal(signal.SIGUSR2, signal.SIG_IGN)  # the closed loop gave it back its default
        return 0
    return _run_threads(plan)


if __name__ == "__main__":
    sys.exit(main())
