"""DistSemaphore, DistEvent and DistBarrier code that runs in spawned child processes.

Each worker is a top-level function (spawn imports it by reference) talking to the test through
one end of a ``multiprocessing.Pipe``; every receive and every wait is bounded, so a worker
whose test has gone away exits by itself.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any, Dict, List, Optional

import distlock
from distlock import DistBarrier, DistEvent, DistSemaphore
from distlock._redis.urls import client_from_url

IDLE_LIMIT = 60.0

#: INCR a gauge and raise a high-water mark in one step: how many are inside at once.
_ENTER = """
local v = redis.call('incr', KEYS[1])
if v > tonumber(redis.call('get', KEYS[2]) or '0') then redis.call('set', KEYS[2], v) end
return v
"""


def _configure(settings: Optional[Dict[str, float]]) -> None:
    if settings:
        distlock.configure(**settings)


def _next(conn: Any) -> Any:
    if not conn.poll(IDLE_LIMIT):
        return None
    try:
        return conn.recv()
    except EOFError:
        return None


def sem_holder(url: str, name: str, value: int, permits: int, settings: Optional[Dict[str, float]],
               conn: Any) -> None:
    """Take ``permits`` permits, send ("held", pid), then hold them until told to release (or
    killed)."""
    _configure(settings)
    sem = DistSemaphore(name, value, client=client_from_url(url))
    try:
        for _ in range(permits):
            if not sem.acquire(timeout=30.0):
                conn.send(("failed", os.getpid()))
                return
        conn.send(("held", os.getpid()))
        if _next(conn) == "release":
            sem.release(permits)
            conn.send(("released", os.getpid()))
    except (BrokenPipeError, ConnectionResetError):
        return


def sem_waiter(url: str, name: str, value: int, timeout: float, conn: Any) -> None:
    """Send ("ready", pid); on "go", send ("waiting",), acquire(timeout), then send ("got", ok)
    and release what it got."""
    sem = DistSemaphore(name, value, client=client_from_url(url))
    try:
        conn.send(("ready", os.getpid()))
        if _next(conn) != "go":
            return
        conn.send(("waiting",))
        ok = sem.acquire(timeout=timeout)
        conn.send(("got", ok))
        if ok:
            sem.release()
    except (BrokenPipeError, ConnectionResetError):
        return


def sem_worker(url: str, name: str, value: int, rounds: int, gauge: str, high: str, conn: Any) -> None:
    """``rounds`` times: acquire, raise the gauge (and its high-water mark), pause, lower it,
    release. Send ("done", rounds completed)."""
    client = client_from_url(url)
    enter = client.register_script(_ENTER)
    sem = DistSemaphore(name, value, client=client)
    done = 0
    try:
        conn.send(("ready", os.getpid()))
        if _next(conn) != "go":
            return
        for _ in range(rounds):
            if not sem.acquire(timeout=30.0):
                break
            try:
                enter(keys=(gauge, high))
                time.sleep(0.002)
                client.decr(gauge)
            finally:
                sem.release()
            done += 1
        conn.send(("done", done))
    except (BrokenPipeError, ConnectionResetError):
        return


def event_waiter(url: str, name: str, timeout: float, conn: Any) -> None:
    """Send ("ready", pid); per "go": send ("waiting",), wait(timeout), send (result, monotonic
    time it returned). Stops on anything else."""
    event = DistEvent(name, client=client_from_url(url))
    try:
        conn.send(("ready", os.getpid()))
        while _next(conn) == "go":
            conn.send(("waiting",))
            ok = event.wait(timeout)
            conn.send((ok, time.monotonic()))
    except (BrokenPipeError, ConnectionResetError):
        return


def _count_action(url: str, counter: str) -> Any:
    client = client_from_url(url)

    def action() -> None:
        client.rpush(counter, os.getpid())

    return action


def barrier_party(url: str, name: str, parties: int, generations: int, counter: Optional[str],
                  timeout: float, settings: Optional[Dict[str, float]], conn: Any) -> None:
    """Send ("ready", pid); on "go", wait on the barrier ``generations`` times and send
    ("indices", [...]) or ("broken", [indices so far]); ("error", repr) on anything else.
    With ``counter``, the action RPUSHes this pid to that list."""
    _configure(settings)
    action = _count_action(url, counter) if counter else None
    barrier = DistBarrier(name, parties, action=action, client=client_from_url(url))
    indices: List[int] = []
    try:
        conn.send(("ready", os.getpid()))
        if _next(conn) != "go":
            return
        conn.send(("arriving",))
        try:
            for _ in range(generations):
                indices.append(barrier.wait(timeout))
        except threading.BrokenBarrierError:
            conn.send(("broken", indices))
            return
        except Exception as exc:  # noqa: BLE001 - reported to the test
            conn.send(("error", repr(exc)))
            return
        conn.send(("indices", indices))
    except (BrokenPipeError, ConnectionResetError):
        return
