"""Fair locks (``fair=True``): first come, first served across processes, a direct hand-off
to the head waiter, no stranding, the race at the deadline, mixed modes, both shells.

Every test runs on real servers (``url``): other processes, SIGKILL and pub/sub need them.
"""

from __future__ import annotations

import asyncio
import functools
import os
import random
import signal
import threading
import time
from typing import Any, Dict, List

import pytest
import redis
from _fair_workers import queue_threads, wait_and_hold
from _procs import recv
from _support import other_client as other
from _support import until as support_until

import distlock
import distlock.asyncio as adistlock
from distlock._primitives.fair import entry_lease_ms
from distlock._primitives.lock_reach import session_of
from distlock._session.session import reset_sessions

pytestmark = pytest.mark.real_redis

def keys(name: str) -> Dict[str, str]:
    tag = f"distlock:{{{name}}}"
    return {"lock": tag, "order": tag + ":fq", "deadlines": tag + ":fd", "entries": tag + ":fe"}


#: the fair tests' bound on anything that should come quickly: 30 s
until = functools.partial(support_until, bound=30.0)


def queued(client: Any, order: str, n: int, alive: Any = None, bound: float = 30.0) -> None:
    """Wait until ``n`` waiters queue in ``order`` (or the thread ``alive`` ended)."""
    until(lambda: client.zcard(order) >= n or (alive is not None and not alive.is_alive()),
          bound=bound, what=f"{n} queued waiters")


# --- arguments -------------------------------------------------------------------------------

@pytest.mark.parametrize("cls", [distlock.DistLock, distlock.DistRLock,
                                 adistlock.DistLock, adistlock.DistRLock])
@pytest.mark.parametrize("bad", [1, 0, "yes", None, 1.0])
def test_fair_must_be_a_bool(cls: Any, bad: Any) -> None:
    with pytest.raises(TypeError, match=f"^fair must be a bool, not {type(bad).__name__}$"):
        cls("x", fair=bad)


def test_fair_is_keyword_only() -> None:
    with pytest.raises(TypeError):
        distlock.DistLock("x", None, None, True)  # type: ignore[misc]


# --- order and hand-off in one process -------------------------------------------------------

@pytest.mark.cluster_too
@pytest.mark.parametrize("kind", ["DistLock", "DistRLock"])
def test_waiters_get_it_in_order_of_arrival_with_a_token_each(url: str, client: Any,
                                                              kind: str) -> None:
    cls = getattr(distlock, kind)
    holder = cls("order", client=client, fair=True)
    assert holder.acquire()
    first = holder.token
    k = keys("order")
    got: List[Any] = []

    def wait(i: int) -> None:
        lock = cls("order", client=other(url), fair=True)
        assert lock.acquire(timeout=60)
        got.append((i, lock.token))
        lock.release()

    threads = []
    for i in range(6):
        thread = threading.Thread(target=wait, args=(i,))
        thread.start()
        threads.append(thread)
        queued(client, k["order"], i + 1)
    holder.release()
    for thread in threads:
        thread.join(60)
    assert [i for i, _ in got] == list(range(6))
    tokens = [first] + [t for _, t in got]
    assert tokens == sorted(tokens) and len(set(tokens)) == len(tokens)
    until(lambda: not client.exists(k["lock"], k["order"], k["deadlines"], k["entries"]),
          what="queue at rest")


@pytest.mark.cluster_too
def test_the_hand_off_needs_no_second_round_trip(url: str, client: Any) -> None:
    """The head waiter learns its token from the message: between the release and its return
    it sends no script (the hold is lengthened afterwards, off its path, by the watchdog)."""
    holder = distlock.DistLock("direct", client=client, fair=True)
    assert holder.acquire()
    waiter_client = other(url)
    waiter = distlock.DistLock("direct", client=waiter_client, fair=True)
    runs: List[str] = []
    result: List[bool] = []

    def wait() -> None:
        result.append(waiter.acquire(timeout=60))

    thread = threading.Thread(target=wait)
    thread.start()
    until(lambda: client.zcard(keys("direct")["order"]) == 1, what="queued waiter")
    session = session_of(waiter)
    real_run = session.run

    def counting_run(name: str, *args: Any) -> Any:
        if threading.current_thread() is thread:
            runs.append(name)
        return real_run(name, *args)

    session.run = counting_run  # type: ignore[method-assign]
    try:
        holder.release()
        thread.join(60)
    finally:
        session.run = real_run  # type: ignore[method-assign]
    assert result == [True] and runs == []
    assert waiter.owned() and waiter.token == int(client.hget("distlock:{direct}", ":t"))
    # the watchdog lengthens the short hand-off lease to the internal one
    until(lambda: client.pttl("distlock:{direct}") > entry_lease_ms(3.0), what="lengthened lease")
    waiter.release()


