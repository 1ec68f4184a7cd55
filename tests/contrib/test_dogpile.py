"""distlock.contrib.dogpile: dogpile.cache's ``distlock.redis`` backend (a DistLock per key as
the dogpile lock) and the read/write ``lock_factory`` of its file backend, across processes."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, List, Tuple

import pytest

pytest.importorskip("dogpile.cache")

import _contrib_workers  # noqa: E402
from _procs import Children, recv  # noqa: E402
from dogpile.cache import make_region  # noqa: E402
from dogpile.cache.api import NO_VALUE  # noqa: E402

import distlock  # noqa: E402
from distlock import DistLock, DistReadWriteLock  # noqa: E402
from distlock._core.keys import Keys  # noqa: E402
from distlock.contrib.dogpile import DistlockRedisBackend, DogpileLock, ReadWriteMutex, lock_factory  # noqa: E402

pytestmark = pytest.mark.real_redis


def lock_pttl(client: Any, name: str) -> int:
    return int(client.pttl(Keys("distlock:", name).lock))


def race(children: Children, url: str, backend: str, key: str, counter: str,
         filename: Any = None, distributed: bool = True) -> List[Tuple[float, float, str]]:
    """Two processes that ask for the same missing key at the same moment."""
    conns = [children.start(_contrib_workers.dogpile_race, url, backend, key, counter, filename,
                            distributed) for _ in range(2)]
    assert [recv(c) for c in conns] == ["ready", "ready"]
    for c in conns:
        c.send("go")
    return [recv(c) for c in conns]


def test_import_distlock_imports_no_dogpile() -> None:
    code = "import sys, distlock; print(sorted(m for m in sys.modules if m.startswith('dogpile')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stdout + out.stderr


def test_the_entry_point_names_the_backend(url: str, client: Any) -> None:
    region = make_region().configure("distlock.redis", arguments={"url": url})
    assert isinstance(region.backend, DistlockRedisBackend)
    assert region.get_or_create("k", lambda: "v") == "v"
    assert client.get("k") is not None  # dogpile's own storage, as its redis backend keeps it
    mutex = region.backend.get_mutex("k")
    assert isinstance(mutex, DogpileLock) and isinstance(mutex, DistLock)
    assert mutex.name == "_lockk"
    region.delete("k")


@pytest.mark.slow
def test_two_processes_that_miss_at_once_create_once(children: Children, url: str, client: Any) -> None:
    results = race(children, url, "distlock.redis", "report", "created")
    (asked_a, back_a, value_a), (asked_b, back_b, value_b) = results
    # both asked before either had an answer: both missed (the value is stored after creation)
    assert max(asked_a, asked_b) < min(back_a, back_b)
    assert int(client.get("created")) == 1
    assert value_a == value_b and value_a.startswith("made #1 ")
    assert not DistLock("_lockreport", client=client).locked()


@pytest.mark.slow
def test_without_the_distributed_lock_both_create(children: Children, url: str, client: Any) -> None:
    """The control: ``distributed_lock=False`` is dogpile's in-process mutex, and the same race
    creates twice."""
    region = _contrib_workers.dogpile_region(url, "distlock.redis", distributed=False)
    assert region.backend.get_mutex("report") is None
    race(children, url, "distlock.redis", "report", "created", distributed=False)
    assert int(client.get("created")) == 2


def test_no_server_given_is_distlocks_default_server(url: str, client: Any) -> None:
    distlock.configure(url)
    try:
        region = make_region().configure("distlock.redis")  # no url, host, port nor pool
        assert region.get_or_create("k", lambda: "v") == "v" and client.get("k") is not None
        region.delete("k")
    finally:
        distlock._session.config._default = None
        distlock._session.config._default_client = None
        distlock._session.config._default_async = None


def test_lock_timeout_is_the_lease_and_none_the_watchdog(url: str, client: Any) -> None:
    leased = make_region().configure("distlock.redis", arguments={"url": url, "lock_timeout": 5})
    mutex = leased.backend.get_mutex("k")
    assert mutex.acquire(True)
    assert 4000 < lock_pttl(client, "_lockk") <= 5000
    mutex.release()
    watched = make_region().configure("distlock.redis", arguments={"url": url})
    mutex = watched.backend.get_mutex("k")
    assert mutex.acquire(True)
    assert 25_000 < lock_pttl(client, "_lockk") <= 30_000  # the watchdog's lease
    mutex.release()


def test_arguments_are_checked_when_the_region_is_configured(url: str) -> None:
    for bad, error in (({"lock_timeout": 0}, ValueError), ({"lock_timeout": "5"}, TypeError),
                       ({"lock_blocking_timeout": -2}, ValueError),
                       ({"lock_blocking_timeout": -1}, ValueError),
                       ({"lock_prefix": "x"}, ValueError)):
        with pytest.raises(error):
            make_region().configure("distlock.redis", arguments={"url": url, **bad})


def test_lock_prefix_and_blocking_timeout(url: str, client: Any) -> None:
    region = make_region().configure("distlock.redis", arguments={
        "url": url, "lock_prefix": "_dp:", "lock_blocking_timeout": 0.2, "lock_sleep": 5})
    first, second = region.backend.get_mutex("k"), region.backend.get_mutex("k")
    assert first.name == "_dp:k"
    assert first.acquire(True)
    assert first.locked() and second.locked()
    assert second.acquire(False) is False
    start = time.monotonic()
    assert second.acquire(True) is False  # lock_blocking_timeout, not for ever
    assert 0.15 < time.monotonic() - start < 5.0
    first.release()
    assert second.acquire(True)
    second.release()


def test_async_creation_runner_releases_from_another_thread(url: str, client: Any) -> None:
    gate = threading.Event()
    gate.set()
    made: List[int] = []
    released_in: List[Any] = []
    errors: List[BaseException] = []
    runners: List[threading.Thread] = []

    def creator() -> str:
        made.append(1)
        assert gate.wait(20)
        return f"v{len(made)}"

    def runner(cache: Any, key: str, create: Any, mutex: Any) -> None:
        def run() -> None:
            try:
                cache.set(key, create())
            except BaseException as exc:  # noqa: BLE001 - reported to the test
                errors.append(exc)
            finally:
                try:
                    mutex.release()
                    released_in.append(threading.current_thread())
                except BaseException as exc:  # noqa: BLE001 - reported to the test
                    errors.append(exc)
        t = threading.Thread(target=run)
        runners.append(t)
        t.start()

    region = make_region(async_creation_runner=runner).configure(
        "distlock.redis", expiration_time=3600, arguments={"url": url})
    assert region.get_or_create("k", creator) == "v1"  # no value yet: created in this thread
    assert not runners
    region.invalidate(hard=False)  # the value is stale now, not gone
    gate.clear()
    start = time.monotonic()
    assert region.get_or_create("k", creator) == "v1"  # the stale value, at once
    assert time.monotonic() - start < 5.0
    assert len(runners) == 1
    # the runner's thread holds the key's DistLock while it creates: nobody else may
    other = make_region().configure("distlock.redis", arguments={"url": url})
    assert other.backend.get_mutex("k").acquire(False) is False
    assert DistLock("_lockk", client=client).locked()
    gate.set()
    runners[0].join(20)
    assert errors == [] and released_in == [runners[0]]
    assert not DistLock("_lockk", client=client).locked()
    assert region.get("k") == "v2" and len(made) == 2
    region.delete("k")


def test_lock_factory_is_a_read_write_lock(url: str) -> None:
    rw = lock_factory("/tmp/some.dbm.rw.lock", client=url)
    assert isinstance(rw, ReadWriteMutex) and rw.name == "/tmp/some.dbm.rw.lock"
    assert lock_factory is DistReadWriteLock.lock_factory
    assert rw.acquire_write_lock(True) and rw.is_open
    seen: List[Any] = []

    def other_thread() -> None:
        mine = DistReadWriteLock.lock_factory("/tmp/some.dbm.rw.lock", client=url)
        seen.append(mine.acquire_read_lock(False))
        seen.append(mine.acquire_write_lock(False))
        seen.append(mine.is_open)

    t = threading.Thread(target=other_thread)
    t.start()
    t.join(20)
    assert seen == [False, False, False]  # each thread holds its own side, as dogpile asks
    rw.release_write_lock()
    assert rw.acquire_read_lock(False)
    with rw.read():  # shared, and reentrant per thread
        pass
    rw.release_read_lock()
    with rw.write():
        assert rw.rw.write_lock().owned()
    assert not rw.is_open
    with pytest.raises(distlock.LockNotOwnedError):
        rw.release_read_lock()


@pytest.mark.slow
def test_file_backend_with_the_read_write_lock_factory(children: Children, url: str, client: Any,
                                                       tmp_path: Path) -> None:
    filename = str(tmp_path / "cache.dbm")
    region = _contrib_workers.dogpile_region(url, "dbm", filename)  # creates the dbm file
    rw = region.backend._rw_lock
    assert isinstance(rw, ReadWriteMutex) and rw.name == filename + ".rw.lock"
    assert region.get("report") is NO_VALUE
    results = race(children, url, "dbm", "report", "created", filename)
    (asked_a, back_a, value_a), (asked_b, back_b, value_b) = results
    assert max(asked_a, asked_b) < min(back_a, back_b)
    assert int(client.get("created")) == 1
    assert value_a == value_b
    assert region.get("report") == value_a  # written under the write lock, read under the read lock
    # no lock file was made, and nothing but token counters is left in Redis
    assert sorted(p.name for p in tmp_path.iterdir() if "lock" in p.name) == []
    left = {k.decode() for k in client.scan_iter(count=1000)} - {"created"}
    assert left and all(k.endswith(":fence") for k in left), left


def test_the_dogpile_lock_of_the_file_backend_is_a_write_lock(url: str, client: Any,
                                                              tmp_path: Path) -> None:
    filename = str(tmp_path / "cache.dbm")
    region = _contrib_workers.dogpile_region(url, "dbm", filename)
    seen: List[bool] = []

    def creator() -> str:
        writer = DistReadWriteLock(filename + ".dogpile.lock", client=client).write_lock()
        seen.append(writer.locked())
        return "v"

    assert region.get_or_create("k", creator) == "v"
    assert seen == [True]
