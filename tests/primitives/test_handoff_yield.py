"""The direct hand-off between processes (docs/guides/locks.rst, "Hand-off between processes").

A default lock's release that yields (its process' quantum is over, or it never waited)
hands the lock straight to a waiter of the longest-registered waiting process, when that
waiter's refused try left its process' hand-off record in the lock's hash: a new token, that
waiter's owner, a short lease (the shorter of its lease and its registry entry's), and a
message that names it. The waiter returns without a try of its own and lengthens the lease
off its caller's path.

Checked here against a real server:
- the hand-off itself: Redis's owner is the other process' waiter as soon as the release
  returns; that process' ``acquire()`` returns holding it, with that token, in both shells;
- a hold handed to a waiter that is gone is believed by nobody and ends with its short lease;
  the last waiter of a process that leaves takes its record with it;
- a rolling upgrade: a waiter of the previous release leaves no record and is never handed a
  hold; a release of the previous release frees the lock and wakes this release's waiter,
  which takes it with a try of its own. Either way the one caller that believes is Redis's owner.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any, List

import pytest
import redis
from _procs import recv
from _support import client_from_url, other_client, previous_script

import distlock
import distlock.asyncio as aio
from distlock import DistLock

pytestmark = pytest.mark.real_redis


def _owners(client: Any, lock: Any) -> List[bytes]:
    return [k for k in client.hkeys(lock._keys.lock) if not k.startswith(b":")]


def _records(client: Any, lock: Any) -> List[bytes]:
    return [k for k in client.hkeys(lock._keys.lock) if k.startswith(b":h")]


def _until(what: Any, bound: float = 20.0) -> None:
    deadline = time.monotonic() + bound
    while not what():
        assert time.monotonic() < deadline, "not seen in time"
        time.sleep(0.005)


def _waiting_process(url: str, name: str, conn: Any) -> None:
    client = client_from_url(url)
    lock = DistLock(name, client=client, lease=60)
    conn.send("waiting")
    ok = lock.acquire(timeout=60)
    hold = lock._current(lock._session())
    conn.send((ok, lock.token, lock.owned(), hold.owner if hold else None))
    assert recv(conn) == "release"
    lock.release()
    conn.send("released")


@pytest.mark.cluster_too
def test_a_yield_hands_the_lock_to_a_waiter_of_another_process(
        url: str, client: Any, children: Any) -> None:
    """The release's own script makes the other process' waiter the owner; that process
    returns holding the lock with the token the script gave it."""
    distlock.configure(wait_cap=60.0)  # only the release can wake the waiter in time
    holder = DistLock("yield", client=client, lease=60)
    assert holder.acquire()
    first = holder.token
    conn = children.start(_waiting_process, url, "yield")
    assert recv(conn) == "waiting"
    _until(lambda: _records(client, holder))  # its try was refused and left its record
    holder.release()
    owners = _owners(client, holder)
    assert len(owners) == 1  # handed in the release's own script, before any try of its own
    handed = int(client.hget(holder._keys.lock, ":t"))
    assert handed > first
    ok, token, owned, owner = recv(conn, 60)
    assert ok is True and owned and token == handed and owner.encode() == owners[0]
    assert not holder.acquire(blocking=False)  # it holds it
    conn.send("release")
    assert recv(conn, 30) == "released"
    assert not client.exists(holder._keys.lock)


def test_a_yield_hands_the_lock_to_a_task_of_another_process(url: str, client: Any) -> None:
    """The asyncio shell's waiter (a session of its own: another process, as far as the
    server can tell) is handed the lock the same way."""
    distlock.configure(wait_cap=60.0)
    holder = DistLock("yield-aio", client=client, lease=60)

    async def main() -> None:
        aclient = redis.asyncio.Redis.from_url(url)
        try:
            waiter = aio.DistLock("yield-aio", client=aclient, lease=60)
            task = asyncio.ensure_future(waiter.acquire(timeout=60))
            deadline = time.monotonic() + 20
            while not _records(client, holder):
                assert time.monotonic() < deadline
                await asyncio.sleep(0.005)
            await asyncio.get_running_loop().run_in_executor(None, holder.release)
            owners = _owners(client, holder)
            assert await asyncio.wait_for(task, 30) is True
            assert waiter.owned() and waiter.token == int(client.hget(holder._keys.lock, ":t"))
            assert len(owners) == 1 and owners[0].decode().startswith(waiter._session().id)
            await waiter.release()
        finally:
            await aclient.aclose() if hasattr(aclient, "aclose") else await aclient.close()

    assert holder.acquire()
    asyncio.run(main())
    assert not client.exists(holder._keys.lock)


def test_a_hold_handed_to_a_waiter_that_is_gone_ends_with_its_short_lease(url: str, client: Any) -> None:
    """A record whose waiter no longer listens (its process paused, or the wait switched
    away): the release still hands it the lock, which nobody believes, for the record's short
    lease (1 s here), after which anyone may take it."""
    holder = DistLock("gone", client=client, lease=60)
    assert holder.acquire()
    keys = holder._keys
    channel = keys.waiter_channel("nobody-listens")
    # a queued waiter's refused try, as a waiter with a 1 s lease sends it
    assert holder._session().run("lock_acquire", (keys.lock, keys.fence, keys.queue), (
        "ghost:1", 1000, 31000, "h:ghost", "w", 1, channel, 30000, "0", "ghost-ident")) < 0
    holder.release()
    assert _owners(client, holder) == [b"ghost:1"]
    assert 0 < client.pttl(keys.lock) <= 1000
    rival = DistLock("gone", client=other_client(url))
    assert not rival.acquire(blocking=False)
    assert rival.acquire(timeout=10)  # once the short lease ran out
    rival.release()
    assert not client.exists(keys.lock)


def test_the_last_waiter_of_a_process_takes_its_record_with_it(url: str, client: Any) -> None:
    holder = DistLock("left", client=client, lease=60)
    assert holder.acquire()
    waiter = DistLock("left", client=other_client(url))
    assert waiter.acquire(timeout=0.5) is False
    assert _records(client, holder) == []
    holder.release()
    assert not client.exists(holder._keys.lock)


# --- rolling upgrades -------------------------------------------------------------------------

def test_a_waiter_of_the_previous_release_is_never_handed_a_hold(url: str, client: Any) -> None:
    """The previous release's waiter leaves no record: the yield keeps the lock for its
    process for a moment, as before, and that process' own try takes it; nobody is made an
    owner it does not know of."""
    acquire = previous_script("lock_acquire")
    holder = DistLock("mixed-yield", client=client, lease=60)
    keys = holder._keys
    old_channel = keys.waiter_channel("previous-release")
    args = (3, keys.lock, keys.fence, keys.queue, "old:1", 30000, "h:old", "w", "1", old_channel,
            30000)
    assert holder.acquire()
    assert int(client.eval(acquire, *args)) < 0  # refused: registered, no record
    assert _records(client, holder) == []
    holder.release()
    assert _owners(client, holder) == []
    assert client.hget(keys.lock, ":r") == old_channel.encode()  # kept for it, as before
    # which that release reads as held: its try after the 250 ms reservation gets it
    deadline = time.monotonic() + 10
    while int(client.eval(acquire, *args)) < 0:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    assert _owners(client, holder) == [b"old:1"]
    client.delete(keys.lock, keys.queue)


def test_a_release_of_the_previous_release_wakes_this_releases_waiter(url: str, client: Any) -> None:
    """The previous release's script reads no records (nor keeps the lock for anyone): it
    frees the lock and wakes the waiting process, whose waiter (this release) takes it with
    a try of its own."""
    release = previous_script("lock_release")
    old = other_client(url)
    keys = DistLock("mixed-old", client=client)._keys
    assert int(old.eval(previous_script("lock_acquire"), 3, keys.lock, keys.fence, keys.queue,
                        "old:1", 60000, "h:old")) > 0
    token = int(old.hget(keys.lock, ":t"))
    waiter = DistLock("mixed-old", client=client, lease=60)
    got: List[Any] = []
    thread = threading.Thread(target=lambda: got.append(waiter.acquire(timeout=30)))
    thread.start()
    try:
        _until(lambda: _records(client, waiter))
        assert int(old.eval(release, 2, keys.lock, keys.queue, "old:1", token)) == 0
        thread.join(30)
        assert got == [True]
        assert [o.decode() for o in _owners(client, waiter)] == [waiter._current(waiter._session()).owner]
    finally:
        thread.join(30)
    waiter.release()
    assert not client.exists(keys.lock)


def test_a_waiter_that_leaves_is_replaced_in_its_process_record(url: str, client: Any) -> None:
    """Two threads of another process wait; the one whose record is in the hash times out.
    Its leaving wakes the other, whose try puts its own record in place: the release then
    hands the lock to the waiter that is still there, not to the one that left (whose hold
    nobody would take until its short lease ran out)."""
    distlock.configure(wait_cap=60.0)  # only a hint or the release can wake a waiter in time
    holder = DistLock("left-sibling", client=client, lease=60)
    assert holder.acquire()
    other = other_client(url)
    got: List[Any] = []
    stay = DistLock("left-sibling", client=other, lease=60)
    thread = threading.Thread(target=lambda: got.append(stay.acquire(timeout=60)))
    thread.start()
    try:
        _until(lambda: _records(client, holder))
        first = client.hget(holder._keys.lock, _records(client, holder)[0])
        leaver = DistLock("left-sibling", client=other, lease=60)
        left: List[Any] = []
        leaving = threading.Thread(target=lambda: left.append(leaver.acquire(timeout=3.0)))
        leaving.start()

        def nonce(record: bytes) -> bytes:  # '<nonce>/<try>': the wait, not its try
            return bytes(record.split()[0].partition(b"/")[0])

        def now() -> bytes:
            return nonce(client.hget(holder._keys.lock, _records(client, holder)[0]))

        _until(lambda: now() != nonce(first))  # the leaver's try wrote its record
        leaving.join(30)
        assert left == [False]
        _until(lambda: now() == nonce(first))  # the one still waiting wrote its own again
        holder.release()
        owner = _owners(client, holder)
        thread.join(30)
        assert got == [True]
        assert [o.decode() for o in owner] == [stay._current(stay._session()).owner]
    finally:
        thread.join(30)
    stay.release()
    assert not client.exists(holder._keys.lock)


@pytest.mark.parametrize("fair,names", [(False, True), (True, True), (True, False)],
                         ids=["default", "fair", "fair-of-an-older-release"])
def test_a_hand_off_held_up_past_its_lease_is_not_believed(url: str, client: Any, fair: bool,
                                                          names: bool) -> None:
    """A hand-off message believed from the try it names, not from the wait's latest refused
    try (docs/safety.rst, "Belief keeps time"). A release hands the lock to a waiter's try N
    (the record or queue entry that try left); the message is held up past the handed lease;
    meanwhile the hold ran out, another took it, and the waiter's later tries were refused.
    Here the late message is published by hand, naming a try sent 1.6 s before, with a 2 s
    lease and a token nobody holds: believed from that try, too little is left, so the waiter
    confirms it, finds it gone, and reports it lost. (Believed from its latest refused try,
    as before, it would have held it with more than a second left, while the other held it.)
    A fair release of the previous version names no try: believed from nothing, confirmed."""
    distlock.configure(wait_cap=0.5)  # the waiter tries at least every half second
    holder = DistLock("late-handoff", client=client, lease=60)
    assert holder.acquire()
    other = other_client(url)
    lost: List[Any] = []
    waiter = DistLock("late-handoff", client=other, lease=2.0, fair=fair)
    waiter.on_lost(lost.append)
    got: List[Any] = []
    thread = threading.Thread(target=lambda: got.append(waiter.acquire(timeout=30)))
    thread.start()
    try:
        def named() -> Any:
            """The waiter's nonce and the number of its latest refused try that Redis keeps."""
            if fair:
                fe = waiter._fair_keys.all[4]
                for field, value in client.hgetall(fe).items():
                    if field.startswith(b"#"):
                        return field[1:].decode(), int(value)
                return None
            records = _records(client, holder)
            if not records:
                return None
            nonce, _, number = client.hget(holder._keys.lock, records[0]).split()[0].partition(b"/")
            return nonce.decode(), int(number)

        _until(lambda: named() is not None)
        nonce, first = named()
        time.sleep(1.6)
        _until(lambda: named()[1] >= first + 2)  # later tries, refused
        channel = holder._keys.waiter_channel(waiter._session().id)
        payload = f"{int(holder.token) + 1000} 2000" + ("" if fair else " 2")
        named_try = f"{nonce}/{first}" if names else nonce
        assert client.publish(channel, f"+{named_try} {payload}") == 1
        thread.join(30)
        assert got == [True]  # the wait ended with a hand-off, which it then found gone
        assert not waiter.owned()
        _until(lambda: lost == [waiter])  # on_lost runs on the session's worker
        assert holder.owned()
        assert _owners(client, holder) == [holder._current(holder._session()).owner.encode()]
        with pytest.raises(distlock.LockLostError):
            waiter.release()
    finally:
        thread.join(30)
        other.close()
    holder.release()
    # the waiter's process stays registered (a real hand-off would have taken it out): the
    # release keeps the lock for it a moment, and the entry ends with its 2 s lease
    _until(lambda: not client.exists(holder._keys.lock, holder._keys.queue))
