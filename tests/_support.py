"""Small helpers the test suites share."""

from __future__ import annotations

import math
import selectors
import subprocess
import time
from typing import Any, Callable, List, Tuple

#: The loosest upper bound on anything that should be quick: only a hang fails it.
BOUND = 20.0


def distlock_keys(client: Any) -> List[str]:
    """Every distlock key on the server, sorted (SCAN, never KEYS)."""
    return sorted(k.decode() for k in client.scan_iter(match="distlock:*", count=1000))


def sem_permits(client: Any, key: str) -> List[Tuple[bytes, float]]:
    """The permits recorded in semaphore key ``key`` (expired ones included, counters left
    out), as (id, lease deadline in server ms), by deadline. A permit taken at rest is scored
    +inf in Redis: its deadline is the key's expiry, read here as the server's time + PTTL."""
    with client.pipeline(transaction=False) as pipe:
        pipe.zrangebyscore(key, 0, "+inf", withscores=True)
        pipe.time()
        pipe.pttl(key)
        rows, (seconds, micros), pttl = pipe.execute()
    expiry = seconds * 1000 + micros // 1000 + pttl
    return sorted(((member, expiry if math.isinf(score) else score) for member, score in rows),
                  key=lambda row: row[1])


def settle(check: Callable[[], Any], bound: float) -> bool:
    """Wait until ``check()`` is true, at most ``bound`` seconds; return whether it became so."""
    deadline = time.monotonic() + bound
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def until(check: Callable[[], Any], bound: float = BOUND) -> None:
    """Wait until ``check()`` is true; fail the test after ``bound`` seconds."""
    deadline = time.monotonic() + bound
    while not check():
        assert time.monotonic() < deadline, "condition not reached within the bound"
        time.sleep(0.02)


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
