"""Holds that change hands (docs/guides/handles.rst): a DistLock hold exported as a handle is
detached from its process, adopted or released elsewhere, and every use of a handle checks its
token, so that a stale handle changes nothing."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest
import redis
from _aio import run_in_loop
from _handle_workers import adopt_and_report, export_and_exit
from _procs import recv
from _support import distlock_keys, until

import distlock
import distlock.asyncio as aio
from distlock import DistLock, LockLostError, LockNotOwnedError
from distlock.testing.failpoints import BEFORE, LATE, LOST, arm

pytestmark = [pytest.mark.real_redis, pytest.mark.cluster_too]


def _name() -> str:
    return f"handle:{uuid.uuid4().hex[:10]}"


def _hash(client: Any, name: str) -> Any:
    return client.hgetall(f"distlock:{{{name}}}")


def test_an_exported_hold_is_detached_and_lives_by_its_lease(client: Any) -> None:
    name = _name()
    lock = DistLock(name, client=client)
    lock.acquire()
    token = lock.token
    handle = lock.export(lease=7)
    assert isinstance(handle, str) and not lock.owned() and lock.token is None
    assert 0 < client.pttl(f"distlock:{{{name}}}") <= 7000  # the export's lease, not the watchdog's
    with pytest.raises(LockNotOwnedError):
        lock.release()  # it is no longer this object's
    assert not lock.acquire(blocking=False)  # still held, by the handle
    adopted = DistLock.adopt(handle, client=client)
    assert adopted.owned() and adopted.token == token
    adopted.release()
    assert not lock.locked()
    assert [k for k in distlock_keys(client) if name in k and not k.endswith(":fence")] == []


def test_a_stale_handle_changes_nothing(client: Any) -> None:
    name = _name()
    lock = DistLock(name, client=client)
    lock.acquire()
    handle = lock.export(lease=5)
    DistLock.release_handle(handle, client=client)
    with pytest.raises(LockLostError):
        DistLock.release_handle(handle, client=client)
    lock.acquire()  # granted again: the old handle names an ended hold
    before = _hash(client, name)
    with pytest.raises(LockLostError, match="stale|gone"):
        DistLock.adopt(handle, client=client)
    with pytest.raises(LockLostError):
        DistLock.release_handle(handle, client=client)
    assert _hash(client, name) == before and lock.owned()
    lock.release()


def test_a_handle_is_used_once(client: Any) -> None:
    """An adoption renames the hold's owner: a second adoption of the same handle (a task
    delivered twice), or a release by it after the adoption, changes nothing."""
    name = _name()
    lock = DistLock(name, client=client)
    lock.acquire()
    handle = lock.export(lease=10)
    first = DistLock.adopt(handle, client=client)
    before = _hash(client, name)
    with pytest.raises(LockLostError):
        DistLock.adopt(handle, client=client)
    with pytest.raises(LockLostError):
        DistLock.release_handle(handle, client=client)
    assert _hash(client, name) == before and first.owned()
    again = first.export(lease=10)  # an adopted hold can be handed on in turn
    assert again != handle and not first.owned()
    DistLock.release_handle(again, client=client)
    assert not lock.locked()


def test_an_export_renames_the_owner_so_a_late_renewal_finds_nothing(client: Any) -> None:
    name = _name()
    lock = DistLock(name, client=client)
    lock.acquire()
    old_owner = next(k for k in _hash(client, name) if not k.startswith(b":"))
    handle = lock.export(lease=10)
    fields = _hash(client, name)
    assert old_owner not in fields and len([k for k in fields if not k.startswith(b":")]) == 1
    # what the exporter's watchdog would send, had a renewal been in flight
    assert client.evalsha(client.script_load(
        "return redis.call('hexists', KEYS[1], ARGV[1])"), 1, f"distlock:{{{name}}}", old_owner) == 0
    DistLock.release_handle(handle, client=client)


def test_the_holder_value_is_read_by_anyone(client: Any) -> None:
    name = _name()
    lock, other = DistLock(name, client=client, holder="task 42|x"), DistLock(name, client=client)
    assert other.holder() is None
    with lock:
        assert other.holder() == "task 42|x"
    with other:
        assert lock.holder() == ""


def test_an_adopter_with_no_lease_renews_the_hold(client: Any) -> None:
    distlock.configure(lease=1.0, renew_interval=0.2)
    name = _name()
    lock = DistLock(name, client=client)
    lock.acquire()
    adopted = DistLock.adopt(lock.export(lease=1.0), client=client)
    until(lambda: client.hget(f"distlock:{{{name}}}", ":l") not in (None, b"1000"), what="a renewal")
    assert adopted.owned()
    adopted.release()


@pytest.mark.server_only
def test_a_hold_crosses_processes_and_outlives_its_exporter(url: str, client: Any, children: Any) -> None:
    name = _name()
    exporter = children.start(export_and_exit, url, name, 20.0)
    handle, token = recv(exporter)
    children.procs[0].join(30)
    assert children.procs[0].exitcode == 0
    assert int(client.hget(f"distlock:{{{name}}}", ":t")) == token  # not given back at exit
    assert DistLock(name, client=client).holder() == "exporter"
    adopter = children.start(adopt_and_report, url, handle)
    assert recv(adopter) == (True, token)
    assert not DistLock(name, client=client).acquire(blocking=False)
    adopter.send("go")
    assert recv(adopter) == "released"
    assert not DistLock(name, client=client).locked()


@pytest.mark.server_only
def test_the_asyncio_shell_exports_adopts_and_releases(url: str, client: Any) -> None:
    name = _name()

    async def body(ac: Any) -> None:
        lock = aio.DistLock(name, client=ac, holder="t")
        await lock.acquire()
        token = lock.token
        handle = await lock.export(lease=5)
        assert await lock.holder() == "t" and not lock.owned()
        adopted = await aio.DistLock.adopt(handle, client=ac)
        assert adopted.token == token
        await adopted.release()
        with pytest.raises(LockLostError):
            await aio.DistLock.release_handle(handle, client=ac)
        await lock.acquire()
        await aio.DistLock.release_handle(await lock.export(), client=ac)
        assert not await lock.locked()
        await asyncio.sleep(0)
    run_in_loop(url, body)


@pytest.mark.server_only
def test_bad_input_gets_the_right_error(client: Any, redlock_clients: Any) -> None:
    lock = DistLock(_name(), client=client)
    with pytest.raises(LockNotOwnedError):
        lock.export()
    for bad in (None, 3, b"distlock-hold:1:x"):
        with pytest.raises(TypeError):
            DistLock.adopt(bad, client=client)  # type: ignore[arg-type]
    for bad in ("", "hello", "distlock-hold:1:", "distlock-hold:1:!!!", "distlock-hold:1:WzEsMiwzXQ"):
        with pytest.raises(ValueError):
            DistLock.release_handle(bad, client=client)
    with pytest.raises(TypeError):
        DistLock(_name(), client=client, holder=5)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        DistLock(_name(), client=client, holder="x" * 2000)
    fair = DistLock(_name(), client=client, fair=True)
    fair.acquire()
    with pytest.raises(TypeError):
        fair.export()
    fair.release()
    quorum = DistLock(_name(), client=redlock_clients)
    quorum.acquire()
    with pytest.raises(TypeError):
        quorum.export()
    quorum.release()
    lock.acquire()
    with pytest.raises(ValueError):
        lock.export(lease=-1)
    assert lock.owned()  # a refused export leaves the hold as it was
    lock.release()


@pytest.mark.server_only
def test_distlock_status_shows_the_holder_value(url: str, client: Any) -> None:
    import subprocess
    import sys

    name = _name()
    with DistLock(name, client=client, holder="task-17"):
        shown = subprocess.run([sys.executable, "-m", "distlock", "status", "--url", url, name],
                               capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert shown.returncode == 0, shown.stderr
    assert "holder 'task-17'" in shown.stdout


@pytest.mark.server_only
@pytest.mark.parametrize("how", [BEFORE, LOST, LATE])
def test_an_export_whose_reply_is_lost_leaves_no_hold_behind(client: Any, how: str) -> None:
    """Nobody holds the handle of an export that failed: the hold is given back, under the
    name it had or the handle's, whichever it has."""
    name = _name()
    lock = DistLock(name, client=client)
    lock.acquire()
    points = arm(lock)
    points.fail("lock_handover", 1, how)
    with points.active(), pytest.raises((redis.ConnectionError, redis.TimeoutError)):
        lock.export(lease=30)
    assert not lock.owned()
    until(lambda: not client.exists(f"distlock:{{{name}}}"), what="the hold given back")


@pytest.mark.server_only
@pytest.mark.parametrize("how", [BEFORE, LOST, LATE])
def test_an_adoption_whose_reply_is_lost_leaves_no_hold_nobody_believes(client: Any, how: str) -> None:
    """If the hand-over ran, the adopter's name is given back; if it did not, the handle still
    names the hold, and a second adoption takes it."""
    name = _name()
    lock = DistLock(name, client=client)
    lock.acquire()
    handle = lock.export(lease=30)
    points = arm(lock)
    points.fail("lock_handover", 1, how)
    with points.active(), pytest.raises((redis.ConnectionError, redis.TimeoutError)):
        DistLock.adopt(handle, client=client)
    if how == BEFORE:
        adopted = DistLock.adopt(handle, client=client)
        assert adopted.owned()
        adopted.release()
    else:
        until(lambda: not client.exists(f"distlock:{{{name}}}"), what="the hold given back")
        with pytest.raises(LockLostError):
            DistLock.adopt(handle, client=client)
