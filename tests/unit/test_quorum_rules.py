"""Redlock's arithmetic and checks (``distlock._core.quorum``), without a server; QuorumError; the
list given to every class that does not take one."""

from __future__ import annotations

import pickle
from typing import Any

import pytest
import redis

import distlock
import distlock.asyncio as aio
from distlock import QuorumError
from distlock._core.quorum import (
    busy_reply,
    drift,
    parse_info,
    quorum,
    reply_bound,
    sits_out,
    tally_acquire,
    tally_release,
    tally_renew,
    validity,
)

GONE = redis.exceptions.TimeoutError("no reply in time")


# --- the arithmetic ---------------------------------------------------------------------------

@pytest.mark.parametrize("n, need", [(1, 1), (2, 2), (3, 2), (4, 3), (5, 3), (6, 4), (7, 4)])
def test_quorum_is_a_strict_majority(n: int, need: int) -> None:
    assert quorum(n) == need
    assert need > n / 2 and need - 1 <= n / 2


def test_validity_subtracts_elapsed_and_drift() -> None:
    # lease 10 s, the try took 0.3 s: 10 - 0.3 - (1% of 10 s + 2 ms) = 9.598 s
    d = drift(10.0, None)
    assert d == pytest.approx(0.102)
    assert validity(10.0, 0.3, d) == pytest.approx(9.598)
    # the drift is taken off, never added (redlock-py's bug), and no stray constant (redsync's)
    assert validity(10.0, 0.3, d) < 10.0 - 0.3
    assert validity(10.0, 0.0, 0.0) == 10.0


def test_configured_drift_replaces_the_default() -> None:
    assert drift(10.0, 0.5) == 0.5
    assert drift(10.0, 0.0) == 0.0
    assert validity(10.0, 0.3, drift(10.0, 0.5)) == pytest.approx(9.2)


def test_a_try_that_took_the_whole_lease_is_worth_nothing() -> None:
    d = drift(1.0, None)  # 12 ms
    assert validity(1.0, 0.989, d) <= 0
    assert validity(1.0, 0.95, d) > 0


def test_reply_bound() -> None:
    assert reply_bound(30.0, drift(30.0, None)) == 1.0  # the cap
    assert reply_bound(0.1, drift(0.1, None)) == pytest.approx(0.1 - 0.003)
    assert reply_bound(0.001, 1.0) == 0.0


def test_a_master_sits_out_one_lease_after_it_started() -> None:
    assert not sits_out(None, 100.0, 30.0)  # not known: it votes (its INFO comes with its reply)
    assert sits_out(90.0, 100.0, 30.0)
    assert not sits_out(70.0, 100.0, 30.0)
    assert sits_out(70.5, 100.0, 30.0)


def test_parse_info() -> None:
    text = b"# Server\r\nredis_version:7.0.15\r\nrun_id:abc123\r\nuptime_in_seconds:42\r\n"
    assert parse_info(text) == ("abc123", 42)
    assert parse_info("run_id:x\nuptime_in_seconds:nope\n") == ("x", None)
    assert parse_info("") == (None, None)


# --- folding the masters' replies into one ----------------------------------------------------

def test_tally_acquire_counts_grants_refusals_and_silence() -> None:
    assert tally_acquire([17, 18, -5, GONE, 19], 5) == (3, 1, 4)
    assert tally_acquire([GONE, GONE, GONE], 3) == (0, 0, 0)


def test_busy_reply_takes_the_shortest_remaining_lease() -> None:
    assert busy_reply([-1001, -301, 17, GONE]) == -301
    # a split vote (no one holds it past 0 ms): a short random back-off, never 0 (no bound)
    reply = busy_reply([17, 18, -1, GONE])
    assert -51 <= reply <= -6


def test_tally_release() -> None:
    assert tally_release([0, 0, 0, -1, GONE], 5) == 0
    assert tally_release([1, 1, 1, 0, 0], 5) == 1  # a DistRLock still held a level deeper
    assert tally_release([0, -1, -1, -1, GONE], 5) == -1  # not on a quorum any more: lost
    with_silence = tally_release([0, 0, -1, GONE, GONE], 5)
    assert with_silence is None  # too few answered to tell


def test_tally_renew() -> None:
    assert tally_renew([1, 1, 1, 1, 1], 5) == 1
    assert tally_renew([1, 1, 1], 5) == 1  # a quorum of three that shrank to exactly three
    assert tally_renew([1, 1, 0], 5) == 0  # two left: never a quorum again
    assert tally_renew([1, 1], 5) == 0
    assert tally_renew([1, 1, GONE], 5) is None  # the third may still have it: wait and see
    assert tally_renew([1, 1, 1, 0, GONE], 5) == 1


