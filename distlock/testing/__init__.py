"""Tools for testing code that uses distlock: what distlock's own tests use, made public.

- ``RedisServer`` starts a private ``redis-server`` (or ``$DISTLOCK_SERVER_BIN``: a
  ``valkey-server``, say) on a free loopback port, with no persistence, and stops it; its
  ``url`` is what to give ``client=``. ``free_port`` and ``redis_server_binary`` are its
  helpers.
- ``distlock.testing.cluster``, ``.sentinel`` and ``.redlock`` (imported only when asked for)
  start a Redis Cluster, a Sentinel set and independent masters for Redlock on free loopback
  ports.
- ``FaultProxy(host, port)`` sits between clients and one server and, per direction, passes,
  delays, blackholes or drops replies, and resets every connection on demand.
- ``History`` records what each process believed it held, its fenced writes and the faults;
  ``check_history`` reports overlapping beliefs, tokens that went backwards, stale writes the
  fenced store took, and how long the lock took to be taken again after each fault.
- ``FencedStore`` takes a write only with a token at least as large as the largest it took.
- ``write_timeline`` draws a history: a self-contained HTML file, a row per process, thread
  or task, beliefs as bars, writes as ticks, faults shaded, overlaps outlined in red.
- ``python -m distlock.testing.nemesis`` (``distlock.testing.nemesis``) runs worker processes
  against a private server under faults, records their beliefs and fenced writes, and checks
  the record.
- ``distlock.testing.pytest_plugin`` (opt-in) gives the fixtures ``distlock_server`` and
  ``fault_proxy``.

Importing this package imports neither pytest nor any server: nothing starts until asked.
"""

from .fenced import FencedStore
from .history import BELIEF_ENDS, Fault, History, Hold, Report, Write, check_history
from .proxy import DIRECTIONS, FaultProxy
from .server import RedisServer, free_port, redis_server_binary
from .timeline import timeline_html, write_timeline

__all__ = [
    "RedisServer", "free_port", "redis_server_binary",
    "FaultProxy", "DIRECTIONS", "FencedStore",
    "History", "Hold", "Write", "Fault", "Report", "check_history", "BELIEF_ENDS",
    "timeline_html", "write_timeline",
]
