"""distlock.contrib.django: django-redis's cache backend whose ``cache.lock()`` is a DistLock that
speaks redis-py's Lock API: the same scenario run on django-redis's own lock (redis-py's) and on
this one gives the same answers; the lock excludes another process; bad input is refused."""

from __future__ import annotations

import pickle
import subprocess
import sys
import time
from typing import Any, Callable, Iterator, List

import pytest

pytest.importorskip("django")
pytest.importorskip("django_redis")

import _contrib_workers  # noqa: E402
import redis  # noqa: E402
from _django_settings import cache_for  # noqa: E402
from _procs import Children, recv  # noqa: E402

import distlock  # noqa: E402
from distlock._core.keys import Keys  # noqa: E402
from distlock.contrib.django import (  # noqa: E402
    DjangoLock,
    LockError,
    LockLostError,
    LockNotOwnedError,
    RedisCache,
)

pytestmark = pytest.mark.real_redis


@pytest.fixture
def cache(url: str, client: Any) -> Iterator[Any]:
    made = cache_for(url)
    try:
        yield made
    finally:
        made.close()


def plain_django_redis(url: str) -> Any:
    """django-redis's own backend on the same server: its ``lock()`` is redis-py's Lock."""
    from django_redis.cache import RedisCache as Original

    return Original(url, {})


def pttl(cache: Any, lock: Any) -> int:
    """The remaining TTL of a lock's key, ms (redis-py's key is the name; distlock's its hash)."""
    key = Keys("distlock:", lock.name).lock if isinstance(lock, DjangoLock) else lock.name
    return int(cache.client.get_client(write=True).pttl(key))


def outcome(call: Callable[[], Any]) -> Any:
    """What a call gave, in redis-py's terms: its value, or the redis-py error it raised."""
    try:
        return call()
    except redis.exceptions.LockNotOwnedError:
        return "LockNotOwnedError"
    except redis.exceptions.LockError:
        return "LockError"


def scenario(cache: Any) -> List[Any]:
    """What django-redis users do with ``cache.lock()``, recorded step by step."""
    seen: List[Any] = []
    a, b = cache.lock("k", timeout=5), cache.lock("k", timeout=5)
    seen += [a.acquire(blocking=False), b.acquire(blocking=False)]
    seen += [b.acquire(blocking_timeout=0.2)]  # (redis-py's gives up a sleep early: no timing)
    seen += [a.owned(), b.owned(), a.locked(), b.locked()]
    seen += [a.extend(5), 5000 < pttl(cache, a) <= 10_000]          # added to what is left
    seen += [a.extend(3, replace_ttl=True), 2000 < pttl(cache, a) <= 3000]  # set
    seen += [a.reacquire(), 4000 < pttl(cache, a) <= 5000]          # back to the timeout
    # on a lock another object holds: redis-py's LockError (distlock's is a LockNotOwnedError)
    seen += [isinstance(_raised(b.release), redis.exceptions.LockError)]
    seen += [isinstance(_raised(lambda: b.extend(1)), redis.exceptions.LockError)]
    seen += [a.release(), a.locked(), a.owned()]
    seen += [isinstance(_raised(a.release), redis.exceptions.LockError)]
    with cache.lock("k", timeout=5) as held:
        seen += [type(held).__name__ in ("Lock", "DjangoLock"), held.owned()]
        seen += [isinstance(_raised(lambda: cache.lock("k", blocking_timeout=0.1).__enter__()),
                            redis.exceptions.LockError)]
        seen += [outcome(lambda: cache.lock("k", blocking=False).__enter__())]
    seen += [cache.lock("k").locked()]
    # a lease that ran out: "no longer owned", for extend and for release
    lost = cache.lock("short", timeout=0.2)
    seen += [lost.acquire()]
    time.sleep(0.35)
    seen += [outcome(lambda: lost.extend(1)), outcome(lost.release), lost.locked()]
    return seen


def _raised(call: Callable[[], Any]) -> Any:
    try:
        call()
    except Exception as exc:  # noqa: BLE001 - the test looks at what it was
        return exc
    return None


