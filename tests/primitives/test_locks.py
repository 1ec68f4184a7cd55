"""DistLock and DistRLock as distributed locks: processes, leases, tokens, fork, failures.

The threading contract itself (argument checks, wording, reentrancy) is in test_contract.py.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
import time
from typing import Any, List

import _workers
import pytest
import redis
from _procs import in_forked_child
from _support import renewals_seen
from redis.backoff import NoBackoff
from redis.retry import Retry

import distlock
from distlock import DistLock, DistRLock, LockLostError, LockNotOwnedError
from distlock._session.session import session_for
from distlock.testing.server import free_port

SPAWN = multiprocessing.get_context("spawn")
LOCK_TYPES = [DistLock, DistRLock]


def _join_all(procs: List[Any]) -> None:
    for proc in procs:
        proc.join(timeout=30)
    for proc in procs:
        if proc.is_alive():
            proc.kill()
            proc.join(timeout=10)


def _start_holder(url: str, kind: str, name: str, lease: Any, short_watchdog: bool = False) -> Any:
    parent, child = SPAWN.Pipe()
    proc = SPAWN.Process(target=_workers.hold_until_killed,
                         args=(url, kind, name, lease, child, short_watchdog), daemon=True)
    proc.start()
    assert parent.poll(60), "holder did not report"
    token, sent_at, pid = parent.recv()
    return proc, parent, token, sent_at


# --- exclusion across processes -----------------------------------------------------------------

@pytest.mark.real_redis
@pytest.mark.parametrize("kind,reenter", [("DistLock", False), ("DistRLock", False), ("DistRLock", True)])
def test_no_lost_update_across_processes(url: str, client: Any, kind: str, reenter: bool) -> None:
    """4 processes x 250 GET/SET increments under the lock: the total is exact."""
    with SPAWN.Pool(4) as pool:
        done = pool.starmap(_workers.count_under_lock,
                            [(url, kind, "counter-lock", "counter", 250, reenter)] * 4)
    assert sum(done) == 1000
    assert int(client.get("counter")) == 1000
    assert client.keys("distlock:*") == [b"distlock:{counter-lock}:fence"]


@pytest.mark.real_redis
@pytest.mark.slow
def test_sigkilled_holder_frees_after_lease_not_before(url: str, client: Any) -> None:
    proc, conn, token, sent_at = _start_holder(url, "DistLock", "killed", 1.0)
    try:
        os.kill(proc.pid, signal.SIGKILL)
        lock = DistLock("killed", client=client)
        assert lock.acquire(timeout=20)
        got_at = time.monotonic()
        # the hold was granted no earlier than sent_at, with a 1 s lease: never free before
        assert got_at >= sent_at + 1.0
        assert lock.token > token
        lock.release()
    finally:
        _join_all([proc])


@pytest.mark.real_redis
@pytest.mark.slow
@pytest.mark.parametrize("kind", ["DistLock", "DistRLock"])
def test_race_for_expired_hold_one_at_a_time(url: str, client: Any, kind: str) -> None:
    """A holder dies with a short lease; 6 processes race for the expired hold. Their hold
    intervals (system-wide monotonic clock) never overlap and every one gets in."""
    holder, conn, token, _sent = _start_holder(url, kind, "race", 0.8)
    start_at = time.monotonic() + 3.0
    try:
        os.kill(holder.pid, signal.SIGKILL)
        with SPAWN.Pool(6) as pool:
            results = pool.starmap(_workers.contend_once, [(url, kind, "race", start_at)] * 6)
    finally:
        _join_all([holder])
    results.sort()
    for (_b1, e1, _t1), (b2, _e2, _t2) in zip(results, results[1:]):
        assert e1 <= b2, "two holders overlapped"
    tokens = [t for _b, _e, t in results]
    assert tokens == sorted(tokens) and len(set(tokens)) == 6 and min(tokens) > token


@pytest.mark.real_redis
@pytest.mark.slow
@pytest.mark.parametrize("short_watchdog", [False, True], ids=["explicit-lease", "watchdog"])
def test_paused_holder_late_release_raises_lost(url: str, client: Any, short_watchdog: bool) -> None:
    """SIGSTOP the holder past its lease; another takes over; after SIGCONT the old holder's
    release() raises LockLostError and the new hold stays intact."""
    lease = None if short_watchdog else 1.0
    proc, conn, old_token, _sent = _start_holder(url, "DistRLock", "paused", lease, short_watchdog)
    try:
        os.kill(proc.pid, signal.SIGSTOP)
        taker = DistRLock("paused", client=client, lease=30)
        assert taker.acquire(timeout=20)
        assert taker.token > old_token
        os.kill(proc.pid, signal.SIGCONT)
        if short_watchdog:  # its watchdog notices on its next tick, and says so
            deadline = time.monotonic() + 20
            lost = False
            while not lost and time.monotonic() < deadline:
                conn.send("lost?")
                lost = conn.recv()
                if not lost:
                    time.sleep(0.1)
            assert lost, "on_lost never fired after the lease was taken over"
        conn.send("release")
        assert conn.poll(30)
        outcome = conn.recv()
        assert outcome[0] == "LockLostError", outcome
        assert outcome[1] is True  # on_lost ran (at the latest when release found it gone)
        assert taker.owned() and taker.locked()
        owner = f"{session_for(client).id}:{threading.get_ident()}".encode()
        assert client.hget("distlock:{paused}", owner) == b"1"
        taker.release()
        conn.send("exit")
    finally:
        os.kill(proc.pid, signal.SIGCONT)
        _join_all([proc])


# --- leases, watchdog, lost leases ---------------------------------------------------------------

@pytest.mark.parametrize("cls", LOCK_TYPES)
def test_watchdog_keeps_hold_alive(client: Any, cls: Any) -> None:
    distlock.configure(lease=3.0, renew_interval=0.2)
    lock = cls("kept", client=client)
    lost: List[Any] = []
    lock.on_lost(lost.append)
    lock.acquire()
    renewals_seen(lambda: client.pttl("distlock:{kept}"), 3)  # the watchdog's, not a sleep's
    assert lock.owned() and lock.locked()
    assert 0 < client.pttl("distlock:{kept}") <= 3000
    lock.release()
    assert not lost


@pytest.mark.parametrize("cls", LOCK_TYPES)
def test_explicit_lease_is_not_renewed(client: Any, cls: Any) -> None:
    distlock.configure(lease=1.0, renew_interval=0.2)
    lock = cls("short", client=client, lease=0.6)
    lock.acquire()
    deadline = time.monotonic() + 20
    while lock.locked() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not lock.locked()
    with pytest.raises(LockLostError):
        lock.release()


@pytest.mark.parametrize("cls", LOCK_TYPES)
def test_lost_lease_found_by_watchdog(client: Any, cls: Any) -> None:
    """Someone else takes the name over; the watchdog reports it and never extends their hold."""
    distlock.configure(lease=1.0, renew_interval=0.2)
    lock = cls("stolen", client=client)
    fired = threading.Event()
    lock.on_lost(lambda lk: fired.set() if lk is lock else None)
    lock.acquire()
    client.delete("distlock:{stolen}")
    other = cls("stolen", client=client, lease=0.8)
    assert threading.Thread(target=other.acquire).start() is None
    assert fired.wait(20), "on_lost did not fire"
    # the watchdog must not have extended the new holder's lease beyond its own 0.8 s
    assert client.pttl("distlock:{stolen}") <= 800
    with pytest.raises(LockLostError):
        lock.release()
    assert not lock.owned() and lock.token is None


def test_on_lost_rejects_non_callable(client: Any) -> None:
    with pytest.raises(TypeError):
        DistLock("x", client=client).on_lost(42)  # type: ignore[arg-type]


# --- fencing tokens -----------------------------------------------------------------------------

@pytest.mark.real_redis
def test_tokens_increase_across_server_restart(backend: Any, client: Any) -> None:
    if backend.server is None:
        pytest.skip("the suite did not start this server, so it cannot restart it")
    lock = DistRLock("fenced", client=client)
    tokens = []
    for _ in range(5):
        with lock:
            tokens.append(lock.token)
            with lock:
                assert lock.token == tokens[-1]  # re-entry keeps the token
    backend.server.restart()
    assert client.dbsize() == 0  # nothing survived
    for _ in range(3):
        with lock:
            tokens.append(lock.token)
    assert tokens == sorted(tokens) and len(set(tokens)) == len(tokens)


# --- fork -----------------------------------------------------------------------------------------

@pytest.mark.real_redis
@pytest.mark.parametrize("cls", LOCK_TYPES)
def test_forked_child_owns_nothing(client: Any, cls: Any) -> None:
    lock = cls("forked", client=client)
    lock.acquire()

    def child() -> str:
        results = [lock.owned(), lock.token is None]
        try:
            lock.release()
            results.append("released")
        except LockNotOwnedError:
            results.append("refused")
        own = cls("forked-child", client=client)
        results.append(own.acquire(timeout=10))
        own.release()
        return repr(results)

    status, report = in_forked_child(child)
    assert status == 0
    assert report == repr([False, True, "refused", True])
    assert lock.owned() and lock.locked()
    lock.release()


# --- waiting and wake-ups --------------------------------------------------------------------

def _evalsha_calls(client: Any) -> int:
    return int(client.info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0))


@pytest.mark.real_redis
def test_one_release_wakes_one_local_waiter(client: Any) -> None:
    """5 threads wait; one release costs exactly its own round trip: it hands the lock to one
    of them (the in-process hand-off), which takes it without a try of its own; nobody else
    is woken (no try at all, not five)."""
    distlock.configure(wait_cap=60.0)  # no polling in this test: only hints wake anyone
    holder = DistLock("wake-one", client=client, lease=60)  # explicit leases: no renewals
    holder.acquire()
    holder.release()  # the first run of each script loads it (NOSCRIPT): not what we count
    holder.acquire()
    acquired: List[int] = []
    release_next = threading.Event()

    def waiter(i: int) -> None:
        lock = DistLock("wake-one", client=client, lease=60)
        lock.acquire(timeout=60)
        acquired.append(i)
        release_next.wait(60)
        lock.release()

    threads = [threading.Thread(target=waiter, args=(i,)) for i in range(5)]
    for t in threads:
        t.start()
    session = session_for(client)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        with session.dispatcher.mutex:
            queued = sum(len(c.waiters) for c in session.dispatcher.channels.values())
        if queued == 5:
            break
        time.sleep(0.02)
    time.sleep(0.2)  # let every waiter finish its second try and go to sleep
    before = _evalsha_calls(client)
    holder.release()
    deadline = time.monotonic() + 20
    while not acquired and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.3)
    after = _evalsha_calls(client)
    assert len(acquired) == 1
    assert after - before == 1  # the release, which handed the lock to one waiter
    release_next.set()
    for t in threads:
        t.join(60)
    assert sorted(acquired) == list(range(5))


@pytest.mark.real_redis
def test_pubsub_reconnect_wakes_waiters(client: Any) -> None:
    distlock.configure(wait_cap=60.0)
    holder = DistRLock("reconnect", client=client)
    holder.acquire()
    got = threading.Event()
    waiter = threading.Thread(target=lambda: DistRLock("reconnect", client=client).acquire(timeout=60)
                              and got.set())
    waiter.start()
    session = session_for(client)
    deadline = time.monotonic() + 20
    while not session.subscribed_channels() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert client.client_kill_filter(_type="pubsub") >= 1
    deadline = time.monotonic() + 20
    while session.pubsub_reconnects == 0 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert session.pubsub_reconnects >= 1
    # the hint for this release may or may not find the new subscription: either way the
    # waiter gets the lock, because it was woken on reconnect and bounded its sleep by the PTTL
    holder.release()
    assert got.wait(30)
    waiter.join(10)


@pytest.mark.real_redis
def test_one_pubsub_connection_for_many_waiters(client: Any) -> None:
    holders = [DistLock(f"many-{i}", client=client) for i in range(5)]
    for h in holders:
        h.acquire()
    stop = threading.Event()

    def wait_on(i: int) -> None:
        lock = DistLock(f"many-{i % 5}", client=client)
        if lock.acquire(timeout=30):
            lock.release()

    threads = [threading.Thread(target=wait_on, args=(i,)) for i in range(25)]
    for t in threads:
        t.start()
    session = session_for(client)
    deadline = time.monotonic() + 20
    while len(session.subscribed_channels()) < 5 and time.monotonic() < deadline:
        time.sleep(0.02)
    pubsub_clients = [c for c in client.client_list() if int(c.get("sub", 0)) > 0]
    assert len(pubsub_clients) == 1 and pubsub_clients[0]["sub"] == "5"
    for h in holders:
        h.release()
    stop.set()
    for t in threads:
        t.join(30)


# --- connection failures ----------------------------------------------------------------------

@pytest.mark.parametrize("cls", LOCK_TYPES)
@pytest.mark.parametrize("call", ["acquire", "acquire-nonblocking", "try_lock", "locked"])
def test_unreachable_server_raises(cls: Any, call: str) -> None:
    dead = redis.Redis(port=free_port(), socket_connect_timeout=1, retry=Retry(NoBackoff(), 0))
    lock = cls("nowhere", client=dead)
    with pytest.raises(redis.exceptions.ConnectionError):
        if call == "acquire":
            lock.acquire()
        elif call == "acquire-nonblocking":
            lock.acquire(False)
        elif call == "try_lock":
            lock.try_lock(1)
        else:
            lock.locked()
    assert not lock.owned()
    dead.close()


# --- state left behind --------------------------------------------------------------------------

@pytest.mark.parametrize("cls", LOCK_TYPES)
def test_only_fence_counter_remains_after_release(client: Any, cls: Any) -> None:
    lock = cls("tidy", client=client)
    with lock:
        assert set(client.keys("*")) == {b"distlock:{tidy}", b"distlock:{tidy}:fence"}
    assert client.keys("*") == [b"distlock:{tidy}:fence"]
    # it outlives the hold by the fence retention, then goes (tests/primitives/test_fence.py)
    assert 0 < client.pttl("distlock:{tidy}:fence") <= 30_000 + distlock.configure().fence_retention_ms


def test_prefix_is_configurable(client: Any) -> None:
    distlock.configure(prefix="myapp:")
    lock = DistLock("p", client=client)
    with lock:
        assert client.exists("myapp:{p}")
    assert client.keys("*") == [b"myapp:{p}:fence"]


# --- clients ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("cls", LOCK_TYPES)
def test_decode_responses_client_works(backend: Any, client: Any, cls: Any) -> None:
    decoding = backend.client(decode_responses=True)
    try:
        lock = cls("decoded", client=decoding)
        other = cls("decoded", client=decoding)
        got: List[bool] = []

        def contend() -> None:
            got.append(other.acquire(timeout=20))
            other.release()

        with lock:
            assert isinstance(lock.token, int)
            t = threading.Thread(target=contend)
            t.start()
            time.sleep(0.2)
        t.join(30)
        assert got == [True]
    finally:
        decoding.close()


def test_url_string_client(url: str, client: Any) -> None:
    a = DistLock("by-url", client=url)
    b = DistRLock("by-url-r", client=url)
    with a, b:
        assert client.exists("distlock:{by-url}") and client.exists("distlock:{by-url-r}")
    assert a._session() is b._session()  # one client, hence one session, per URL


@pytest.mark.parametrize("cls", LOCK_TYPES)
def test_renewal_racing_release_is_not_a_lost_lease(client: Any, cls: Any) -> None:
    """Many clean acquire/release pairs under a watchdog renewing as fast as it can: a renewal
    that finds the hold just released must not report it lost."""
    distlock.configure(lease=1.0, renew_interval=0.005)
    lock = cls("racing-renewal", client=client)
    lost: List[Any] = []
    lock.on_lost(lost.append)
    deadline = time.monotonic() + 10
    for _ in range(400):
        if time.monotonic() > deadline:
            break
        lock.acquire()
        lock.release()
    assert lost == []


# --- how scripts are sent --------------------------------------------------------------------------

@pytest.mark.real_redis
def test_plain_client_scripts_skip_execute_command(client: Any) -> None:
    """A plain client on redis-py's pool: the session sends its scripts itself (no call goes
    through execute_command), and a lock works through it."""
    lock = DistLock("direct", client=client)
    calls: List[Any] = []
    real = client.execute_command
    client.execute_command = lambda *a, **k: (calls.append(a[0]), real(*a, **k))[1]
    try:
        with lock:
            assert client.exists("distlock:{direct}")
    finally:
        del client.execute_command
    assert "EVALSHA" not in calls


class _Counting(redis.Redis):  # type: ignore[type-arg]
    commands: List[Any] = []

    def execute_command(self, *args: Any, **options: Any) -> Any:
        type(self).commands.append(args[0])
        return super().execute_command(*args, **options)


@pytest.mark.real_redis
def test_clients_that_override_execute_command_see_reads_not_scripts(url: str) -> None:
    """A subclass that overrides execute_command (and so keeps redis-py's retries) sees
    distlock's reads, but not its scripts: a state change is never sent through a retrying
    path (docs/design.rst, principle 13; see test_executor.py). A single-connection client gets them
    over its one connection."""
    sub = _Counting.from_url(url, socket_timeout=5)  # not shareable (see _clients.shareable)
    single = redis.Redis.from_url(url, single_connection_client=True, socket_timeout=5)
    try:
        _Counting.commands = []
        with DistLock("via-sub", client=sub):
            assert DistLock("via-sub", client=sub).locked()
        assert "EXISTS" in _Counting.commands and "EVALSHA" not in _Counting.commands
        with DistRLock("via-single", client=single):
            assert single.exists("distlock:{via-single}")
            assert len(single.client_list()) >= 1
        assert not single.exists("distlock:{via-single}")
    finally:
        sub.close()
        single.close()


@pytest.mark.real_redis
def test_direct_path_recovers_from_a_broken_connection(url: str, client: Any) -> None:
    """The server drops the session's pooled connections (CLIENT KILL): the next acquire takes
    a fresh connection from the pool and works; nothing is retried behind the caller's back."""
    lock = DistRLock("kill-conn", client=client)
    with lock:
        pass
    admin = redis.Redis.from_url(url)
    try:
        assert admin.client_kill_filter(_type="normal", skipme=True) >= 1
    finally:
        admin.close()
    with lock:
        assert lock.owned()
    assert client.exists("distlock:{kill-conn}") == 0


# --- contention: a waiter that loses races backs off ---------------------------------------------

def test_hinted_try_that_fails_neither_registers_nor_flags(client: Any) -> None:
    """Mode 'p' (the try that answers a hint): when the lock is taken it leaves no registry
    entry and no ':w' flag, so no release wakes the backing-off process."""
    holder = DistLock("backoff-p", client=client)
    holder.acquire()
    try:
        session = session_for(client)
        keys = holder._keys
        reply = session.run("lock_acquire", (keys.lock, keys.fence, keys.queue),
                            ("someone:1", 30000, 30000, "h:1", "p", 1, "chan-x", 7000, "0"))
        assert int(reply) < 0
        assert not client.exists(keys.queue)
        assert not client.hexists(keys.lock, ":w")
        reply = session.run("lock_acquire", (keys.lock, keys.fence, keys.queue),
                            ("someone:1", 30000, 30000, "h:1", "w", 1, "chan-x", 7000, "0"))
        assert int(reply) < 0
        assert client.zscore(keys.queue, "chan-x") is not None  # mode 'w' registers
        assert client.hexists(keys.lock, ":w")
    finally:
        holder.release()
        client.delete(holder._keys.queue)


@pytest.mark.real_redis
@pytest.mark.parametrize("cls", LOCK_TYPES)
def test_waiters_of_a_hot_lock_get_it_when_it_cools(url: str, client: Any, cls: Any) -> None:
    """3 processes take the lock back to back (a waiter keeps losing races to the releaser and
    backs off); the counter stays exact, and a waiter here, competing with them, gets the lock
    within its timeout: backing off never strands a waiter."""
    with SPAWN.Pool(3) as pool:
        result = pool.starmap_async(_workers.count_under_lock,
                                    [(url, cls.__name__, "hot-lock", "hot-counter", 300, False)] * 3)
        here = cls("hot-lock", client=client)
        assert here.acquire(timeout=60)
        here.release()
        done = result.get(timeout=120)
    assert sum(done) == 900
    assert int(client.get("hot-counter")) == 900
    client.delete("hot-counter")


def test_a_distlock_hold_id_is_never_all_digits(client: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A DistLock's random hold id that came out as twelve digits would read as a DistRLock's
    thread ident to ``distlock status`` (about one draw in 280: it made a CLI test flaky)."""
    import os

    from distlock._cli.inspect import guess_kind, parse_owner

    monkeypatch.setattr(os, "urandom", lambda n: bytes.fromhex("12" * n))
    lock = DistLock("all-digits", client=client)
    with lock:
        (owner,) = [k.decode() for k in client.hkeys(lock._keys.lock) if not k.startswith(b":")]
    hold_id = owner.rsplit(":", 1)[1]
    assert len(hold_id) == 12 and not hold_id.isdigit()
    assert guess_kind([parse_owner(owner, 1)], None) == "DistLock"
