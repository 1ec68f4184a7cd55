"""Small helpers the test suites share."""

from __future__ import annotations

import time
from typing import Any, Callable, List, Tuple

#: The loosest upper bound on anything that should be quick: only a hang fails it.
BOUND = 20.0


def distlock_keys(client: Any) -> List[str]:
    """Every distlock key on the server, sorted (SCAN, never KEYS)."""
    return sorted(k.decode() for k in client.scan_iter(match="distlock:*", count=1000))


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
