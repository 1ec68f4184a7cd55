"""Functions that run in child processes (spawn start method: importable, top-level)."""

from __future__ import annotations

import os
import signal
import time
from typing import Any, Dict, Optional

import distlock
from distlock._redis.urls import client_from_url


def make_lock(kind: str, name: str, url: Any, lease: Optional[float] = None) -> Any:
    """The lock on the server at ``url``, or on a Redlock quorum of the servers of a list."""
    cls = {"DistLock": distlock.DistLock, "DistRLock": distlock.DistRLock}[kind]
    client = [client_from_url(u) for u in url] if isinstance(url, list) else client_from_url(url)
    return cls(name, client=client, lease=lease)


def count_under_lock(url: Any, kind: str, name: str, counter: str, n: int, reenter: bool,
                     settings: Optional[Dict[str, Any]] = None) -> int:
    """Read-modify-write ``counter`` n times under the lock; return how many it did. ``url``:
    a server's, or a list of a Redlock quorum's (the counter is then on the first);
    ``settings``: for ``distlock.configure`` first."""
    if settings:
        distlock.configure(**settings)
    lock = make_lock(kind, name, url)
    client = client_from_url(url[0] if isinstance(url, list) else url)
    for _ in range(n):
        with lock:
            if reenter:
                lock.acquire()
            value = int(client.get(counter) or 0)
            client.set(counter, value + 1)
            if reenter:
                lock.release()
    return n


def hold_until_killed(url: str, kind: str, name: str, lease: Optional[float], conn: Any,
                      short_watchdog: bool = False) -> None:
    """Take the lock, report (token, monotonic time the grant was sent), then wait for orders:
    'release' -> release and report the outcome; anything else -> exit."""
    if short_watchdog:
        distlock.configure(lease=1.0, renew_interval=0.25)
    lock = make_lock(kind, name, url, lease)
    lost = []
    lock.on_lost(lambda _lock: lost.append(time.monotonic()))
    sent = time.monotonic()
    assert lock.acquire(timeout=20)
    conn.send((lock.token, sent, os.getpid()))
    while conn.poll(30):
        order = conn.recv()
        if order == "release":
            try:
                lock.release()
                conn.send(("released", bool(lost)))
            except distlock.LockLostError as exc:
                # on_lost is told by the thread that found the loss (the release's, or the
                # watchdog's at the local deadline, which a process just woken from SIGSTOP
                # may not have reached yet): give it a moment
                deadline = time.monotonic() + 5.0
                while not lost and time.monotonic() < deadline:
                    time.sleep(0.01)
                conn.send(("LockLostError", bool(lost), str(exc)))
            except Exception as exc:  # noqa: BLE001 - reported to the test
                conn.send((type(exc).__name__, bool(lost), str(exc)))
        elif order == "lost?":
            conn.send(bool(lost))
        else:
            return


def contend_once(url: str, kind: str, name: str, start_at: float) -> tuple[float, float, int]:
    """Wait until ``start_at`` (monotonic), acquire, hold briefly, release; return the interval
    on the system-wide monotonic clock and the token."""
    lock = make_lock(kind, name, url)
    time.sleep(max(0.0, start_at - time.monotonic()))
    assert lock.acquire(timeout=60)
    began = time.monotonic()
    token = lock.token
    time.sleep(0.01)
    ended = time.monotonic()
    lock.release()
    return began, ended, token


def sleep_forever() -> None:
    signal.pause()
