"""Sessions and the user's clients (docs/design.rst, principle 11: a session lives as long as its
client, or as its holds and waiters; nothing outlives them; nothing of the user's is broken).

- Clients that cannot share a session per server (a subclass that overrides
  ``execute_command``, a single-connection client) get one of their own, which must not keep
  the client alive: made per request, they leave nothing behind.
- A new client that reuses a collected client's ``id()`` gets a session of its own, and the
  old one is still retired.
- Retiring a session that adopted a user's connection pool never closes a connection the
  user's own code is using.
"""

from __future__ import annotations

import gc
import threading
import time
import weakref
from typing import Any, Dict, List

import pytest
import redis
from _procs import in_forked_child
from _support import collect_garbage, settle, stacks

from distlock import DistLock, DistRLock
from distlock._session.session import all_sessions, session_for


class _Instrumented(redis.Redis):  # type: ignore[type-arg]
    """A user's subclass that overrides execute_command (tracing, say)."""

    calls = 0

    def execute_command(self, *args: Any, **options: Any) -> Any:
        type(self).calls += 1
        return super().execute_command(*args, **options)


def _helper_threads() -> List[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("distlock-") and t.is_alive()]


@pytest.mark.real_redis
@pytest.mark.parametrize("kind", ["subclass", "single-connection"])
def test_per_request_clients_of_their_own_session_leave_nothing(url: str, client: Any, kind: str) -> None:
    """Such a session talks through its client without keeping it alive (its scripts are
    bound to a weak proxy): 100 per-request clients leave no session, no thread and no server
    connection behind once they are gone."""
    before_threads = set(_helper_threads())
    # Only this test's connections are counted: they carry its name (the session's twins and
    # its pub/sub connection copy the client's settings, name included). Counting every
    # connection of the server blamed this test for another test's connection closing late.
    name = f"own-session-{kind}"

    def ours() -> List[Dict[str, Any]]:
        return [c for c in client.client_list() if c.get("name") == name]

    def connections() -> int:
        return len(ours())

    made: List[Any] = []  # weak references to the sessions this test's clients got
    for i in range(100):
        if kind == "subclass":
            per_request: Any = _Instrumented.from_url(url, client_name=name)
        else:
            per_request = redis.Redis.from_url(url, single_connection_client=True, client_name=name)
        lock = DistRLock(f"own-session:{i % 10}", client=per_request)
        with lock:
            assert lock.owned()
        made.append(weakref.ref(session_for(per_request)))
        per_request.close()  # a no-op signal for distlock; it frees the single connection
        del lock, per_request
    collect_garbage()

    def left() -> List[Any]:
        """This test's sessions still registered or not closed (others', which the rest of
        a full run may make or retire meanwhile, are not counted)."""
        current = {id(s) for s in all_sessions()}
        return [s for s in (ref() for ref in made)
                if s is not None and (id(s) in current or not s.closed)]

    def clean() -> bool:
        # collected again at each look while a session is left: a cycle that refers to the
        # last lock (and through it to its client) can form after the collection above, while
        # the session's last jobs end; the stress of three copies at once left one in about
        # twenty runs. Only then: a full collection of a full run's heap holds the GIL for
        # long, and done every 50 ms it starves the threads whose exit this waits for (CI's
        # valkey pass: 0 sessions left, and eight idle workers still waiting for the GIL to
        # return from their 0.2 s wait after 15 s)
        if left():
            gc.collect()
        return (not left() and set(_helper_threads()) <= before_threads
                and connections() == 0)

    # 15 s: a renewal job (the watchdog's connection opening, its read-back) is bounded by the
    # renewal twin's socket timeout, renew_interval (10 s); CI's valkey pass saw one such job's
    # thread still running after 10 s (why a job waits that long is not known yet)
    assert settle(clean, 15.0), (
        f"left behind: {len(left())} sessions, threads "
        f"{set(_helper_threads()) - before_threads}, {connections()} connections: "
        f"{[(c.get('cmd'), c.get('age'), c.get('idle')) for c in ours()]}; sessions: "
        f"{[_why_kept(s) for s in left()][:3]}; reaper: {_reaper_state()}; where the threads "
        f"are: {stacks(set(_helper_threads()) - before_threads)}")


def _why_kept(session: Any) -> Dict[str, Any]:
    """What keeps a session from being retired, for a failure's message."""
    watchdog = session.watchdog
    return {"closed": session.closed, "users": len(session.users), "holds": len(session.holds),
            "waiters": session.dispatcher.busy(), "deferred": len(watchdog._deferred),
            "timed": len(watchdog._timed), "abandoned": len(watchdog._abandoned),
            "renewals": watchdog.renewals.busy, "chores": watchdog.chores.busy,
            "client kept by": _referrers(session._user() if session._user else None)}


def _referrers(obj: Any) -> List[str]:
    """What still refers to ``obj`` (a user client that should be gone), two levels deep."""
    if obj is None:
        return []
    out = []
    for ref in gc.get_referrers(obj):
        if isinstance(ref, list) and ref and all(isinstance(x, (int, str)) for x in ref):
            continue
        line = f"{type(ref).__name__}:{str(ref)[:120]}"
        if isinstance(ref, dict):  # an object's __dict__, or a registry: who holds it
            line += " <- " + ", ".join(f"{type(r).__name__}:{str(r)[:80]}"
                                       for r in gc.get_referrers(ref)[:4])
        out.append(line)
    return out[:8]


