"""Child-process functions of the DistReadWriteLock tests (spawn: importable, top-level).

Every blocking call here has a timeout, and every worker that waits for orders gives up after a
bounded time, so a test that dies never leaves a worker running for long.
"""

from __future__ import annotations

import random
import time
from typing import Any, List, Optional, Tuple

import distlock
from distlock._redis.urls import client_from_url


def make_rw(url: str, name: str, lease: Optional[float] = None) -> distlock.DistReadWriteLock:
    return distlock.DistReadWriteLock(name, client=client_from_url(url), lease=lease)


def read_at_barrier(url: str, name: str, barrier: Any, results: Any) -> None:
    """Take the read lock, meet every other reader at ``barrier`` inside it, release."""
    reader = make_rw(url, name).read_lock()
    assert reader.acquire(timeout=60)
    try:
        barrier.wait(60)
        results.put(("met", reader.token))
    except Exception as exc:  # noqa: BLE001 - reported to the test
        results.put(("failed", repr(exc)))
    finally:
        reader.release()


def mixed_holds(url: str, name: str, ops: str, seed: int) -> List[Tuple[str, float, float, int]]:
    """For each letter of ``ops`` ('r' or 'w') take that side, hold it a few ms, release.

    Return every hold as (side, start, end, token): start stamped just after acquire() returned
    and end just before release() is called, on the system-wide monotonic clock, so the
    recorded interval lies inside the real hold.
    """
    rw = make_rw(url, name)
    rng = random.Random(seed)
    out = []
    for op in ops:
        side = rw.read_lock() if op == "r" else rw.write_lock()
        assert side.acquire(timeout=60)
        start = time.monotonic()
        token = side.token
        time.sleep(rng.uniform(0.001, 0.008))
        end = time.monotonic()
        side.release()
        out.append((op, start, end, token))
    return out


def hold_read_until_killed(url: str, name: str, conn: Any) -> None:
    """Hold the read lock on a short watchdog lease (1 s, renewed every 0.3 s) and wait to be
    SIGKILLed; report (token, monotonic time just before the grant was asked for)."""
    distlock.configure(lease=1.0, renew_interval=0.3)
    reader = make_rw(url, name).read_lock()
    sent = time.monotonic()
    assert reader.acquire(timeout=60)
    conn.send((reader.token, sent))
    conn.poll(120)  # the test kills us long before


def wait_for_write(url: str, name: str, seq_key: str, timeout: float, hold: float,
                   wait_cap: Optional[float], conn: Any) -> None:
    """Ask for the write lock (blocking, ``timeout``); inside it, take a sequence number from
    ``seq_key`` (INCR) and hold ``hold`` seconds; report (acquired, seq)."""
    if wait_cap is not None:
        distlock.configure(wait_cap=wait_cap)
    client = client_from_url(url)
    writer = distlock.DistReadWriteLock(name, client=client).write_lock()
    conn.send("asking")
    ok = writer.acquire(timeout=timeout)
    seq = -1
    if ok:
        seq = int(client.incr(seq_key))
        time.sleep(hold)
        writer.release()
    conn.send((ok, seq))
    conn.poll(30)


def read_in_sequence(url: str, name: str, seq_key: str, timeout: float) -> int:
    """``read_in_sequence_with`` on a client of its own (for worker processes)."""
    return read_in_sequence_with(client_from_url(url), name, seq_key, timeout)


def read_in_sequence_with(client: Any, name: str, seq_key: str, timeout: float) -> int:
    """Take the read lock (blocking, ``timeout``), INCR ``seq_key`` inside it, release; return
    the sequence number (-1 when the lock could not be taken)."""
    reader = distlock.DistReadWriteLock(name, client=client).read_lock()
    if not reader.acquire(timeout=timeout):
        return -1
    try:
        return int(client.incr(seq_key))
    finally:
        reader.release()
