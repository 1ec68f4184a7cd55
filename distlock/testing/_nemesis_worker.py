"""One worker process of ``distlock.testing.nemesis``: threads (or tasks) that take locks on a few
names, write to a fenced store while they believe they hold them, and record every belief and
write in a shared ``History``.

Run by the nemesis as ``python -m distlock.testing._nemesis_worker CONFIG_JSON``. A holder follows
the belief rule of docs/safety.rst: before each write it asks ``valid_for()``, and when that is 0
it stops believing, at the hold's local deadline, and writes no more. Its lease is explicit (no
renewals), so that the deadline is fixed when ``acquire`` returns.
"""

from __future__ import annotations

import asyncio
import json
import random
import sys
import threading
import time
from typing import Any, Dict, Iterator, List, Optional

import redis
import redis.asyncio

from .fenced import FencedStore
from .history import History

__all__ = ["main"]

#: What a worker shrugs off and tries again after: the server or the network failed it.
_TRANSIENT = (redis.ConnectionError, redis.TimeoutError, redis.ResponseError, OSError)


class _Plan:
    def __init__(self, config: Dict[str, Any]) -> None:
        self.url: str = config["url"]
        self.names = list(config["names"])
        self.threads = int(config["threads"])
        self.lease = float(config["lease"])
        self.until = time.monotonic() + float(config["seconds"])
        self.history = History(config["history"])
        self.store = FencedStore(config["store"])
        self.shell: str = config.get("shell", "threads")
        self.writes = int(config.get("writes", 3))


def _believing(plan: _Plan, lock: Any, name: str, token: Optional[int]) -> Iterator[float]:
    """While the hold is believed: write, pause a little (the caller sleeps what this yields,
    in its own way), write again. The belief's end is recorded before any release."""
    deadline = time.monotonic() + lock.valid_for()
    hold = plan.history.begin(name, token)
    for _ in range(plan.writes):
        if lock.valid_for() <= 0:
            plan.history.end(hold, "deadline", at=max(deadline, hold.start))
            return
        assert token is not None
        accepted, decided = plan.store.write(name, token)
        plan.history.write(name, token, accepted, at=decided)
        yield plan.lease / 20
    if lock.valid_for() <= 0:
        plan.history.end(hold, "deadline", at=max(deadline, hold.start))
    else:
        plan.history.end(hold, "released")


def _thread_loop(plan: _Plan, client: Any) -> None:
    import distlock

    rng = random.Random()
    while time.monotonic() < plan.until:
        name = rng.choice(plan.names)
        lock = distlock.DistLock(name, client=client, lease=plan.lease)
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
        lock = dla.DistLock(name, client=client, lease=plan.lease)
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


def _client(plan: _Plan) -> Any:
    # a partitioned holder's calls give up after half a lease, so that it keeps trying
    return redis.Redis.from_url(plan.url, socket_timeout=plan.lease / 2,
                                socket_connect_timeout=plan.lease / 2)


def _run_threads(plan: _Plan) -> None:
    client = _client(plan)
    threads = [threading.Thread(target=_thread_loop, args=(plan, client), daemon=True,
                                name=f"nemesis-worker-{i}") for i in range(plan.threads)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(max(0.0, plan.until - time.monotonic()) + 30 * plan.lease + 10)


async def _run_tasks(plan: _Plan) -> None:
    client = redis.asyncio.Redis.from_url(plan.url, socket_timeout=plan.lease / 2,
                                          socket_connect_timeout=plan.lease / 2)
    try:
        await asyncio.gather(*(_task_loop(plan, client) for _ in range(plan.threads)))
    finally:
        closer = getattr(client, "aclose", None) or client.close
        await closer()


def main(argv: Optional[List[str]] = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    plan = _Plan(json.loads(args[0]))
    print("ready", flush=True)
    if plan.shell == "asyncio":
        asyncio.run(_run_tasks(plan))
    else:
        _run_threads(plan)
    return 0


if __name__ == "__main__":
    sys.exit(main())