@pytest.mark.parametrize("lease", [None, 60.0])
def test_a_hand_off_lease_is_lengthened_even_when_the_first_try_fails(url: str, client: Any,
                                                                     lease: Any) -> None:
    """The lease handed over is the waiter's entry's time left (7 s at most); the one
    ``lock_renew`` that lengthens it fails here (a connection error). Nothing else would
    lengthen it in time (the watchdog renews every 10 s; a fixed lease is never renewed), so
    it is tried again while the short lease lasts."""
    name = f"lengthen-{lease}"
    holder = distlock.DistLock(name, client=client, fair=True)
    assert holder.acquire()
    waiter = distlock.DistLock(name, client=other(url), fair=True, lease=lease)
    session = session_of(waiter)
    real_run = session.run
    failed: List[str] = []

    def flaky_run(script: str, *args: Any) -> Any:
        if script == "lock_renew" and not failed:
            failed.append(script)
            raise redis.ConnectionError("the first lengthening does not get through")
        return real_run(script, *args)

    session.run = flaky_run  # type: ignore[method-assign]
    result: List[bool] = []
    thread = threading.Thread(target=lambda: result.append(waiter.acquire(timeout=60)))
    thread.start()
    try:
        until(lambda: client.zcard(keys(name)["order"]) == 1, what="queued waiter")
        holder.release()
        thread.join(60)
        assert result == [True]
        until(lambda: failed, what="the failed lengthening")
        until(lambda: client.pttl(f"distlock:{{{name}}}") > entry_lease_ms(3.0),
              what="the lease lengthened after all")
        assert waiter.owned()
    finally:
        session.run = real_run  # type: ignore[method-assign]
        thread.join(60)
    waiter.release()


def test_a_fair_rlock_owner_reenters_without_queueing(url: str, client: Any) -> None:
    lock = distlock.DistRLock("reenter", client=client, fair=True)
    assert lock.acquire()
    k = keys("reenter")
    rival = distlock.DistRLock("reenter", client=other(url), fair=True)
    got: List[bool] = []

    def wait() -> None:
        got.append(rival.acquire(timeout=60))
        rival.release()

    thread = threading.Thread(target=wait)
    thread.start()
    until(lambda: client.zcard(k["order"]) == 1, what="queued waiter")
    token = lock.token
    assert lock.acquire(timeout=0)  # a queue behind does not stop the owner
    assert lock.acquire(blocking=False)
    assert lock._recursion_count() == 3 and lock.token == token
    assert client.zcard(k["order"]) == 1
    for _ in range(3):
        lock.release()
    thread.join(60)
    assert got == [True]


def test_a_timed_out_waiter_leaves_the_queue_at_once(url: str, client: Any) -> None:
    holder = distlock.DistLock("leave", client=client, fair=True)
    assert holder.acquire()
    k = keys("leave")
    assert not distlock.DistLock("leave", client=other(url), fair=True).acquire(timeout=0.2)
    assert client.zcard(k["order"]) == 0 and client.hlen(k["entries"]) == 0
    assert not distlock.DistLock("leave", client=other(url), fair=True).acquire(blocking=False)
    holder.release()
    assert not client.exists(k["lock"])


# --- the race at the deadline ----------------------------------------------------------------

