"""A process that calls a DistlockLockManager for tests/contrib/test_prefect.py (spawn:
importable, top-level). The manager arrives pickled, as Prefect hands result stores on."""

from __future__ import annotations

from typing import Any


def serve(manager: Any, conn: Any) -> None:
    """Run each ``(method, args, kwargs)`` received on ``manager``; send back ``("ok",
    result)`` or ``("error", exception class name, message)``; stop at None."""
    while True:
        call = conn.recv()
        if call is None:
            return
        method, args, kwargs = call
        try:
            conn.send(("ok", getattr(manager, method)(*args, **kwargs)))
        except Exception as exc:  # noqa: BLE001 - reported to the test
            conn.send(("error", type(exc).__name__, str(exc)))
