"""The executor (``_redis/executor.py``): a state-changing script whose reply was lost is never sent
again, whatever the client (docs/design.rst, principle 13).

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

from distlock import DistLock, DistRLock, DistSemaphore
from distlock._redis.scripts import script_source


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
def test_a_script_whose_reply_was_lost_is_not_sent_again(flaky: redis.Redis, client: redis.Redis) -> None:
    primitive = DistSemaphore("lost-reply-sem", 2, client=flaky)
    primitive.acquire(timeout=1)  # a first round trip: the session and its scripts exist
    primitive.release()
    client.script_load(script_source("sem_renew"))  # no NOSCRIPT round below
    before = _evalsha_calls(client)
    _LosesOneReply.armed = True
    with pytest.raises(redis.ConnectionError):
        primitive.acquire(timeout=1)
    # The try ran once and was never sent again; the grant it made was found (a renewal of
    # its permit succeeded) and given back: three scripts in all.
    assert _evalsha_calls(client) - before == 3
    assert client.zcount("distlock:{lost-reply-sem}:sem", 0, "+inf") == 0  # no permit is held
    left = client.keys("distlock:{lost-reply*")
    if left:
        client.delete(*left)


@pytest.mark.real_redis
@pytest.mark.parametrize("kind", ["DistLock", "DistRLock"])
def test_a_lock_granted_with_a_lost_reply_is_given_back(
        flaky: redis.Redis, client: redis.Redis, kind: str) -> None:
    """The grant ran, its reply was lost, acquire() raised: the lock reads what happened and
    gives the hold back at once, instead of leaving the name locked for a whole lease by a
    hold nobody knows of. The script itself still ran exactly once."""
    lock = (DistLock if kind == "DistLock" else DistRLock)("lost-grant", client=flaky)
    with lock:
        pass
    before = _evalsha_calls(client)
    _LosesOneReply.armed = True
    with pytest.raises(redis.ConnectionError):
        lock.acquire(timeout=1)
    # the grant ran once, and the release that gave it back once: nothing was sent again
    assert _evalsha_calls(client) - before == 2
    assert not lock.owned()
    assert not client.exists("distlock:{lost-grant}")
    other = DistLock("lost-grant", client=client)
    assert other.acquire(blocking=False)  # free now, not a lease later
    other.release()
