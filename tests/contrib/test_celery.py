"""distlock.contrib.celery: celery-once's and celery-singleton's locks are DistLocks, taken by
a producer process and cleared by the worker, another process (Celery on an in-memory broker;
the worker's side runs the task eagerly, with ``apply``)."""

from __future__ import annotations

import subprocess
import sys
import uuid
from typing import Any, Iterator

import pytest

pytest.importorskip("celery")
pytest.importorskip("celery_once")
pytest.importorskip("celery_singleton")

import celery_singleton.backends  # noqa: E402
from _celery_workers import ONCE, SINGLE, lock_for_the_worker, make_app, produce  # noqa: E402
from _procs import Children, recv  # noqa: E402
from celery_once import AlreadyQueued  # noqa: E402
from celery_singleton import clear_locks  # noqa: E402

import distlock  # noqa: E402
from distlock.contrib.celery import OnceBackend, SingletonBackend  # noqa: E402

pytestmark = pytest.mark.real_redis


@pytest.fixture
def app(url: str) -> Iterator[Any]:
    celery_singleton.backends._backend = None  # celery-singleton keeps one backend per process
    try:
        yield make_app(url)
    finally:
        celery_singleton.backends._backend = None


def test_importing_the_adapter_imports_no_celery() -> None:
    code = ("import sys, distlock, distlock.contrib.celery\n"
            "assert not {'celery', 'celery_once', 'celery_singleton', 'kombu'} & set(sys.modules)\n")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_a_lock_taken_by_the_producer_is_cleared_by_the_worker(app: Any, url: str, client: Any,
                                                               children: Children) -> None:
    produced = recv(children.start(produce, url))
    children.close()  # the producer is gone; its holds were detached, not given back
    assert 0 < produced["countdown"] <= 60  # its second apply_async: AlreadyQueued

    # celery-once: the producer's lock holds here, with its lease
    once = app.tasks[ONCE]
    key = produced["once_key"]
    assert key == once.get_key(args=(1, 2))
    assert distlock.DistLock(key, client=client).holder() == "celery-once"
    with pytest.raises(AlreadyQueued) as queued:
        once.apply_async(args=(1, 2))
    assert 0 < queued.value.countdown <= 60
    once.apply_async(args=(2, 2))  # other arguments, another lock

    # the worker runs the task, and celery-once clears the lock after it
    assert once.apply(args=(1, 2)).get() == 3
    assert not distlock.DistLock(key, client=client).locked()
    once.apply_async(args=(1, 2))  # queued again

    # celery-singleton: a duplicate gets the queued task's result, in any process
    single = app.tasks[SINGLE]
    assert produced["again"] == produced["first"]
    assert single.apply_async(args=(1, 2)).id == produced["first"]
    name = produced["single_lock"]
    leader = distlock.DistElection(name, client=client).leader()
    assert leader is not None and leader.value == produced["first"] and 0 < leader.ttl <= 60
    assert single.apply(args=(1, 2), task_id=produced["first"]).get() == 3  # unlocks when done
    assert not distlock.DistLock(name, client=client).locked()
    fresh = single.apply_async(args=(1, 2))
    assert fresh.id != produced["first"]
    assert single.apply_async(args=(1, 2)).id == fresh.id


def test_singleton_unlock_get_and_clear(app: Any, url: str, client: Any) -> None:
    single = app.tasks[SINGLE]
    first, other = single.apply_async(args=(1, 1)), single.apply_async(args=(1, 3))
    assert first.id != other.id
    backend = single.singleton_backend
    assert isinstance(backend, SingletonBackend)
    lock = single.generate_lock(SINGLE, [1, 1])
    assert backend.get(lock) == first.id
    backend.unlock(lock)
    assert backend.get(lock) is None
    backend.unlock(lock)  # nothing held: nothing happens

    unrelated = distlock.DistLock("not-a-singleton", client=client)
    unrelated.acquire()
    single.apply_async(args=(1, 1))
    clear_locks(app)  # every lock under the key prefix
    assert backend.get(lock) is None
    assert backend.get(single.generate_lock(SINGLE, [1, 3])) is None
    assert unrelated.owned()
    unrelated.release()

    # a lock with no expiry still has a lease: the backend's default_expiry
    assert backend.lock("SINGLETONLOCK_x", "task-9")
    assert not backend.lock("SINGLETONLOCK_x", "task-10")
    leader = distlock.DistElection("SINGLETONLOCK_x", client=client).leader()
    assert leader is not None and leader.value == "task-9"
    assert 3500 < leader.ttl <= SingletonBackend.DEFAULT_EXPIRY
    backend.clear("SINGLETONLOCK_")
    assert backend.get("SINGLETONLOCK_x") is None


def test_singleton_backend_url_that_is_no_redis_means_the_default_client() -> None:
    assert SingletonBackend("memory://").client is None
    assert SingletonBackend(None).client is None
    assert SingletonBackend("redis://example.invalid:1/0").client == "redis://example.invalid:1/0"
    assert SingletonBackend("redis://example.invalid:1/0", default_expiry=5).default_expiry == 5


def test_once_backend_returns_the_handle_and_clears_by_name(url: str, client: Any) -> None:
    backend = OnceBackend({"url": url})
    handle = backend.raise_or_lock("qo_job_a-1", timeout=30)
    with pytest.raises(AlreadyQueued):
        OnceBackend({"url": url}).raise_or_lock("qo_job_a-1", timeout=30)
    distlock.DistLock.release_handle(handle, client=client)  # the token-checked path
    backend.raise_or_lock("qo_job_a-1", timeout=30)
    assert OnceBackend({"url": url}).clear_lock("qo_job_a-1")  # by name, from anywhere
    assert not OnceBackend({"url": url}).clear_lock("qo_job_a-1")
    with pytest.raises(distlock.LockLostError):
        distlock.DistLock.release_handle(handle, client=client)

    # blocking: waits up to blocking_timeout for the lock
    backend.raise_or_lock("qo_job_b", timeout=0.3)
    waiting = OnceBackend({"url": url, "blocking": True, "blocking_timeout": 5})
    waiting.raise_or_lock("qo_job_b", timeout=30)  # taken once the first lease ran out
    assert waiting.clear_lock("qo_job_b")


def test_the_lock_crosses_processes_through_its_handle(url: str, client: Any,
                                                       children: Children) -> None:
    """The producer's hold, handed to the worker's process by its handle: adopted there with
    its token, released token-checked; the handle is then stale."""
    key = f"qo_handoff_{uuid.uuid4().hex[:8]}"
    handle, holder = recv(children.start(lock_for_the_worker, url, key))
    children.close()  # the producer is gone; its hold was detached, not given back
    token = int(client.hget(f"distlock:{{{key}}}", ":t"))
    worker = distlock.DistLock.adopt(handle, client=client)
    assert worker.owned() and worker.token == token and holder == "celery-once"
    worker.release()
    assert not worker.locked()
    with pytest.raises(distlock.LockLostError):
        distlock.DistLock.release_handle(handle, client=client)
