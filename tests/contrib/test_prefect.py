"""distlock.contrib.prefect: DistlockLockManager keeps Prefect's LockManager contract, as
Prefect's own tests hold MemoryLockManager to it, in one process and across processes."""

from __future__ import annotations

import asyncio
import pickle
import queue
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("prefect")

from _prefect_workers import serve  # noqa: E402
from _procs import Children, recv  # noqa: E402
from prefect.filesystems import LocalFileSystem  # noqa: E402
from prefect.locking.protocol import LockManager  # noqa: E402
from prefect.results import ResultStore  # noqa: E402

import distlock  # noqa: E402
from distlock.contrib._byname import break_hold  # noqa: E402
from distlock.contrib.prefect import DistlockLockManager  # noqa: E402

pytestmark = pytest.mark.real_redis


@pytest.fixture
def manager(url: str) -> DistlockLockManager:
    return DistlockLockManager(url)


def new_key() -> str:
    return str(uuid.uuid4())


def test_importing_the_adapter_imports_no_prefect() -> None:
    code = ("import sys, distlock, distlock.contrib.prefect\n"
            "assert 'prefect' not in sys.modules\n")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_it_is_a_lock_manager_and_pickles(manager: DistlockLockManager, client: Any) -> None:
    assert isinstance(manager, LockManager)
    copy = pickle.loads(pickle.dumps(manager))
    assert (copy.client, copy.prefix) == (manager.client, manager.prefix)
    assert copy == manager and copy != DistlockLockManager(manager.client, prefix="other:")
    with pytest.raises(TypeError):
        pickle.dumps(DistlockLockManager(client))


def test_acquire_release_and_idempotence(manager: DistlockLockManager, client: Any) -> None:
    key = new_key()
    assert not manager.is_lock_holder(key, "holder1")
    assert manager.acquire_lock(key, holder="holder1")
    assert manager.acquire_lock(key, holder="holder1")  # the holder has it: True at once
    assert manager.is_locked(key) and manager.is_lock_holder(key, "holder1")
    assert not manager.is_lock_holder(key, "holder2")
    assert distlock.DistLock("prefect:" + key, client=client).holder() == "holder1"
    with pytest.raises(ValueError, match=f"No lock held by holder2 for transaction with key {key}"):
        manager.release_lock(key, holder="holder2")
    assert manager.is_locked(key)
    manager.release_lock(key, holder="holder1")
    assert not manager.is_locked(key)
    with pytest.raises(ValueError):
        manager.release_lock(key, holder="holder1")


def test_timeouts(manager: DistlockLockManager) -> None:
    key = new_key()
    assert manager.acquire_lock(key, holder="holder1")
    assert not manager.acquire_lock(key, holder="holder2", acquire_timeout=0.1)
    assert not manager.acquire_lock(key, holder="holder2", acquire_timeout=0)
    assert not manager.wait_for_lock(key, timeout=0.1)
    manager.release_lock(key, holder="holder1")
    assert manager.wait_for_lock(key) and manager.wait_for_lock(new_key())  # free, never locked

    # hold_timeout: the hold ends by itself; a blocked acquire then gets it
    assert manager.acquire_lock(key, holder="holder1", hold_timeout=0.5)
    assert manager.is_locked(key)
    assert manager.acquire_lock(key, holder="holder2")
    assert manager.is_lock_holder(key, "holder2")
    manager.release_lock(key, holder="holder2")
    assert manager.acquire_lock(key, holder="holder1", hold_timeout=0.1)
    assert manager.wait_for_lock(key)
    assert not manager.is_locked(key)
    with pytest.raises(ValueError):
        manager.release_lock(key, holder="holder1")  # its hold_timeout ran out


def test_locking_works_across_threads(manager: DistlockLockManager) -> None:
    key = new_key()
    assert manager.acquire_lock(key, holder="holder1")
    got = queue.Queue()  # type: ignore[var-annotated]
    thread = threading.Thread(target=lambda: got.put(manager.acquire_lock(key, holder="holder2")))
    thread.start()
    time.sleep(0.05)
    assert got.empty()
    manager.release_lock(key, holder="holder1")
    thread.join(10)
    assert got.get_nowait() and manager.is_lock_holder(key, "holder2")
    manager.release_lock(key, holder="holder2")


