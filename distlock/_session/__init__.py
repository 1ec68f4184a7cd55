"""The session layer: what one process keeps per Redis server and user, above the executors.

``session`` (the session: its executor, its dispatcher, its holds; fork and exit hooks),
``watchdog`` (the one thread that renews every hold of a session and reports lost leases),
``ports`` (the asyncio ports in use, per client and event loop, each with its holds in the
blocking session of its server), ``config`` (``configure()`` and the default clients),
``metrics`` and ``telemetry`` (counters and OpenTelemetry spans). It imports ``distlock._redis``
and ``distlock._core``, never the primitives above it. See docs/design.rst, principles 3 and 11.
"""

from .session import reset_sessions, session_for

__all__ = ["reset_sessions", "session_for"]
