"""The direct path keeps the connections its scripts used out of redis-py's pool between
scripts (``_redis.direct.HotLender``): the pool's take and give are skipped. What it must keep
from the pool's own behaviour: a connection the server closed while it was kept is connected
afresh before anything is sent on it; a forked child never talks on its parent's sockets;
nothing is left out of the pool when the session is retired, when its watchdog thread goes
idle, or once unused for ``HOT_IDLE``; and a user's pool gives up a small share of its limit
(a kept connection counts against it), or nothing.

The tests that look at what is kept hold another lock meanwhile (the watchdog thread then does
not go idle) and lengthen ``HOT_IDLE``: a loaded machine's pauses must not give it back
under them."""

from __future__ import annotations

import multiprocessing
import os
from typing import Any, Dict, Tuple

import pytest
import redis
from _support import settle

from distlock import DistLock
from distlock._redis import direct
from distlock._redis.direct import HOT_KEPT, HOT_SHARE, HotLender, lender
from distlock._session.session import session_for


def _lent(client: Any) -> HotLender:
    executor = session_for(client).executor
    lent = executor._lent
    assert isinstance(lent, HotLender)
    return lent


@pytest.fixture
def long_idle(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(direct, "HOT_IDLE", 3600.0)


def _used_once(url: str, name: str) -> Tuple[Any, DistLock, HotLender]:
    """A plain client, a lock on it taken and released once while another (its anchor, left
    held: the watchdog thread stays) is held, and the session's lender, which kept the one
    connection used."""
    plain = redis.Redis.from_url(url)
    anchor = DistLock(f"{name}:anchor", client=plain)
    assert anchor.acquire()
    _ANCHORS.append(anchor)
    lock = DistLock(name, client=plain)
    with lock:
        pass
    lent = _lent(plain)
    assert len(lent._kept) == 1
    return plain, lock, lent


_ANCHORS: list = []


@pytest.fixture(autouse=True)
def _anchors_released(client: Any) -> Any:
    yield  # (before the client's own teardown, which retires the sessions)
    while _ANCHORS:
        _ANCHORS.pop().release()


@pytest.mark.real_redis
def test_the_connection_a_script_used_is_lent_again_without_the_pool(url: str, client: Any,
        long_idle: None) -> None:
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
def test_a_kept_connection_the_server_closed_is_connected_afresh_before_use(url: str, client: Any,
        long_idle: None) -> None:
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
def test_retiring_the_session_gives_every_kept_connection_back(url: str, client: Any,
        long_idle: None) -> None:
    plain, _, lent = _used_once(url, "hot:retire")
    _ANCHORS.pop().release()
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
def test_a_forked_child_never_talks_on_its_parents_kept_connection(url: str, client: Any,
        long_idle: None) -> None:
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


def test_a_users_pool_lends_a_small_share_and_other_pools_none() -> None:
    """A user's pool keeps at most one in ``HOT_SHARE`` of its limit out (a kept connection
    counts against it): none below that; the session's own pool up to ``HOT_KEPT``; a pool of
    another class than redis-py's own (a blocking one) is lent as it is."""
    users = redis.Redis(host="127.0.0.1", port=1, max_connections=100)
    lent = lender(users, own_pool=False)
    assert isinstance(lent, HotLender) and lent.limit == min(HOT_KEPT, 100 // HOT_SHARE)
    small = redis.Redis(host="127.0.0.1", port=1, max_connections=2 * HOT_SHARE)
    assert lender(small, own_pool=False).limit == 2
    tiny = redis.Redis(host="127.0.0.1", port=1, max_connections=HOT_SHARE - 1)
    assert lender(tiny, own_pool=False) is tiny.connection_pool
    assert lender(tiny, own_pool=True).limit == HOT_KEPT
    blocking = redis.BlockingConnectionPool(host="127.0.0.1", port=1)
    assert lender(redis.Redis(connection_pool=blocking), own_pool=True) is blocking


@pytest.mark.real_redis
def test_a_session_on_a_users_pool_gives_its_connection_back_when_idle(
        url: str, client: Any, long_idle: None) -> None:
    """The session adopts a user's pool (a client with a socket timeout): the connection its
    scripts used stays out of that pool while scripts keep coming, and goes back to it, in use
    by nobody, when the session's watchdog thread goes idle (long before ``HOT_IDLE``, made
    an hour here)."""
    adopted = redis.Redis.from_url(url, socket_timeout=5)
    pool = adopted.connection_pool
    lock = DistLock("hot:adopted", client=adopted)
    with lock:
        pass
    lent = session_for(adopted).executor._lent
    assert isinstance(lent, HotLender) and lent._pool is pool
    assert settle(lambda: not lent._kept and not pool._in_use_connections, 20.0), (
        lent._kept, pool._in_use_connections)
    assert len(pool._available_connections) >= 1
    with lock:  # and is lent again as before
        assert lock.locked()


@pytest.mark.real_redis
def test_a_kept_connection_goes_back_once_unused_for_hot_idle(
        url: str, client: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """While the watchdog thread runs (a hold is held), a connection unused for ``HOT_IDLE``
    (shortened here) goes back to the pool as it looks."""
    monkeypatch.setattr(direct, "HOT_IDLE", 3600.0)
    plain, _, lent = _used_once(url, "hot:cool")
    monkeypatch.setattr(direct, "HOT_IDLE", 0.05)
    assert settle(lambda: not lent._kept, 20.0), lent._kept
    assert _ANCHORS[0].locked()  # the thread did not go idle: it looked, and gave it back


@pytest.mark.real_redis
def test_kept_connections_pass_through_the_pool_every_hot_refresh_under_steady_use(
        url: str, client: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Used without a pause, they still go back to the pool every ``HOT_REFRESH`` (shortened
    here), so that redis-py's give and take (re-authentication, a reconnect it was told to do)
    see them."""
    monkeypatch.setattr(direct, "HOT_IDLE", 3600.0)
    _, lock, lent = _used_once(url, "hot:refresh")
    since = lent._since
    monkeypatch.setattr(direct, "HOT_REFRESH", 0.05)

    def drained() -> bool:
        with lock:  # steady use meanwhile
            pass
        return lent._since != since

    assert settle(drained, 20.0)


class _Pool:
    """What a HotLender needs of a pool, counting what it was given back."""

    def __init__(self) -> None:
        self.given: list = []

    def get_connection(self) -> Any:
        return type("Conn", (), {"_sock": object()})()

    def release(self, conn: Any) -> None:
        self.given.append(conn)


def test_a_wake_that_fails_keeps_nothing_and_raises_nothing() -> None:
    """``release`` runs in the direct path's ``finally``: an error there would replace the
    script's reply. A watchdog thread that cannot be started keeps nothing out of the pool."""
    pool = _Pool()
    lent = HotLender(pool)

    def wake() -> None:
        raise RuntimeError("can't start new thread")

    lent.cool_with(wake)
    conn = lent.get_connection()
    lent.release(conn)
    assert pool.given == [conn] and not lent._kept and not lent._cooling
