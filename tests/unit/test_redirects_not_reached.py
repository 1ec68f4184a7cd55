"""A script that could not reach a cluster node gives up with a Redis error, whatever kept the
connection from opening (``_redis.redirects.follow``)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import redis

from distlock._redis.redirects import REFRESH, NotSent, follow


def _give_up_after(cause: BaseException) -> BaseException:
    """Run ``follow`` for a first try that met ``NotSent`` from ``cause``, on a node that stays
    its slot's master (so the plan gives up after reading the slot map again)."""
    node = SimpleNamespace(name="127.0.0.1:7000")
    not_sent = NotSent()
    not_sent.__cause__ = cause
    plan = follow(0, node, not_sent, 0.0, lambda slot: node, lambda exc: node)
    assert next(plan) == (REFRESH, None)
    with pytest.raises(BaseException) as raised:
        next(plan)
    return raised.value


@pytest.mark.parametrize("cause", [ValueError("I/O operation on closed file."),
                                   AttributeError("'NoneType' object has no attribute 'writelines'"),
                                   OSError("Bad file descriptor")])
def test_a_connection_closed_under_its_handshake_is_a_connection_error(cause: Any) -> None:
    """The nemesis's cluster phases saw acquire() end in ValueError (threads) and AttributeError
    (asyncio): a connection closed by another thread or task while this one connected on it."""
    error = _give_up_after(cause)
    assert isinstance(error, redis.ConnectionError) and error.__cause__ is cause
    assert "127.0.0.1:7000" in str(error)


def test_a_redis_error_is_raised_as_it_is() -> None:
    refused = redis.ConnectionError("Error 111 connecting to 127.0.0.1:7000. Connection refused.")
    assert _give_up_after(refused) is refused
