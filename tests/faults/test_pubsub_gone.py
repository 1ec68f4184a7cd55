"""The dispatcher's pub/sub connection when its server goes away for good (the proxy in front of
it closes: its connections end, new ones are refused).

redis-py's own retries never run inside the dispatcher's reads: they sleep an exponential
backoff between connection attempts (3.4 s in all against a refused port, seen here with
redis-py 8.2), where nothing can stop them, not even the session's close. The dispatcher's
reconnect loop does the retrying, and it looks between two attempts whether its session
closed. Whether the dispatcher reads for the waiter or lends it the connection
(``_redis.lending``), closing the session ends its thread within the close's own join.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import pytest
from faults import FaultProxy

from distlock._redis.dispatcher import Dispatcher
from distlock._session.session import session_for


@pytest.mark.real_redis
@pytest.mark.parametrize("lends", [False, True], ids=["dispatcher-reads", "lent"])
def test_a_dispatcher_whose_server_went_away_ends_with_its_session(client: Any, url: str, lends: bool,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(Dispatcher, "lends", lends)
    port = int(url.rsplit(":", 1)[1].split("/")[0])
    with FaultProxy("127.0.0.1", port) as proxy:
        session = session_for(proxy.client())
        dispatcher = session.dispatcher
        waiter = dispatcher.join(f"pubsub-gone:{uuid.uuid4().hex[:8]}", 5.0)
        assert waiter.channel.confirmed.is_set()
        # the twin it reads through never retries: the dispatcher does
        assert dispatcher._pubsub.connection.retry.get_retries() == 0
        proxy.close()
        time.sleep(0.3)  # (a step, not a bound) the dispatcher meets the closed connection
        session.close(join=True)
        assert not dispatcher.running, "the dispatcher's thread outlived its session's close"
        dispatcher.leave(waiter, False)