def test_import_distlock_imports_no_django() -> None:
    code = ("import sys, distlock; print(sorted(m for m in sys.modules "
            "if m.split('.')[0] in ('django', 'django_redis')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stdout + out.stderr


def test_the_cache_works_and_its_lock_is_a_distlock(cache: Any, client: Any) -> None:
    assert isinstance(cache, RedisCache)
    cache.set("a", {"n": 1}, timeout=30)
    assert cache.get("a") == {"n": 1} and cache.get("missing", "default") == "default"
    assert cache.add("a", 2) is False and cache.delete("a")
    lock = cache.lock("k", version=2)
    assert isinstance(lock, DjangoLock) and isinstance(lock, distlock.DistLock)
    assert lock.name == cache.make_key("k", version=2) == ":2:k"
    with lock as held:
        assert held is lock and lock.token is not None
        assert client.exists(Keys("distlock:", ":2:k").lock)


@pytest.mark.slow
def test_the_same_scenario_gives_what_redis_py_gives(url: str, cache: Any) -> None:
    expected = scenario(plain_django_redis(url))
    assert scenario(cache) == expected
    assert expected[:2] == [True, False]  # (the scenario did run: the first try took the lock)


def test_a_lock_excludes_another_process(children: Children, url: str, cache: Any) -> None:
    conn = children.start(_contrib_workers.django_locker, url, "k")
    assert recv(conn) == "ready"
    lock = cache.lock("k", timeout=5)
    assert lock.acquire(blocking=False)
    conn.send(("try",))
    assert recv(conn) == (False, None)
    conn.send(("wait", 0.3))
    assert recv(conn) == (False, None)
    mine = lock.token
    lock.release()
    conn.send(("wait", 10))
    taken, token = recv(conn)
    assert taken and token > mine  # the next hold's fencing token
    conn.send(("stop",))


def test_watchdog_hold_extend_renews_it(cache: Any) -> None:
    lock = cache.lock("k")  # timeout=None: the watchdog (redis-py: never expires)
    assert lock.acquire()
    assert lock.timeout is None
    assert lock.extend(1)  # a renewal now, to the watchdog's lease, whatever the time asked
    assert 25_000 < pttl(cache, lock) <= 30_000
    assert lock.reacquire() and lock.owned()
    lock.release()


def test_a_blocking_acquire_waits_for_the_release(cache: Any) -> None:
    import threading

    holder = cache.lock("k", timeout=5)
    assert holder.acquire()
    start = time.monotonic()
    assert cache.lock("k").acquire(blocking_timeout=0.2) is False
    assert time.monotonic() - start >= 0.2  # the whole blocking_timeout
    threading.Timer(0.2, holder.release).start()  # any thread may release it
    waiter = cache.lock("k", timeout=5, blocking_timeout=10, sleep=30)  # sleep: ignored
    start = time.monotonic()
    assert waiter.acquire()
    assert time.monotonic() - start < 5.0
    waiter.release()


def test_errors_are_distlocks_and_redis_pys(cache: Any) -> None:
    lock = cache.lock("k")
    with pytest.raises(LockNotOwnedError) as caught:
        lock.release()
    assert isinstance(caught.value, distlock.LockNotOwnedError)
    assert isinstance(caught.value, RuntimeError)
    assert isinstance(caught.value, redis.exceptions.LockNotOwnedError)
    assert caught.value.lock_name == ":1:k" == caught.value.name
    with pytest.raises(LockNotOwnedError):
        lock.extend(1)
    lost = LockLostError("gone", name="n", token=7, cause="why")
    assert isinstance(lost, distlock.LockLostError) and isinstance(lost, redis.exceptions.LockNotOwnedError)
    again = pickle.loads(pickle.dumps(lost))
    assert type(again) is LockLostError and (again.name, again.token, again.cause) == ("n", 7, "why")
    assert issubclass(LockError, redis.exceptions.LockError) and issubclass(LockError, distlock.DistLockError)


def test_bad_input_is_refused(cache: Any) -> None:
    for kwargs, error in (({"timeout": 0}, ValueError), ({"timeout": -1}, ValueError),
                          ({"timeout": "5"}, TypeError), ({"blocking_timeout": -2}, ValueError),
                          ({"blocking_timeout": "1"}, TypeError), ({"sleep": -1}, ValueError),
                          ({"sleep": "0.1"}, TypeError)):
        with pytest.raises(error):
            cache.lock("k", **kwargs)
    lock = cache.lock("k", timeout=5)
    with pytest.raises(TypeError, match="token"):
        lock.acquire(token="mine")  # distlock picks its own owner id and fencing token
    with pytest.raises(TypeError):
        lock.acquire(timeout=1, blocking_timeout=1)
    with pytest.raises(ValueError):
        lock.acquire(False, 1)  # threading's check: no timeout for a non-blocking call
    assert not lock.locked()
    assert lock.acquire(blocking=False, blocking_timeout=5)  # redis-py: ignored for one try
    for bad, error in ((0, ValueError), ("1", TypeError), (None, TypeError), (-1, ValueError)):
        with pytest.raises(error):
            lock.extend(bad)
    lock.release()