def test_a_waiter_that_times_out_as_it_is_handed_the_lock_passes_it_on(
        url: str, client: Any) -> None:
    """Repeated: the holder releases at about the moment the head waiter's timeout ends. The
    head either returns True and holds it in Redis, or returns False and holds nothing there
    (its leave step passed the lock to the next waiter, which gets it without waiting for any
    lease). Nobody holds it in Redis while believing otherwise, and the reverse."""
    holder = distlock.DistRLock("race", client=client, fair=True)
    head = distlock.DistRLock("race", client=other(url), fair=True)
    second_client = other(url)
    second = distlock.DistRLock("race", client=second_client, fair=True)
    k = keys("race")
    outcomes = {True: 0, False: 0}
    rng = random.Random(16)
    for _ in range(200):
        assert holder.acquire()
        head_result: List[Any] = []
        second_result: List[Any] = []

        def run_head(head_result: List[Any] = head_result) -> None:
            ok = head.acquire(timeout=0.03)
            owner = f"{session_of(head).id}:{threading.get_ident()}"
            in_redis = client.hget(k["lock"], owner)
            token = client.hget(k["lock"], ":t")
            head_result.append((ok, in_redis, head.token, token))
            if ok:
                head.release()

        def run_second(second_result: List[Any] = second_result) -> None:
            second_result.append(second.acquire(timeout=30))
            second_result.append(int(client.hget(k["lock"], ":t") or 0) == second.token)
            second.release()

        t1 = threading.Thread(target=run_head)
        t1.start()
        queued(client, k["order"], 1, t1)
        t2 = threading.Thread(target=run_second)
        t2.start()
        queued(client, k["order"], 2, t1)
        time.sleep(rng.uniform(0.0, 0.04))
        holder.release()
        t1.join(30)
        t2.join(30)
        ok, in_redis, token, redis_token = head_result[0]
        outcomes[ok] += 1
        if ok:
            assert in_redis is not None and int(redis_token) == token
        else:
            assert in_redis is None and token is None
        assert second_result == [True, True]
        until(lambda: not client.exists(k["lock"]), what="free lock")
        assert client.zcard(k["order"]) == 0
    print(f"head waiter got it {outcomes[True]} times, timed out {outcomes[False]} times")
    assert outcomes[True] + outcomes[False] == 200


def test_a_cancelled_asyncio_waiter_passes_a_hand_off_on(url: str, client: Any,
                                                         aio: Any) -> None:
    """Repeated: a task waiting for a fair lock is cancelled at about the moment it is handed
    the lock: the cancellation propagates, and the lock goes to the next waiter."""
    holder = distlock.DistLock("acancel", client=client, fair=True)
    k = keys("acancel")
    rng = random.Random(61)

    async def round_() -> Any:
        waiter = adistlock.DistLock("acancel", client=url, fair=True)
        task = asyncio.ensure_future(waiter.acquire())
        end = time.monotonic() + 30
        while client.zcard(k["order"]) < 1:
            assert time.monotonic() < end
            await asyncio.sleep(0.005)
        second = distlock.DistLock("acancel", client=other(url), fair=True)
        got: List[bool] = []
        thread = threading.Thread(target=lambda: got.append(second.acquire(timeout=30)))
        thread.start()
        while client.zcard(k["order"]) < 2:
            assert time.monotonic() < end
            await asyncio.sleep(0.005)
        loop = asyncio.get_running_loop()
        loop.call_later(rng.uniform(0.0, 0.01), task.cancel)
        await asyncio.sleep(rng.uniform(0.0, 0.01))
        await loop.run_in_executor(None, holder.release)
        try:
            result = await task
        except asyncio.CancelledError:
            result = "cancelled"
        if result is True:
            assert waiter.owned()
            await waiter.release()
        else:
            assert not waiter.owned()
            mine = waiter._peek_session().id  # type: ignore[union-attr]
            assert not [f for f in client.hkeys(k["lock"]) if f.decode().startswith(mine)]
        await asyncio.get_running_loop().run_in_executor(None, thread.join, 30)
        assert got == [True]
        second.release()
        return result

    seen = set()
    for _ in range(40):
        assert holder.acquire()
        seen.add(aio.run(round_()))
        until(lambda: not client.exists(k["lock"]), what="free lock")
    print(f"outcomes seen: {seen}")
    assert seen <= {True, "cancelled"}


# --- mixed modes -----------------------------------------------------------------------------

def test_a_plain_acquire_does_not_jump_a_fair_queue(url: str, client: Any) -> None:
    """A free lock with live fair waiters is theirs: a plain try is refused, and a plain wait
    goes on at the back of the fair queue."""
    k = keys("mixed")
    # a fair waiter whose entry lives 1.5 s, queued while nobody holds the lock (as after a
    # plain holder's lease ran out)
    client.zadd(k["order"], {"ghost": 1})
    deadline = int(client.time()[0]) * 1000 + 1500
    client.zadd(k["deadlines"], {"ghost": deadline})
    client.hset(k["entries"], "ghost", "1|30000|ghost:1|h:1|nowhere")
    for key in ("order", "deadlines", "entries"):
        client.pexpire(k[key], 5000)
    plain = distlock.DistLock("mixed", client=other(url))
    assert not plain.acquire(blocking=False)
    assert not plain.locked() or client.hget(k["lock"], ":n") is not None
    started = time.monotonic()
    assert plain.acquire(timeout=30)
    # it joined the queue behind the ghost, which was handed the lock first (for its entry's
    # time left), and then got it itself
    assert client.hget(k["lock"], ":n") not in (None, b"ghost")
    assert time.monotonic() - started < 30
    plain.release()
    assert not client.exists(k["order"], k["deadlines"], k["entries"])


