"""The asyncio ports in use: one per ``redis.asyncio`` client and event loop (a client's
connections belong to the loop that opened them), made on first need by the port class that
``distlock._redis`` picks for the client's topology, with its holds in the blocking session of
the same server (``session_for``). Kept in a weak map: a port goes with its client."""

from __future__ import annotations

import asyncio
import weakref
from typing import Any, Dict, List

from .._redis import async_port_class
from .._redis.aport import AsyncPort
from .session import session_for

__all__ = ["port_for", "live_ports"]

#: ports per asyncio client; each client's list holds one port per loop it was used in
_ports: weakref.WeakKeyDictionary[Any, List[AsyncPort]] = weakref.WeakKeyDictionary()


def port_for(client: Any) -> AsyncPort:
    """The port of ``client`` in the running loop (made on first need)."""
    loop = asyncio.get_running_loop()
    ports = _ports.get(client)
    if ports is None:
        ports = _ports[client] = []
    for port in ports:
        if port.loop_ref() is loop and port.live:
            return port
    ports[:] = [p for p in ports if p.loop_ref() is not None and not p.loop_ref().is_closed() and p.live]  # type: ignore[union-attr]
    made: AsyncPort = async_port_class(client)(client, loop, session_for)
    ports.append(made)
    return made


def live_ports() -> Dict[int, List[AsyncPort]]:
    """For tests: the ports alive, per client id."""
    return {id(client): list(ports) for client, ports in list(_ports.items())}
