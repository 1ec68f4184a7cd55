"""The dispatcher's pub/sub connection when its server goes away for good (the proxy in front of
it closes: its connections end, new ones are refused).

redis-py's own retries never run inside the dispatcher's reads: they sleep an exponential
backoff between connection attempts (3.4 s in all against a refused port, seen here with
redis-py 8.2), where nothing can stop them, not even the session's close. The dispatcher's
reconnect loop does the retrying, and it looks between two attempts whether its session
closed. Whether the dispatcher reads for the waiter, is parked, or has lent the connection to
a thread asleep in ``acquire`` (``_redis.lending``), closing the session ends its thread within
the close's own join, and leaves no connection of its own open.
"""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any, List

import pytest
from _support import BOUND, until
from faults import FaultProxy

from distlock._redis.dispatcher import Dispatcher
from distlock._session.session import session_for


def _open_connections(pubsub: Any) -> List[Any]:
    pool = getattr(pubsub, "connection_pool", None)
    if pool is None:
        return []
    made = list(pool._available_connections) + list(pool._in_use_connections)
    return [c for c in made if c._sock is not None]


@pytest.mark.real_redis
@pytest.mark.parametrize("how", ["dispatcher-reads", "parked", "lent"])
def test_a_dispatcher_whose_server_went_away_ends_with_its_session(client: Any, url: str, how: str,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """The user's client keeps redis-py's default retries: the pub/sub twin must not."""
    monkeypatch.setattr(Dispatcher, "lends", how != "dispatcher-reads")
    port = int(url.rsplit(":", 1)[1].split("/")[0])
    sleeper = None
    with FaultProxy("127.0.0.1", port) as proxy:
        session = session_for(proxy.client())
        dispatcher = session.dispatcher
        waiter = dispatcher.join(f"pubsub-gone:{uuid.uuid4().hex[:8]}", 5.0)
        assert waiter.channel.confirmed.is_set()
        if how == "lent":  # a thread asleep on it borrows the connection (a waiter's sleep)
            sleeper = threading.Thread(target=dispatcher.sleep, args=(waiter, 2.0), daemon=True)
            sleeper.start()
            until(lambda: dispatcher._lender.lent_to is waiter, what="the sleeping thread borrowing")
        # the twin it reads through never retries: the dispatcher does
        assert dispatcher._pubsub.connection.retry.get_retries() == 0
        proxy.close()
        time.sleep(0.3)  # (a step, not a bound) the dispatcher or borrower meets the closed connection
        session.close(join=True)
        assert not dispatcher.running, "the dispatcher's thread outlived its session's close"
        assert _open_connections(dispatcher._pubsub) == []
        if sleeper is not None:
            sleeper.join(BOUND)
            assert not sleeper.is_alive()
        dispatcher.leave(waiter, False)
