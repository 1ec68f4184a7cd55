"""Code for spawned child processes of tests/aio/test_aio_processes.py and tests/faults/test_aio_faults.py:
``distlock.asyncio`` primitives in a loop of their own (``asyncio.run``), and the blocking
classes in threads, side by side on one name.

Each worker is a top-level function (spawn imports it by reference) that talks to the test
through its end of a ``multiprocessing.Pipe`` (the last argument, as ``_procs.Children``
passes it). Messages are tuples whose first item says what they are; ``Mailbox`` on the test's
side takes them by that kind. Every receive and every wait is bounded, so a worker whose test
went away exits by itself. An asyncio worker never blocks its loop on the pipe (it polls it),
so that ``on_lost`` callbacks, which run in that loop, are not held up.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

from _aio import run_in_loop
from _sem_event_barrier_workers import _ENTER  # INCR a gauge and raise its high-water mark, in one step
from faults import _PermitAsLock

import distlock
import distlock.asyncio as aio
from distlock._redis.urls import client_from_url

#: A worker whose test sends nothing for this long exits.
IDLE_LIMIT = 60.0


def configure(settings: Optional[Dict[str, float]]) -> None:
    if settings:
        distlock.configure(**settings)  # type: ignore[arg-type]


def make_async(kind: str, name: str, client: Any, lease: Optional[float] = None) -> Any:
    """A ``distlock.asyncio`` lock of ``kind`` (a semaphore of value 1 for "DistSemaphore")."""
    if kind == "DistSemaphore":
        return _PermitAsLock(aio.DistSemaphore(name, 1, client=client, lease=lease))
    return getattr(aio, kind)(name, client=client, lease=lease)


def make_sync(kind: str, name: str, client: Any, lease: Optional[float] = None) -> Any:
    if kind == "DistSemaphore":
        return distlock.DistSemaphore(name, 1, client=client, lease=lease)
    return getattr(distlock, kind)(name, client=client, lease=lease)


def arun(url: str, body: Callable[[Any], Any], bound: float) -> Any:
    return run_in_loop(url, body, bound)


async def _next_order(conn: Any, deadline: float) -> Any:
    """The next message from the test, without blocking the loop; None at ``deadline`` or when
    the test has gone."""
    while time.monotonic() < deadline:
        try:
            if conn.poll(0):
                return conn.recv()
        except (EOFError, OSError):
            return None
        await asyncio.sleep(0.01)
    return None


def _next_order_sync(conn: Any) -> Any:
    try:
        if not conn.poll(IDLE_LIMIT):
            return None
        return conn.recv()
    except (EOFError, OSError):
        return None


def _send(conn: Any, *message: Any) -> bool:
    try:
        conn.send(message)
        return True
    except (BrokenPipeError, ConnectionResetError, OSError):
        return False


# --- a read-modify-write counter under the lock ------------------------------------------------

def count_async(url: str, kind: str, name: str, counter: str, gauge: str, tasks: int, rounds: int,
                reenter: bool, give_up_after: float, conn: Any) -> None:
    """``tasks`` tasks of one loop, each ``rounds`` times: take the lock (an asyncio one),
    raise the gauge, GET the counter, pause, SET it one higher, lower the gauge, release.
    Two lock objects are shared by the tasks (as one ``asyncio.Lock`` is shared by tasks);
    ``reenter`` (DistRLock): the holding task takes it once more inside. Sends ("ready", pid),
    waits for "go", then sends ("done", increments, tokens, errors)."""

    async def body(aclient: Any) -> Tuple[int, List[int], List[str]]:
        enter = aclient.register_script(_ENTER)
        locks = [make_async(kind, name, aclient) for _ in range(2)]
        done: List[int] = []
        tokens: List[int] = []
        errors: List[str] = []
        deadline = time.monotonic() + give_up_after

        async def work(i: int) -> None:
            lock = locks[i % len(locks)]
            for _ in range(rounds):
                if time.monotonic() > deadline:
                    errors.append("gave up")
                    return
                if not await lock.acquire(timeout=give_up_after):
                    errors.append("acquire timed out")
                    return
                try:
                    if reenter:
                        assert await lock.acquire(blocking=False) is True
                    tokens.append(int(lock.token or 0))
                    await enter(keys=(gauge, gauge + ":high"))
                    value = int(await aclient.get(counter) or 0)
                    await asyncio.sleep(0.001)
                    await aclient.set(counter, value + 1)
                    await aclient.decr(gauge)
                    if reenter:
                        await lock.release()
                finally:
                    await lock.release()
                done.append(1)

        results = await asyncio.gather(*(work(i) for i in range(tasks)), return_exceptions=True)
        errors += [repr(r) for r in results if isinstance(r, BaseException)]
        return len(done), tokens, errors

    if not _send(conn, "ready", os.getpid()) or _next_order_sync(conn) != "go":
        return
    try:
        done, tokens, errors = arun(url, body, give_up_after + 30.0)
    except BaseException as exc:  # noqa: BLE001 - reported to the test
        _send(conn, "done", 0, [], [repr(exc)])
        return
    _send(conn, "done", done, tokens, errors)


def count_sync(url: str, kind: str, name: str, counter: str, gauge: str, threads: int, rounds: int,
               reenter: bool, give_up_after: float, conn: Any) -> None:
    """``count_async`` with the blocking classes, in ``threads`` threads of this process
    (each with a lock object of its own; ``reenter``: the holding thread takes it again)."""
    client = client_from_url(url)
    enter = client.register_script(_ENTER)
    done: List[int] = []
    tokens: List[int] = []
    errors: List[str] = []
    mutex = threading.Lock()
    deadline = time.monotonic() + give_up_after

    def work() -> None:
        lock = make_sync(kind, name, client)
        try:
            for _ in range(rounds):
                if time.monotonic() > deadline:
                    errors.append("gave up")
                    return
                if not lock.acquire(timeout=give_up_after):
                    errors.append("acquire timed out")
                    return
                try:
                    if reenter:
                        assert lock.acquire(blocking=False) is True
                    token = int(lock.token or 0)
                    enter(keys=(gauge, gauge + ":high"))
                    value = int(client.get(counter) or 0)
                    time.sleep(0.001)
                    client.set(counter, value + 1)
                    client.decr(gauge)
                    if reenter:
                        lock.release()
                finally:
                    lock.release()
                with mutex:
                    done.append(1)
                    tokens.append(token)
        except BaseException as exc:  # noqa: BLE001 - reported to the test
            errors.append(repr(exc))

    if not _send(conn, "ready", os.getpid()) or _next_order_sync(conn) != "go":
        return
    workers = [threading.Thread(target=work, name=f"count-{i}", daemon=True) for i in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(give_up_after + 30.0)
    if any(worker.is_alive() for worker in workers):
        errors.append("a thread hangs")
    _send(conn, "done", len(done), list(tokens), errors)


# --- one holder, one waiter ---------------------------------------------------------------

def async_holder(url: str, kind: str, name: str, lease: Optional[float],
                 settings: Optional[Dict[str, float]], conn: Any) -> None:
    """Take an asyncio lock of ``kind``; send ("acquired", token, monotonic time, pid, ok).
    Its ``on_lost`` callback sends ("on_lost", monotonic time, whether it ran in this loop,
    whether in the loop's thread, whether it was handed the lock). Then obey orders:
    ("release",) -> ("release", outcome); ("owned",) -> ("owned", owned, token);
    ("write", resource, token) -> ("write", accepted); ("exit",) or silence -> exit."""
    configure(settings)

    async def body(aclient: Any) -> None:
        loop = asyncio.get_running_loop()
        lock = make_async(kind, name, aclient, lease)
        subject = lock.sem if kind == "DistSemaphore" else lock

        def lost(which: Any) -> None:
            _send(conn, "on_lost", time.monotonic(), asyncio.get_running_loop() is loop,
                  threading.current_thread() is threading.main_thread(), which is subject)

        lock.on_lost(lost)
        ok = await lock.acquire(timeout=30)
        if not _send(conn, "acquired", lock.token if ok else None, time.monotonic(), os.getpid(), ok):
            return
        deadline = time.monotonic() + IDLE_LIMIT
        while True:
            order = await _next_order(conn, deadline)
            if order is None or order[0] == "exit":
                return
            deadline = time.monotonic() + IDLE_LIMIT
            if order[0] == "release":
                try:
                    await lock.release()
                    outcome = "ok"
                except BaseException as exc:  # noqa: BLE001 - reported to the test
                    outcome = type(exc).__name__
                await asyncio.sleep(0.05)  # an on_lost the release found is sent first
                _send(conn, "release", outcome)
            elif order[0] == "owned":
                _send(conn, "owned", lock.owned(), lock.token)
            elif order[0] == "write":
                resource, token = order[1], order[2]
                _send(conn, "write", resource.write(token, f"pid{os.getpid()}"))

    try:
        arun(url, body, IDLE_LIMIT * 4)
    except BaseException as exc:  # noqa: BLE001 - reported to the test
        _send(conn, "error", repr(exc))


def async_waiter(url: str, kind: str, name: str, timeout: float,
                 settings: Optional[Dict[str, float]], conn: Any) -> None:
    """Send ("ready", pid); on "go", send ("waiting",), acquire an asyncio lock of ``kind``
    with ``timeout``, send ("got", ok, monotonic time it returned, token) and release what it
    got."""
    configure(settings)

    async def body(aclient: Any) -> None:
        lock = make_async(kind, name, aclient)
        if not _send(conn, "ready", os.getpid()):
            return
        if await _next_order(conn, time.monotonic() + IDLE_LIMIT) != "go":
            return
        _send(conn, "waiting")
        ok = await lock.acquire(timeout=timeout)
        got_at = time.monotonic()
        token = lock.token
        if ok:
            await lock.release()
        _send(conn, "got", ok, got_at, token)

    try:
        arun(url, body, timeout + IDLE_LIMIT + 30.0)
    except BaseException as exc:  # noqa: BLE001 - reported to the test
        _send(conn, "error", repr(exc))


def sync_waiter(url: str, kind: str, name: str, timeout: float,
                settings: Optional[Dict[str, float]], conn: Any) -> None:
    """``async_waiter`` with the blocking class of ``kind``, in this process' main thread."""
    configure(settings)
    lock = make_sync(kind, name, client_from_url(url))
    if not _send(conn, "ready", os.getpid()) or _next_order_sync(conn) != "go":
        return
    _send(conn, "waiting")
    try:
        ok = lock.acquire(timeout=timeout)
    except BaseException as exc:  # noqa: BLE001 - reported to the test
        _send(conn, "error", repr(exc))
        return
    got_at = time.monotonic()
    token = getattr(lock, "token", None)
    if ok:
        lock.release()
    _send(conn, "got", ok, got_at, token)


# --- the test's side ------------------------------------------------------------------------

class Mailbox:
    """The test's end of a worker's pipe: ``take(kind)`` returns the next message of that kind
    and keeps the others for later; an AssertionError when none comes within the bound."""

    def __init__(self, conn: Any) -> None:
        self.conn = conn
        self.pending: List[Tuple[Any, ...]] = []

    def send(self, message: Any) -> None:
        self.conn.send(message)

    def take(self, kind: str, timeout: float = 30.0) -> Tuple[Any, ...]:
        for i, message in enumerate(self.pending):
            if message[0] == kind:
                return self.pending.pop(i)
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            assert left > 0 and self.conn.poll(left), f"no {kind!r} message within {timeout} s " \
                                                     f"(seen: {self.pending})"
            message = tuple(self.conn.recv())
            if message[0] == "error" and kind != "error":
                raise AssertionError(f"the worker failed: {message[1]}")
            if message[0] == kind:
                return message
            self.pending.append(message)

    def has(self, kind: str, wait: float = 0.0) -> bool:
        """Whether a message of ``kind`` came (looking ``wait`` seconds more for one)."""
        deadline = time.monotonic() + wait
        while True:
            if any(m[0] == kind for m in self.pending):
                return True
            left = deadline - time.monotonic()
            if not self.conn.poll(max(0.0, left)):
                return any(m[0] == kind for m in self.pending)
            self.pending.append(tuple(self.conn.recv()))
