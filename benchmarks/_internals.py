"""distlock's private names that the benchmarks use, found in either package layout.

``benchmarks/ab.py`` runs this tree's benchmark code against another revision's ``distlock``
(``--base REV``), which may predate the layered layout (``distlock._core``, ``_redis``,
``_session``, ``_primitives``, ``_cli``, ``testing``), when these names lived in flat
``distlock._*`` modules. This module is the one place that knows both; the benchmarks import
from here.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["RedisServer", "free_port", "redis_server_binary", "reset_sessions", "session_for",
           "settings", "Keys", "RWKeys", "config", "metrics", "top"]


def _first(*modules: str) -> Any:
    """The first of ``modules`` that imports (the layered name first, then the flat one)."""
    error: Exception = ImportError(modules[0])
    for name in modules:
        try:
            return importlib.import_module(name)
        except ImportError as exc:
            error = exc
    raise error


_server = _first("distlock.testing.server", "distlock._server")
RedisServer = _server.RedisServer
free_port = _server.free_port
redis_server_binary = _server.redis_server_binary

_session = _first("distlock._session.session", "distlock._session")
reset_sessions = _session.reset_sessions
session_for = _session.session_for

#: the module of ``configure()``'s defaults (``DEFAULT_BARGE_LIMIT``, ``settings``)
settings_module = _first("distlock._core.settings", "distlock._config")
settings = settings_module.settings
#: the module that holds the default clients and ``configure``
config = _first("distlock._session.config", "distlock._config")

Keys = _first("distlock._core.keys", "distlock._logic").Keys
RWKeys = _first("distlock._core.keys", "distlock._rwlogic").RWKeys

metrics = _first("distlock._session.metrics", "distlock._metrics")
top = _first("distlock._cli.top", "distlock._top")