# --- QuorumError ------------------------------------------------------------------------------

def test_quorum_error_carries_counts_and_pickles() -> None:
    exc = QuorumError("only 2 of 5 masters answered (3 required)", answered=2, required=3)
    assert isinstance(exc, distlock.DistLockError)
    again = pickle.loads(pickle.dumps(exc))
    assert type(again) is QuorumError
    assert (str(again), again.answered, again.required) == (str(exc), 2, 3)
    assert "answered=2" in repr(exc) and "required=3" in repr(exc)
    assert "QuorumError" in distlock.__all__


# --- bad input ------------------------------------------------------------------------------

def _clients(n: int = 3) -> list:
    return [redis.Redis(port=40000 + i) for i in range(n)]  # never connected


def test_empty_list_is_a_value_error() -> None:
    for cls in (distlock.DistLock, distlock.DistRLock):
        with pytest.raises(ValueError, match="must not be empty"):
            cls("x", client=[])


@pytest.mark.parametrize("odd", [None, 1, b"x", object(), [redis.Redis()]])
def test_a_non_client_in_the_list_is_a_type_error(odd: Any) -> None:
    with pytest.raises(TypeError, match=r"^client\[1\] must be"):
        distlock.DistLock("x", client=[redis.Redis(port=40000), odd])


def test_the_same_server_twice_is_a_value_error() -> None:
    a, b = redis.Redis(port=40000), redis.Redis(host="127.0.0.1", port=40001)
    with pytest.raises(ValueError, match=r"client\[0\] and client\[2\] are the same server"):
        distlock.DistLock("x", client=[a, b, a])
    with pytest.raises(ValueError, match="same server"):
        distlock.DistRLock("x", client=[b, redis.Redis(host="127.0.0.1", port=40001)])
    with pytest.raises(ValueError, match="same server"):
        distlock.DistLock("x", client=["redis://127.0.0.1:40001/0", b])
    # another database of the same server fails with it: not an independent master either
    with pytest.raises(ValueError, match="same server"):
        distlock.DistLock("x", client=[b, redis.Redis(host="127.0.0.1", port=40001, db=1)])


def test_a_cluster_url_in_the_list_is_refused() -> None:
    with pytest.raises(ValueError, match="cluster"):
        distlock.DistLock("x", client=["redis+cluster://127.0.0.1:40000/", redis.Redis(port=40001)])


def test_urls_and_tuples_are_accepted() -> None:
    distlock.DistLock("x", client=("redis://127.0.0.1:40000/0", "redis://127.0.0.1:40001/0",
                                   redis.Redis(port=40002)))


@pytest.mark.parametrize("make", [
    lambda c: distlock.DistReadWriteLock("x", client=c),
    lambda c: distlock.DistCondition("x", client=c),
    lambda c: distlock.DistSemaphore("x", client=c),
    lambda c: distlock.DistBoundedSemaphore("x", client=c),
    lambda c: distlock.DistEvent("x", client=c),
    lambda c: distlock.DistBarrier("x", 2, client=c),
], ids=["rwlock", "condition", "semaphore", "bounded", "event", "barrier"])
def test_other_primitives_refuse_a_list_and_name_who_takes_one(make: Any) -> None:
    with pytest.raises(TypeError, match="only DistLock and DistRLock") as info:
        make(_clients())
    assert "does not take a list of clients" in str(info.value)


def test_configure_refuses_a_list() -> None:
    with pytest.raises(TypeError, match="only DistLock and DistRLock take a list of clients"):
        distlock.configure(_clients())


def test_asyncio_takes_a_list_of_asyncio_masters_only() -> None:
    with pytest.raises(TypeError, match=r"^client\[0\] is a blocking client"):
        aio.DistLock("x", client=_clients())
    with pytest.raises(TypeError, match="does not take a list of clients"):
        aio.DistSemaphore("x", client=_clients())
    import redis.asyncio as aredis
    with pytest.raises(TypeError, match=r"^client\[1\] is an asyncio client"):
        distlock.DistLock("x", client=[redis.Redis(port=40000), aredis.Redis(port=40001)])


def test_redlock_drift_setting() -> None:
    try:
        assert distlock.configure(redlock_drift=0.25).redlock_drift == 0.25
        assert distlock.configure(redlock_drift=0).redlock_drift == 0.0
        with pytest.raises(ValueError):
            distlock.configure(redlock_drift=-1)
        with pytest.raises(TypeError):
            distlock.configure(redlock_drift="1")
        with pytest.raises(ValueError):
            distlock.configure(redlock_drift=float("nan"))
    finally:
        from distlock._core.settings import reset_settings
        reset_settings()