def test_plain_and_fair_holders_hand_over_to_each_other(url: str, client: Any) -> None:
    plain = distlock.DistLock("both", client=client)
    fair = distlock.DistLock("both", client=other(url), fair=True)
    assert plain.acquire()
    got: List[bool] = []
    thread = threading.Thread(target=lambda: got.append(fair.acquire(timeout=60)))
    thread.start()
    until(lambda: client.zcard(keys("both")["order"]) == 1, what="queued waiter")
    plain.release()  # a plain release wakes the fair waiter's process, which settles the queue
    thread.join(60)
    assert got == [True]
    later: List[bool] = []
    thread = threading.Thread(target=lambda: later.append(plain.acquire(timeout=60)))
    thread.start()
    time.sleep(0.2)
    fair.release()
    thread.join(60)
    assert later == [True]
    plain.release()


# --- across processes ------------------------------------------------------------------------

def test_500_waiters_in_10_processes_all_get_it_in_their_turn(url: str, client: Any,
                                                              children: Any) -> None:
    """Scale: 500 threads in 10 processes queue for one fair lock while it is held; every one
    gets it, in exactly the order of their arrival on the server."""
    name, grants = "scale", "test:fair:grants"
    k = keys(name)
    holder = distlock.DistLock(name, client=client, fair=True)
    assert holder.acquire()
    conns = [children.start(queue_threads, url, name, "DistLock" if i % 2 else "DistRLock", 50,
                            grants, None) for i in range(10)]
    for conn in conns:
        assert recv(conn, 120) == "started"
    until(lambda: client.zcard(k["order"]) == 500, bound=180, what="500 queued waiters")
    arrival = [m.decode() for m in client.zrange(k["order"], 0, -1)]
    holder.release()
    assert sum(recv(conn, 300) for conn in conns) == 500
    granted = [m.decode() for m in client.lrange(grants, 0, -1)]
    assert granted == arrival
    until(lambda: not client.exists(k["lock"], k["order"], k["deadlines"], k["entries"]),
          what="queue at rest")


def test_a_hand_off_to_a_killed_waiter_is_stranded_at_most_its_entry_lease(
        url: str, client: Any, children: Any) -> None:
    """SIGKILL the head waiter's process at the moment of the release: the hold handed to it
    lives no longer than its queue entry would have, and the next waiter gets the lock."""
    name = "stranded"
    k = keys(name)
    holder = distlock.DistLock(name, client=client, fair=True)
    assert holder.acquire()
    doomed = children.start(wait_and_hold, url, name)
    until(lambda: client.zcard(k["order"]) == 1, what="head queued")
    survivor = children.start(wait_and_hold, url, name)
    until(lambda: client.zcard(k["order"]) == 2, what="second queued")
    head = client.zrange(k["order"], 0, 0)[0]
    first = holder.token
    os.kill(children.procs[0].pid, signal.SIGKILL)
    holder.release()
    released = time.monotonic()
    assert client.hget(k["lock"], ":n") == head  # handed to the dead waiter...
    assert 0 < client.pttl(k["lock"]) <= entry_lease_ms(3.0)  # ...for its entry's time left
    token, nonce = recv(survivor, 60)
    waited = time.monotonic() - released
    assert nonce != head.decode() and token > first
    assert waited < entry_lease_ms(3.0) / 1000 + 3.0 + 20.0  # entry lease + a wait cap + slack
    survivor.send("release")
    assert recv(survivor, 30) == "released"
    doomed.close()


# --- asyncio ---------------------------------------------------------------------------------

