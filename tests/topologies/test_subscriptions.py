"""Pub/sub subscriptions stay what the dispatcher believes they are, on every dispatcher: one
server's (threads and asyncio), a cluster node's (sharded) and a Redlock master's.

The race these tests pin: the reader gives up an idle channel, and before its UNSUBSCRIBE
reaches the server a waiter joins that channel again. Had the waiter's SUBSCRIBE overtaken the
UNSUBSCRIBE, the server would run SUBSCRIBE then UNSUBSCRIBE: the dispatcher would believe the
channel subscribed while the server had dropped it, and every hint to the process would be lost
(its waiters left to poll at their bound). Each test opens that window as wide as it can be,
deterministically (a hook where the reader has given the channel up and not yet sent the
UNSUBSCRIBE), joins in it, and checks what the server says (PUBSUB NUMSUB, SHARDNUMSUB on a
cluster) against what the dispatcher says, then that a hint reaches the waiter; the bound it
sleeps on is 30 s, so only a lost hint, never a slow machine, fails it.
"""

from __future__ import annotations

import asyncio
import threading
import uuid
from typing import Any, Callable, List

import pytest
import redis
import redis.asyncio as aredis
from _aio import run_in_loop
from _support import BOUND, settle, subscribers

import distlock.asyncio as aio
from distlock import DistLock

pytestmark = pytest.mark.real_redis

#: how long a woken waiter may sleep at most: a hint must end the sleep long before
HINT_BOUND = 30.0


def _channels() -> tuple[str, str]:
    """A channel to give up and join again, and one in the same slot (a cluster node's) that
    stays subscribed, so that the reader unsubscribes the first instead of exiting idle."""
    tag = uuid.uuid4().hex[:10]
    return f"sub-order:{{{tag}}}:gap", f"sub-order:{{{tag}}}:keep"


def _threads_in_the_gap(monkeypatch: pytest.MonkeyPatch, board: Any, channel: str,
                        count: Callable[[str], int], publish: Callable[[str, str], Any]) -> None:
    """A threads' dispatcher (``pubsub.Dispatcher`` or a variant): its reader gives ``channel``
    up (``_drop_idle``) and, before it takes the I/O lock to send the UNSUBSCRIBE, a waiter joins
    ``channel`` (bound 0: it does not wait for the confirmation, so it runs in the reader's
    thread without blocking it)."""
    gap, keep = channel, channel.replace(":gap", ":keep")
    kept = board.join(keep, BOUND)
    first = board.join(gap, BOUND)
    joined: List[Any] = []
    try:
        assert settle(lambda: count(gap) == 1 and gap in board.subscribed(), BOUND)
        sweep = board._drop_idle

        def sweep_then_join() -> Any:
            names, done = sweep()
            if gap in names and not joined:
                joined.append(board.join(gap, 0))
            return names, done
        monkeypatch.setattr(board, "_drop_idle", sweep_then_join)
        board.leave(first, False)  # idle now: given up UNSUBSCRIBE_AFTER later
        assert settle(lambda: joined, BOUND), "the reader never gave the idle channel up"
        # What the dispatcher believes and what the server has agree: subscribed.
        assert settle(lambda: gap in board.subscribed() and count(gap) == 1, BOUND), \
            (board.subscribed(), count(gap))
        assert board.running and not _leaving(board, gap)
        timer = threading.Timer(0.05, publish, (gap, "1"))
        timer.start()
        try:
            assert board.sleep(joined[0], HINT_BOUND, HINT_BOUND) is True  # the hint, not the bound
        finally:
            timer.join(BOUND)
    finally:
        for waiter in joined:
            board.leave(waiter, False)
        board.leave(kept, False)


async def _asyncio_in_the_gap(monkeypatch: pytest.MonkeyPatch, board: Any, channel: str,
                              count: Callable[[str], int], publish: Callable[[str, str], Any]) -> None:
    """An event loop's dispatcher (``apubsub.AsyncDispatcher``): its reader gives ``channel``
    up and schedules a waiter's join; the reader's UNSUBSCRIBE is held back until that waiter
    has queued on the channel (asyncio has no gap between giving up and taking the I/O lock,
    so the hold is inside it; the join, if it sends, sends after)."""
    gap, keep = channel, channel.replace(":gap", ":keep")
    kept = await board.join(keep, BOUND)
    first = await board.join(gap, BOUND)
    joined: List[Any] = []
    tasks: List[asyncio.Task[Any]] = []
    try:
        await _asettle(lambda: count(gap) == 1 and gap in board.subscribed())
        sweep = board._drop_idle
        pubsub = board._pubsub
        unsubscribe = pubsub.unsubscribe

        def sweep_then_join() -> Any:
            names, done = sweep()
            if gap in names and not tasks:
                tasks.append(asyncio.ensure_future(board.join(gap, 0)))
                tasks[0].add_done_callback(lambda t: joined.append(t.result()))
            return names, done

        async def unsubscribe_late(*names: str) -> Any:
            if gap in names:
                await _asettle(lambda: gap in board.channels and board.channels[gap].refs > 0)
            return await unsubscribe(*names)
        monkeypatch.setattr(board, "_drop_idle", sweep_then_join)
        monkeypatch.setattr(pubsub, "unsubscribe", unsubscribe_late)
        board.leave(first, False)
        await _asettle(lambda: joined)
        await _asettle(lambda: gap in board.subscribed() and count(gap) == 1)
        assert not _leaving(board, gap)
        asyncio.get_running_loop().call_later(0.05, publish, gap, "1")
        assert await board.sleep(joined[0], HINT_BOUND, HINT_BOUND) is True
    finally:
        for task in tasks:
            if not task.done():
                task.cancel()
        for waiter in joined:
            board.leave(waiter, False)
        board.leave(kept, False)


