"""The session layer: what one process keeps per Redis server and user, above the executors.

``session`` (the session: its executor, its dispatcher, its holds; fork and exit hooks),
``hold`` (a hold, and the belief rule: how long it is believed), ``watchdog`` (the one
thread that keeps every hold's deadline and starts the batched renewals, reporting lost
leases), ``worker`` (the threads that do the watchdog's I/O),
``ports`` (the asyncio ports in use, per client and event loop, each with its holds in the
blocking session of its server), ``config`` (``configure()`` and the default clients),
``metrics`` and ``telemetry`` (counters and OpenTelemetry spans). It imports ``distlock._redis``
and ``distlock._core``, never the primitives above it. See docs/design.rst, principles 3 and 11.
"""

from .session import reset_sessions, session_for

__all__ = ["reset_sessions", "session_for"]