def test_asyncio_fair_locks_queue_with_threads(url: str, client: Any, aio: Any) -> None:
    """Tasks and threads share one fair queue: a blocking holder hands the lock to a task and
    the task to a thread, in order of arrival."""
    k = keys("ashared")
    holder = distlock.DistRLock("ashared", client=client, fair=True)
    assert holder.acquire()
    order: List[str] = []

    async def task_wait() -> None:
        lock = adistlock.DistRLock("ashared", client=url, fair=True)
        assert await lock.acquire()
        order.append("task")
        async with lock:  # re-entry
            pass
        await lock.release()

    future = asyncio.run_coroutine_threadsafe(task_wait(), aio.loop)
    until(lambda: client.zcard(k["order"]) == 1, what="queued task")
    thread_lock = distlock.DistLock("ashared", client=other(url), fair=True)

    def thread_wait() -> None:
        assert thread_lock.acquire(timeout=60)
        order.append("thread")
        thread_lock.release()

    thread = threading.Thread(target=thread_wait)
    thread.start()
    until(lambda: client.zcard(k["order"]) == 2, what="queued thread")
    holder.release()
    future.result(60)
    thread.join(60)
    assert order == ["task", "thread"]


def test_nothing_is_left_behind(url: str, client: Any) -> None:
    lock = distlock.DistLock("rest", client=client, fair=True)
    with lock:
        pass
    reset_sessions()
    assert sorted(client.keys("distlock:{rest}*")) == [b"distlock:{rest}:fence"]


def test_asyncio_tasks_get_it_in_order_and_a_timeout_leaves_the_line(
        url: str, client: Any, aio: Any) -> None:
    k = keys("atasks")

    async def scenario() -> List[int]:
        holder = adistlock.DistLock("atasks", client=url, fair=True)
        assert await holder.acquire()
        order: List[int] = []

        async def one(i: int) -> None:
            lock = adistlock.DistRLock("atasks", client=url, fair=True)
            assert await lock.acquire(timeout=60)
            order.append(i)
            await lock.release()

        tasks = []
        for i in range(5):
            tasks.append(asyncio.ensure_future(one(i)))
            end = time.monotonic() + 30
            while client.zcard(k["order"]) < i + 1:
                assert time.monotonic() < end
                await asyncio.sleep(0.005)
        late = adistlock.DistLock("atasks", client=url, fair=True)
        assert not await late.acquire(timeout=0.1)
        assert client.zcard(k["order"]) == 5
        await holder.release()
        await asyncio.gather(*tasks)
        return order

    assert aio.run(scenario()) == [0, 1, 2, 3, 4]
    until(lambda: not client.exists(k["lock"], k["order"], k["deadlines"], k["entries"]),
          what="queue at rest")


def test_a_condition_over_a_fair_lock(url: str, client: Any) -> None:
    """DistCondition's wait releases a fair lock inside its own script and takes it back as a
    fair acquire: wait, notify and the waiters queued for the lock meanwhile all go through."""
    lock = distlock.DistRLock("fcond", client=client, fair=True)
    cond = distlock.DistCondition("fcond", lock)
    flag = {"set": False}
    seen: List[bool] = []

    def waiter() -> None:
        with cond:
            seen.append(cond.wait_for(lambda: flag["set"], timeout=30))

    thread = threading.Thread(target=waiter)
    thread.start()
    until(lambda: client.exists("distlock:{fcond}") == 0 and thread.is_alive(), what="wait")
    time.sleep(0.2)
    others: List[bool] = []

    def contender() -> None:
        other_lock = distlock.DistRLock("fcond", client=other(url), fair=True)
        others.append(other_lock.acquire(timeout=30))
        other_lock.release()

    with cond:
        rival = threading.Thread(target=contender)
        rival.start()
        queued(client, keys("fcond")["order"], 1)
        flag["set"] = True
        cond.notify()
    thread.join(30)
    rival.join(30)
    assert seen == [True] and others == [True]


def test_uncontended_is_two_round_trips_without_a_subscription(client: Any) -> None:
    lock = distlock.DistLock("quiet", client=client, fair=True)
    session = session_of(lock)
    sent: List[str] = []
    real_run = session.run

    def counting_run(name: str, *args: Any) -> Any:
        sent.append(name)
        return real_run(name, *args)

    session.run = counting_run  # type: ignore[method-assign]
    try:
        with lock:
            pass
    finally:
        session.run = real_run  # type: ignore[method-assign]
    assert sent == ["fair_acquire", "fair_release"]
    assert not session.dispatcher.running


def test_configured_min_replicas_makes_a_fair_acquire_refuse(client: Any) -> None:
    distlock.configure(min_replicas=1)
    lock = distlock.DistLock("fair-replicas", client=client, fair=True)
    with pytest.raises(TypeError, match="^min_replicas does not apply to a fair lock"):
        lock.acquire()
    assert not client.exists("distlock:{fair-replicas}")