def _leaving(board: Any, channel: str) -> bool:
    chan = board.channels.get(channel)
    return bool(chan is not None and getattr(chan, "leaving", False))


async def _asettle(check: Callable[[], Any]) -> None:
    for _ in range(int(BOUND / 0.02)):
        if check():
            return
        await asyncio.sleep(0.02)
    assert check(), "not reached within the bound"


# --- one server ----------------------------------------------------------------------------------

def test_a_join_between_giving_up_and_unsubscribe_stays_subscribed(
        monkeypatch: pytest.MonkeyPatch, client: redis.Redis) -> None:
    gap, _ = _channels()
    lock = DistLock("sub-order", client=client)  # keeps its session alive
    _threads_in_the_gap(monkeypatch, lock._session().dispatcher, gap, lambda c: subscribers(client, c),
                        client.publish)


def test_asyncio_a_join_between_giving_up_and_unsubscribe_stays_subscribed(
        monkeypatch: pytest.MonkeyPatch, url: str, client: redis.Redis) -> None:
    gap, _ = _channels()

    async def body(aclient: Any) -> None:
        lock = aio.DistLock("sub-order", client=aclient)  # keeps its port alive
        board = lock._port().dispatcher
        await _asyncio_in_the_gap(monkeypatch, board, gap, lambda c: subscribers(client, c),
                                  client.publish)
    run_in_loop(url, body, bound=BOUND * 3)


# --- a cluster node (SSUBSCRIBE) -------------------------------------------------------------

def test_cluster_a_join_between_giving_up_and_sunsubscribe_stays_subscribed(
        monkeypatch: pytest.MonkeyPatch, cluster_client: Any) -> None:
    gap, _ = _channels()
    lock = DistLock("sub-order", client=cluster_client)  # keeps its session alive
    dispatcher = lock._session().dispatcher
    _threads_in_the_gap(monkeypatch, dispatcher._board(gap), gap,
                        lambda c: subscribers(cluster_client, c), cluster_client.spublish)


def test_cluster_asyncio_a_join_between_giving_up_and_sunsubscribe_stays_subscribed(
        monkeypatch: pytest.MonkeyPatch, cluster: Any, cluster_client: Any) -> None:
    gap, _ = _channels()

    async def main() -> None:
        aclient = cluster.aclient()
        try:
            lock = aio.DistLock("sub-order", client=aclient)  # keeps its port alive
            await lock.locked()  # the client learns the slot map
            dispatcher = lock._port().dispatcher
            await _asyncio_in_the_gap(monkeypatch, dispatcher._board(gap), gap,
                                      lambda c: subscribers(cluster_client, c), cluster_client.spublish)
        finally:
            await _quiet()
            await aclient.aclose()
    asyncio.run(asyncio.wait_for(main(), BOUND * 3))


# --- a Redlock master ----------------------------------------------------------------------------

def test_redlock_a_join_between_giving_up_and_unsubscribe_stays_subscribed(
        monkeypatch: pytest.MonkeyPatch, redlock: Any, redlock_clients: list) -> None:
    gap, _ = _channels()
    lock = DistLock("sub-order", client=redlock_clients)  # keeps its session alive
    dispatcher = lock._session().dispatcher
    admin = redlock.admin(2)
    _threads_in_the_gap(monkeypatch, dispatcher.boards()[2], gap,
                        lambda c: subscribers(admin, c), admin.publish)


def test_redlock_asyncio_a_join_between_giving_up_and_unsubscribe_stays_subscribed(
        monkeypatch: pytest.MonkeyPatch, redlock: Any) -> None:
    gap, _ = _channels()
    admin = redlock.admin(2)

    async def main() -> None:
        masters = [aredis.Redis.from_url(u, socket_timeout=5) for u in redlock.urls]
        try:
            lock = aio.DistLock("sub-order", client=masters)  # keeps its port alive
            dispatcher = lock._port().dispatcher
            await _asyncio_in_the_gap(monkeypatch, dispatcher.boards()[2], gap,
                                      lambda c: subscribers(admin, c), admin.publish)
        finally:
            await _quiet()
            for m in masters:
                await m.aclose()
    asyncio.run(asyncio.wait_for(main(), BOUND * 3))


async def _quiet() -> None:
    """Let distlock's reader tasks end (their channels idle) before the loop closes."""
    for _ in range(150):
        if len(asyncio.all_tasks()) <= 2:  # this one and the wait_for around it
            return
        await asyncio.sleep(0.02)