def _reaper_state() -> Any:
    from distlock._session import session as module

    return {"pending": len(module._pending), "reaping": module._reaping[0],
            "threads": [t.name for t in threading.enumerate() if t.name == "distlock-reaper"]}


@pytest.mark.real_redis
def test_a_subclass_client_is_still_driven_through_its_own_execute_command(url: str, client: Any) -> None:
    """Its override is the user's choice: distlock's reads go through it."""
    subclass = _Instrumented.from_url(url)
    _Instrumented.calls = 0
    lock = DistLock("own-session:override", client=subclass)
    with lock:
        assert lock.locked()
    assert _Instrumented.calls >= 1


@pytest.mark.real_redis
def test_a_reused_client_id_gets_a_live_session(url: str, client: Any) -> None:
    """A client collected and a new one allocated at the same address (the same ``id()``):
    the new one must not be handed the old one's session, whose weak proxy is dead."""
    ids: Dict[int, int] = {}
    # Everything the suite made before this test is frozen out of the collections below: in a
    # full run the heap is large, and 200 full collections of it took minutes.
    gc.collect()
    gc.freeze()
    try:
        for i in range(200):
            per_request = _Instrumented.from_url(url)
            ids[id(per_request)] = ids.get(id(per_request), 0) + 1
            with DistLock(f"reuse:{i % 5}", client=per_request):
                pass
            del per_request
            gc.collect()
    finally:
        gc.unfreeze()
    assert max(ids.values()) > 1, "no id() was reused: the test proved nothing"


@pytest.mark.real_redis
def test_retiring_a_session_never_closes_the_users_busy_connections(url: str, client: Any) -> None:
    """A session on a client with a socket timeout talks through that client's own pool.
    When the session is retired (its clients gone), it closes the pool's idle connections
    only: a blocking command the user's own code runs on the same pool meanwhile completes."""
    pool = redis.ConnectionPool.from_url(url, socket_timeout=10)  # an app's global pool
    results: Dict[str, Any] = {}
    started = threading.Event()

    def app_work() -> None:
        app = redis.Redis(connection_pool=pool)
        started.set()
        try:
            results["reply"] = app.blpop(["sessions:queue"], timeout=3)
        except Exception as exc:  # noqa: BLE001 - the test reports it
            results["error"] = exc

    def request() -> None:
        per_request = redis.Redis(connection_pool=pool)
        with DistLock("sessions:pool", client=per_request):
            pass

    request()
    thread = threading.Thread(target=app_work)
    thread.start()
    started.wait(5)
    collect_garbage()  # the request's client is gone: its session retires within about a second
    thread.join(10)
    assert not thread.is_alive()
    assert results == {"reply": None}, results
    assert settle(lambda: not any(s.client.connection_pool is pool for s in all_sessions()
                                  if not s.closed), 10.0)
    pool.disconnect()


@pytest.mark.real_redis
def test_the_reaper_retires_a_session_and_exits(backend: Any) -> None:
    """The conftest's per-test thread check leaves the reaper out (it would cost each test a
    second): this is where it is checked. Once a client is gone, its session is retired and the
    reaper thread ends by itself."""
    before = set(threading.enumerate())
    sessions = len(all_sessions())
    made = backend.client()
    with DistLock("reaper-check", client=made):
        pass
    assert len(all_sessions()) == sessions + 1
    ref = weakref.ref(made)
    del made
    collect_garbage()
    assert ref() is None
    deadline = time.monotonic() + 10.0
    while time.monotonic() < deadline:
        left = [t for t in threading.enumerate() if t not in before and t.is_alive()
                and t.name.startswith("distlock-")]
        if not left and len(all_sessions()) == sessions:
            break
        time.sleep(0.05)
    assert len(all_sessions()) == sessions, "the session was not retired"
    assert not left, f"threads left behind: {left}"
    # no ``client`` fixture flushes after this test: its fence counter goes with it (a later
    # test that lists every key saw it)
    admin = backend.client()
    try:
        admin.delete("distlock:{reaper-check}:fence")
    finally:
        admin.close()


@pytest.mark.real_redis
def test_a_child_forked_while_the_reaper_is_on_its_way_retires_its_own_sessions(
        url: str, client: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A fork copies the flag that says a reaper is on its way, but not the reaper thread: the
    child must still retire a session whose last client it dropped."""
    from distlock._session import session as module

    monkeypatch.setattr(module, "RETIRE_AFTER", 3.0)  # the parent's reaper waits: a wide window
    made = redis.Redis.from_url(url)
    with DistLock("fork-reaper:parent", client=made):
        pass
    del made
    collect_garbage()
    assert module._reaping[0], "no reaper on its way: the test proves nothing"

    def child() -> str:
        own = redis.Redis.from_url(url)
        with DistLock("fork-reaper:child", client=own):
            pass
        [session] = all_sessions()  # the parent's are not this process'
        del own
        collect_garbage()
        deadline = time.monotonic() + 20.0
        while not session.closed and time.monotonic() < deadline:
            time.sleep(0.05)
        return repr([session.closed, len(all_sessions())])

    status, report = in_forked_child(child)
    assert status == 0
    assert report == repr([True, 0]), "the child never retired its session"
