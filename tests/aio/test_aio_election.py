"""distlock.asyncio's DistElection: the blocking election, awaited (docs/guides/elections.rst).

The same election as the blocking class of the name; a cancelled campaign leaves nothing
behind; ``observe()`` is an asynchronous iterator; ``on_revoked`` runs in the loop.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any, List, Optional

import pytest
import redis
from _aio import run_in_loop
from _support import until

import distlock
import distlock.asyncio as aio
from distlock import Leader, LockLostError, LockNotOwnedError

pytestmark = [pytest.mark.real_redis, pytest.mark.cluster_too, pytest.mark.sentinel_too]

BOUND = 20.0


def _name() -> str:
    return f"aelect:{uuid.uuid4().hex[:10]}"


def run(url: str, body: Any) -> Any:
    return run_in_loop(url, body, BOUND)


def test_campaign_resign_and_leader(url: str, client: Any) -> None:
    name = _name()

    async def body(ac: Any) -> None:
        first, second = aio.DistElection(name, client=ac), aio.DistElection(name, client=ac)
        assert await second.leader() is None
        async with await first.campaign("a", timeout=10) as leadership:
            assert first.is_leader() and leadership.valid_for() > 0
            assert (await second.leader())[:2] == ("a", leadership.epoch)
            with pytest.raises(TimeoutError):
                await second.campaign("b", timeout=0.05)
            waiting = asyncio.ensure_future(second.campaign("b"))
            await asyncio.sleep(0.1)
            assert not waiting.done()
        following = await asyncio.wait_for(waiting, BOUND)
        assert following.epoch > leadership.epoch and not first.is_leader()
        await following.resign()
        assert await first.leader() is None
        with pytest.raises(LockNotOwnedError):
            await first.resign()
    run(url, body)
    assert [k for k in client.keys(f"*{name}*") if not k.endswith(b":fence")] == []


def test_a_cancelled_campaign_leaves_nothing_behind(url: str, client: Any) -> None:
    name = _name()

    async def body(ac: Any) -> None:
        leader, other = aio.DistElection(name, client=ac), aio.DistElection(name, client=ac)
        leadership = await leader.campaign("a")
        waiting = asyncio.ensure_future(other.campaign("b"))
        await asyncio.sleep(0.1)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        await leadership.resign()
        assert await other.leader() is None and not other.is_leader()
    run(url, body)
    until(lambda: [k for k in client.keys(f"*{name}*") if not k.endswith(b":fence")] == [],
          what="no waiter entry left")


def test_the_blocking_and_the_asyncio_election_are_one(url: str, client: Any) -> None:
    name = _name()
    blocking = distlock.DistElection(name, client=client)

    async def body(ac: Any) -> None:
        election = aio.DistElection(name, client=ac)
        leadership = await election.campaign("task")
        assert blocking.leader()[:2] == ("task", leadership.epoch)  # a quick blocking read
        with pytest.raises(TimeoutError):
            blocking.campaign("thread", timeout=0)
        await leadership.resign()
    run(url, body)


def test_observe_is_an_async_iterator_of_changes(url: str, client: Any) -> None:
    name = _name()

    async def body(ac: Any) -> None:
        watcher, candidate = aio.DistElection(name, client=ac), aio.DistElection(name, client=ac)
        seen: List[Optional[Leader]] = []

        async def watch() -> None:
            async for leader in watcher.observe(timeout=BOUND):
                seen.append(leader)
                if len(seen) == 3:
                    return

        task = asyncio.ensure_future(watch())
        while not seen:
            await asyncio.sleep(0.01)
        leadership = await candidate.campaign("a")
        while len(seen) < 2:
            await asyncio.sleep(0.01)
        await leadership.resign()
        await asyncio.wait_for(task, BOUND)
        assert seen[0] is None and seen[2] is None and seen[1][:2] == ("a", leadership.epoch)
        assert [x async for x in watcher.observe(timeout=0.1)] == [None]
    run(url, body)


@pytest.mark.server_only
def test_on_revoked_runs_in_the_loop_and_bound_stops_the_leader(url: str, client: redis.Redis) -> None:
    name = _name()

    async def body(ac: Any) -> None:
        election = aio.DistElection(name, client=ac, max_hold=0.3)
        revoked: List[Any] = []

        async def on_revoked(el: Any) -> None:
            revoked.append(el)
        election.on_revoked(on_revoked)
        with pytest.raises(LockLostError) as lost:
            async with election.bound("a") as scope:
                assert election.is_leader() and scope.token is not None
                await asyncio.sleep(BOUND)
        assert lost.value.token == scope.token and "max_hold" in lost.value.cause
        for _ in range(200):
            if revoked:
                break
            await asyncio.sleep(0.05)
        assert revoked == [election] and not election.is_leader()
    run(url, body)
