"""How one script follows a Redis Cluster's redirections: the decisions, without I/O, for both
shells (``executor_cluster`` for threads, ``aport_cluster`` for asyncio).

A script goes once to the master of its keys' slot, by the direct path on that node's own
connection (no retries). The shell makes that first try itself, so a script that is not
redirected costs nothing here. An error in ``REDIRECTED`` means the script did not run, and
``follow`` (a *plan*: a generator) decides what comes next. It yields one step at a time,
``(kind, what)``, which the shell carries out:

- ``SEND``, a node: send the script to it; ``ASK``, a node: send it there behind ``ASKING``.
  A reply ends the plan (the shell returns it); an error in ``REDIRECTED`` is sent into the
  plan; any other error is raised as it is (a connection that failed *after* the send: the
  reply was lost and the script may have run, so it is never sent again, docs/design.rst, principle 13).
- ``MOVED``, the ``MovedError``: record it in the slot map (the new owner is known, so the
  script goes there at once).
- ``REFRESH``: read the slot map again (``NotSent``: a connection to the node could not be
  opened, so nothing was sent). A node still its slot's master afterwards (no failover yet)
  ends the plan with the connection's error.
- ``LOAD``, a node: load the script there (NOSCRIPT: that node lost its script cache); an
  error of the load is raised as it is.
- ``SLEEP``, seconds: pause before the next send (TRYAGAIN, CLUSTERDOWN, a node that was
  replaced), ``FIRST_PAUSE`` first, doubling up to 0.2 s.

All of it is bounded: ``REDIRECTS`` sends within ``REDIRECT_BOUND`` seconds. When the bounds
are spent the plan raises the last error (``NotSent``'s cause, the connection error, for a
node that could not be reached).
"""

from __future__ import annotations

import time
from typing import Any, Callable, Generator, NoReturn, Optional, Tuple

from redis.exceptions import (
    AskError,
    ClusterDownError,
    MovedError,
    NoScriptError,
    RedisError,
    TryAgainError,
)
from redis.exceptions import ConnectionError as RedisConnectionError

__all__ = ["REDIRECTS", "REDIRECT_BOUND", "FIRST_PAUSE", "NotSent", "REDIRECTED", "Redirects",
           "SEND", "ASK", "MOVED", "REFRESH", "LOAD", "SLEEP", "follow", "remapped"]

#: How many times one script is sent again after a redirection or a node it could not reach.
REDIRECTS = 16

#: How long (seconds) one script keeps following redirections (and a slot that moved off a
#: node that cannot be reached): a failover takes longer than that, and the caller learns of
#: it as an error at once instead of waiting past its own bound. A node that cannot be reached
#: and is still its slot's master after the slot map is read again is an error at once.
REDIRECT_BOUND = 0.5

#: The first pause after TRYAGAIN, CLUSTERDOWN or a replaced node (and a batch's first round).
FIRST_PAUSE = 0.01

#: The longest pause between two sends.
_LAST_PAUSE = 0.2


def remapped(manager: Any, exc: AskError) -> AskError:
    """``exc`` (a MOVED or ASK reply) with the address it names passed through the client's
    ``address_remap``, as redis-py passes the addresses of ``CLUSTER SLOTS`` (nodes behind NAT,
    port forwards, or the fault proxies of ``distlock.testing``) but not those of a redirection:
    followed as they are, they would bypass the mapping. Changed in place; redis-py before the
    mapping existed leaves it as it is."""
    remap = getattr(manager, "remap_host_port", None)
    if remap is not None and getattr(manager, "address_remap", None) is not None:
        exc.host, exc.port = remap(exc.host, exc.port)
        if hasattr(exc, "node_addr"):
            exc.node_addr = (exc.host, exc.port)
    return exc


class NotSent(Exception):
    """A connection to a node could not be opened: nothing was sent."""


#: The errors after which the script did not run, and which ``follow`` decides upon
#: (``MovedError`` is an ``AskError``).
REDIRECTED = (NotSent, AskError, TryAgainError, ClusterDownError, NoScriptError)

SEND = "send"
ASK = "ask"
MOVED = "moved"
REFRESH = "refresh"
LOAD = "load"
SLEEP = "sleep"

#: A plan of redirections: yields ``(kind, what)``; is sent the error of each send (and
#: nothing after the other steps); ends by raising.
Redirects = Generator[Tuple[str, Any], Optional[BaseException], NoReturn]


def follow(slot: int, node: Any, error: BaseException, started: float,
           master: Callable[[int], Any], asked: Callable[[AskError], Any]) -> Redirects:
    """The plan after the first try of a script, sent to ``node`` (the master of ``slot``) at
    ``started`` (monotonic), met ``error`` (one of ``REDIRECTED``). ``master(slot)``: the node
    that serves ``slot`` as far as the shell's slot map knows; ``asked(exc)``: the node an ASK
    reply names. Both only look up: neither talks to a server."""
    asking: Any = None
    pause = FIRST_PAUSE
    give_up = started + REDIRECT_BOUND
    outcome: Optional[BaseException] = error
    for attempt in range(REDIRECTS):
        if attempt:
            node = asking if asking is not None else master(slot)
            outcome = yield (ASK, node) if asking is not None else (SEND, node)
        if isinstance(outcome, NotSent):
            error = _not_reached(node, outcome)
            yield (REFRESH, None)
            if master(slot).name == node.name:
                break  # still the slot's master as far as the cluster knows: no failover yet
        elif isinstance(outcome, MovedError):
            error, asking = outcome, None
            yield (MOVED, outcome)
            continue  # no pause: the new owner is known
        elif isinstance(outcome, AskError):
            error = outcome
            asking = asked(outcome)
            continue
        elif isinstance(outcome, (TryAgainError, ClusterDownError)):
            error, asking = outcome, None
        elif isinstance(outcome, NoScriptError):
            error = outcome
            yield (LOAD, node)
            continue
        else:  # pragma: no cover - the shells send only REDIRECTED
            raise TypeError(f"distlock: {outcome!r} is not a redirection")
        if attempt + 1 >= REDIRECTS or time.monotonic() + pause > give_up:
            break
        yield (SLEEP, pause)
        pause = min(pause * 2, _LAST_PAUSE)
    raise error


def _not_reached(node: Any, not_sent: NotSent) -> BaseException:
    """What a script that could not reach ``node`` raises, should it give up there: the Redis
    error that kept the connection from opening, or a ConnectionError for any other. A
    connection that another thread or task closed under the connect's handshake (redis-py's
    cluster clients disconnect every node when they read the slot map again) fails with
    ValueError ("I/O operation on closed file", blocking) or AttributeError (asyncio): a node
    not reached all the same, never those errors out of ``acquire()``."""
    cause = not_sent.__cause__
    if isinstance(cause, RedisError):
        return cause
    error = RedisConnectionError(f"no connection to {getattr(node, 'name', node)} could be "
                                 f"opened: {cause!r}")
    error.__cause__ = cause
    return error