def test_async_acquire_and_wait(manager: DistlockLockManager) -> None:
    key = new_key()

    async def main() -> None:
        assert await manager.aacquire_lock(key, holder="holder1")
        assert not await manager.aacquire_lock(key, holder="holder2", acquire_timeout=0.1)
        assert not await manager.await_for_lock(key, timeout=0.1)
        waiting = asyncio.ensure_future(manager.aacquire_lock(key, holder="holder2"))
        await asyncio.sleep(0.05)
        assert not waiting.done()
        manager.release_lock(key, holder="holder1")
        assert await waiting and manager.is_lock_holder(key, "holder2")
        manager.release_lock(key, holder="holder2")
        assert await manager.await_for_lock(key)

    asyncio.run(main())


def test_a_cancelled_async_acquire_stops_waiting_and_takes_nothing(manager: DistlockLockManager) -> None:
    key = new_key()

    async def main() -> None:
        assert manager.acquire_lock(key, holder="holder1", hold_timeout=30)
        waiting = asyncio.ensure_future(manager.aacquire_lock(key, holder="holder2"))
        await asyncio.sleep(0.05)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting

    asyncio.run(main())
    # its thread stops waiting within a slice, without taking the lock, and ends
    for thread in threading.enumerate():
        if thread.name == "DistlockLockManager-wait":
            thread.join(30)
            assert not thread.is_alive()
    assert manager.is_lock_holder(key, "holder1")
    manager.release_lock(key, holder="holder1")
    assert not manager.is_locked(key)
    assert manager.acquire_lock(key, holder="holder3", acquire_timeout=0)
    assert list(manager._held) == [key]  # holder1's ended hold is forgotten
    manager.release_lock(key, holder="holder3")


def test_result_store_reads_wait_for_the_lock(manager: DistlockLockManager, tmp_path: Path) -> None:
    """Prefect's own use: a SERIALIZABLE record is read only once its writer released it."""
    key = new_key()
    store = ResultStore(lock_manager=manager, result_storage=LocalFileSystem(basepath=str(tmp_path)))
    read = queue.Queue()  # type: ignore[var-annotated]
    thread = threading.Thread(target=lambda: read.put(store.read(key).result))
    assert store.acquire_lock(key, holder="holder1")
    thread.start()
    with pytest.raises(RuntimeError, match="locked by another holder"):
        store.write(key=key, obj={"test": "value"}, holder="holder2")
    store.write(key=key, obj={"test": "value"}, holder="holder1")
    store.release_lock(key, holder="holder1")
    thread.join(10)
    assert read.get_nowait() == {"test": "value"}


def call(conn: Any, method: str, *args: Any, **kwargs: Any) -> Any:
    conn.send((method, args, kwargs))
    return recv(conn)


def test_across_processes(manager: DistlockLockManager, children: Children) -> None:
    key = new_key()
    other = children.start(serve, manager)  # the manager, pickled into another process
    assert manager.acquire_lock(key, holder="parent")
    assert call(other, "acquire_lock", key, "child", acquire_timeout=0.1) == ("ok", False)
    assert call(other, "is_lock_holder", key, "parent") == ("ok", True)
    assert call(other, "release_lock", key, "child")[:2] == ("error", "ValueError")
    assert manager.is_lock_holder(key, "parent")

    # a blocked acquire in the other process is woken by this one's release
    other.send(("acquire_lock", (key, "child"), {}))
    time.sleep(0.1)
    manager.release_lock(key, holder="parent")
    assert recv(other) == ("ok", True)
    assert manager.is_lock_holder(key, "child")
    assert not manager.acquire_lock(key, holder="parent", acquire_timeout=0)

    # the holder's release from this process (not the one that took it) ends the hold
    manager.release_lock(key, holder="child")
    assert not manager.is_locked(key)

    # a hold with a hold_timeout outlives the process that took it, until it is released...
    assert call(other, "acquire_lock", key, "child", hold_timeout=30) == ("ok", True)
    assert call(other, "wait_for_lock", key, 0.1) == ("ok", False)
    other.send(None)
    children.close()
    assert manager.is_lock_holder(key, "child")
    manager.release_lock(key, holder="child")
    assert manager.wait_for_lock(key, timeout=0)


def test_a_release_checks_the_token_it_read(manager: DistlockLockManager, url: str) -> None:
    """The check and the release are one: a hold granted after the read is never ended."""
    key = new_key()
    assert manager.acquire_lock(key, holder="holder1")
    lock = distlock.DistLock("prefect:" + key, client=url)
    token = distlock.DistElection("prefect:" + key, client=url).leader().epoch  # type: ignore[union-attr]
    assert not break_hold(url, "prefect:" + key, token - 1)  # the hold read was another
    assert manager.is_lock_holder(key, "holder1")
    assert break_hold(url, "prefect:" + key, token)
    assert lock.acquire(blocking=False)
    lock.release()
