"""The direct path keeps the connections its scripts used out of redis-py's pool between
scripts (``_redis.direct.HotLender``): the pool's take and give are skipped. What it must keep
from the pool's own behaviour: a connection the server closed while it was kept is connected
afresh before anything is sent on it; a forked child never talks on its parent's sockets;
nothing is left out of the pool when the session is retired; and a pool with a limit of the
user's is left as it is (a kept connection would count against it)."""

from __future__ import annotations

import multiprocessing
import os
from typing import Any, Dict, Tuple

import pytest
import redis

from distlock import DistLock
from distlock._redis.direct import HotLender, lender
from distlock._session.session import session_for


def _lent(client: Any) -> HotLender:
    executor = session_for(client).executor
    lent = executor._lent
    assert isinstance(lent, HotLender)
    return lent


def _used_once(url: str, name: str) -> Tuple[Any, DistLock, HotLender]:
    """A plain client (its session's pool is the session's own), a lock on it taken and
    released once, and the session's lender, which kept the one connection used."""
    plain = redis.Redis.from_url(url)
    lock = DistLock(name, client=plain)
    with lock:
        pass
    lent = _lent(plain)
    assert len(lent._kept) == 1
    return plain, lock, lent


@pytest.mark.real_redis
def test_the_connection_a_script_used_is_lent_again_without_the_pool(url: str, client: Any) -> None:
    _, lock, lent = _used_once(url, "hot:reuse")
    kept = list(lent._kept)
    pool = lent._pool
    in_use = len(pool._in_use_connections)
    for _ in range(20):
        with lock:
            pass
    assert lent._kept == kept  # the same connection, every time
    assert len(pool._in_use_connections) == in_use  # the pool was not asked again


@pytest.mark.real_redis
def test_a_kept_connection_the_server_closed_is_connected_afresh_before_use(url: str, client: Any) -> None:
    _, lock, lent = _used_once(url, "hot:killed")
    (conn,) = lent._kept
    # the server closes it (as a restart, or its idle timeout, would)
    host, port = conn._sock.getsockname()[:2]
    killed = client.client_kill_filter(addr=f"{host}:{port}")
    assert killed == 1
    with lock:  # no ConnectionError: the dead socket was seen before the script went out
        assert lock.locked()
    assert not client.keys("distlock:{hot:killed}")


@pytest.mark.real_redis
def test_retiring_the_session_gives_every_kept_connection_back(url: str, client: Any) -> None:
    plain, _, lent = _used_once(url, "hot:retire")
    session_for(plain).close()
    assert lent.closed and not lent._kept


def _child_locks(url: str, out: Any) -> None:
    try:
        plain = _PARENT["client"]
        with DistLock("hot:fork", client=plain):
            pass
        out.put("ok")
    except BaseException as exc:  # noqa: BLE001 - reported to the parent
        out.put(repr(exc))


_PARENT: Dict[str, Any] = {}


@pytest.mark.real_redis
@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_never_talks_on_its_parents_kept_connection(url: str, client: Any) -> None:
    plain, lock, lent = _used_once(url, "hot:fork")
    (conn,) = lent._kept
    _PARENT["client"] = plain
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    child = ctx.Process(target=_child_locks, args=(url, out))
    child.start()
    try:
        assert out.get(timeout=30) == "ok"
    finally:
        child.join(30)
        _PARENT.clear()
    # the parent's connection is still the parent's, and works
    assert lent._kept == [conn]
    with lock:
        pass


def test_only_a_pool_the_session_made_keeps_connections_out() -> None:
    """A user's pool is lent as it is (a kept connection would count against its limit), and
    so is a pool of another class than redis-py's own (a blocking one)."""
    users = redis.Redis(host="127.0.0.1", port=1)
    assert lender(users, own_pool=False) is users.connection_pool
    assert isinstance(lender(users, own_pool=True), HotLender)
    blocking = redis.BlockingConnectionPool(host="127.0.0.1", port=1)
    assert lender(redis.Redis(connection_pool=blocking), own_pool=True) is blocking


@pytest.mark.real_redis
def test_a_session_on_a_users_pool_keeps_nothing_out_of_it(url: str, client: Any) -> None:
    adopted = redis.Redis.from_url(url, socket_timeout=5)  # a session adopts this pool
    with DistLock("hot:adopted", client=adopted):
        pass
    assert not isinstance(session_for(adopted).executor._lent, HotLender)
