"""The executor (``_executor.py``): a state-changing script whose reply was lost is never sent
again, whatever the client (DESIGN principle 13).

redis-py's ``execute_command`` retries on a connection error (redis-py 8: up to 10 times), and
before Core v2 every client that was not a plain, shareable one (a single-connection client, a
custom connection class, a Sentinel client) had its scripts sent through it: a grant whose
reply was lost was sent again. Here the reply of one script is lost after the server ran it,
and the server's own count of EVALSHA calls shows it ran exactly once.
"""

from __future__ import annotations

from typing import Any, Iterator

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from distlock import DistLock, DistSemaphore


class _LosesOneReply(redis.Connection):
    """A connection that, when told to, reads a reply and then reports it lost."""

    armed = False

    def read_response(self, *args: Any, **kwargs: Any) -> Any:
        reply = super().read_response(*args, **kwargs)
        if _LosesOneReply.armed:
            _LosesOneReply.armed = False
            raise redis.ConnectionError("the reply was lost (injected)")
        return reply


def _evalsha_calls(admin: redis.Redis) -> int:
    stats = admin.info("commandstats").get("cmdstat_evalsha", {})
    return int(stats.get("calls", 0))


class _Overrides(redis.Redis):  # type: ignore[type-arg]
    """A user's subclass that overrides execute_command and so keeps redis-py's retries."""

    def execute_command(self, *args: Any, **options: Any) -> Any:
        return super().execute_command(*args, **options)


@pytest.fixture(params=["pooled", "single-connection", "subclass"])
def flaky(request: pytest.FixtureRequest, backend: Any) -> Iterator[redis.Redis]:
    if not backend.real:
        pytest.skip("needs a real redis-server (INFO commandstats)")
    kwargs = backend.client().connection_pool.connection_kwargs
    # Connections that retry, as redis-py's clients made from a URL or host do by default.
    pool = redis.ConnectionPool(host=kwargs["host"], port=kwargs["port"], socket_timeout=5,
                                connection_class=_LosesOneReply, retry=Retry(NoBackoff(), 3))
    kind = _Overrides if request.param == "subclass" else redis.Redis
    client = kind(connection_pool=pool, single_connection_client=request.param == "single-connection")
    yield client
    _LosesOneReply.armed = False
    client.close()
    pool.disconnect()


@pytest.mark.real_redis
@pytest.mark.parametrize("make", [lambda c: DistLock("lost-reply", client=c),
                                  lambda c: DistSemaphore("lost-reply-sem", 2, client=c)],
                         ids=["DistLock", "DistSemaphore"])
def test_a_script_whose_reply_was_lost_is_not_sent_again(
        flaky: redis.Redis, client: redis.Redis, make: Any) -> None:
    primitive = make(flaky)
    primitive.acquire(timeout=1)  # a first round trip: the session and its scripts exist
    primitive.release()
    before = _evalsha_calls(client)
    _LosesOneReply.armed = True
    with pytest.raises(redis.ConnectionError):
        primitive.acquire(timeout=1)
    assert _evalsha_calls(client) - before == 1  # ran once, and never again
    # What happened is learnt by reading state: the grant did happen.
    assert client.keys("distlock:{lost-reply*") != []
    client.delete(*client.keys("distlock:{lost-reply*"))
