"""Tools for testing code that uses distlock: what distlock's own tests use, made public.

``RedisServer`` starts a private ``redis-server`` (or ``$DISTLOCK_SERVER_BIN``: a
``valkey-server``, say) on a free loopback port, with no persistence, and stops it; its ``url``
is what to give ``client=``. ``free_port`` and ``redis_server_binary`` are its helpers.
Importing this package imports neither pytest nor any server: nothing starts until asked.
"""

from .server import RedisServer, free_port, redis_server_binary

__all__ = ["RedisServer", "free_port", "redis_server_binary"]
