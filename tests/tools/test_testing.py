"""``distlock.testing``, public: the fault proxy against the real test server, the history and
its checker (by hand, by property, across processes, and on real holds), and the opt-in pytest
plugin, run in a pytest of its own as a user's suite would run it.

The proxy's bounds are one-sided: a delayed reply comes no sooner than its delay; nothing is
asserted about how late anything may be.
"""

from __future__ import annotations

import multiprocessing
import os
import socket
import subprocess
import sys
import textwrap
import time
from typing import Any, List

import pytest
import redis
from _support import settle
from hypothesis import given, settings
from hypothesis import strategies as st

import distlock
from distlock._session.session import reset_sessions
from distlock.testing import (
    BELIEF_ENDS,
    Fault,
    FaultProxy,
    History,
    Hold,
    Write,
    check_history,
    timeline_html,
    write_timeline,
)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _port(url: str) -> int:
    return int(url.rsplit(":", 1)[1].split("/")[0])


def _raw(proxy: FaultProxy, timeout: float = 5.0) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", proxy.port), timeout=timeout)
    return sock


def _ask(sock: socket.socket, command: bytes) -> bytes:
    sock.sendall(command)
    return sock.recv(256)


# --- the fault proxy ---------------------------------------------------------------------------

@pytest.mark.real_redis
def test_proxy_passes_delays_and_says_so(url: str, client: redis.Redis[Any]) -> None:
    with FaultProxy("127.0.0.1", _port(url)) as proxy:
        assert proxy.url == f"redis://127.0.0.1:{proxy.port}/0"
        assert proxy.mode("requests") == proxy.mode("replies") == "pass"
        with _raw(proxy) as sock:
            assert _ask(sock, b"PING\r\n") == b"+PONG\r\n"
            proxy.delay(150, "replies")
            assert proxy.mode("replies") == "delay 150 ms" and proxy.mode("requests") == "pass"
            assert "replies=delay 150 ms" in repr(proxy)
            started = time.monotonic()
            assert _ask(sock, b"PING\r\n") == b"+PONG\r\n"
            assert time.monotonic() - started >= 0.15  # never sooner than its delay
            proxy.pass_through()
            assert _ask(sock, b"PING\r\n") == b"+PONG\r\n"
        assert proxy.accepted == 1
    assert not proxy._thread.is_alive()


@pytest.mark.real_redis
def test_proxy_drops_replies_after_the_request_ran(url: str, client: redis.Redis[Any]) -> None:
    with FaultProxy("127.0.0.1", _port(url)) as proxy:
        with _raw(proxy, timeout=0.3) as sock:
            proxy.drop_replies()
            assert proxy.mode("replies") == "blackhole" and proxy.mode("requests") == "pass"
            with pytest.raises(socket.timeout):
                _ask(sock, b"SET ran yes\r\n")
            # it ran: only its answer was lost
            assert settle(lambda: client.get("ran") == b"yes", 10)
            assert proxy.connections() == 1  # kept open, as a partition keeps it
            proxy.heal()  # that connection lost bytes: it is reset, not reused
            assert proxy.connections() == 0
        with _raw(proxy) as fresh:
            assert _ask(fresh, b"GET ran\r\n") == b"$3\r\nyes\r\n"


@pytest.mark.real_redis
def test_proxy_blackholes_requests_or_both(url: str, client: redis.Redis[Any]) -> None:
    with FaultProxy("127.0.0.1", _port(url)) as proxy:
        proxy.blackhole("requests")
        with _raw(proxy, timeout=0.3) as sock:
            with pytest.raises(socket.timeout):
                _ask(sock, b"SET lost yes\r\n")
        assert client.exists("lost") == 0  # it never reached the server
        proxy.blackhole()
        assert proxy.mode("requests") == proxy.mode("replies") == "blackhole"
        with _raw(proxy, timeout=0.3) as sock:  # accepted, never answered
            with pytest.raises(socket.timeout):
                _ask(sock, b"PING\r\n")
            proxy.heal(reset_broken=False)
            assert proxy.connections() >= 1
        proxy.heal()
        with _raw(proxy) as sock:
            assert _ask(sock, b"PING\r\n") == b"+PONG\r\n"


@pytest.mark.real_redis
def test_proxy_resets_every_connection(url: str, client: redis.Redis[Any]) -> None:
    with FaultProxy("127.0.0.1", _port(url)) as proxy:
        socks = [_raw(proxy) for _ in range(3)]
        try:
            for sock in socks:
                assert _ask(sock, b"PING\r\n") == b"+PONG\r\n"
            assert proxy.reset() == 3
            for sock in socks:
                try:
                    data = _ask(sock, b"PING\r\n")
                except OSError:  # ECONNRESET, or EPIPE on the send
                    continue
                assert data == b""
            assert proxy.connections() == 0
        finally:
            for sock in socks:
                sock.close()
        # a client of redis-py through it, and distlock's lock through it
        through = proxy.client()
        try:
            lock = distlock.DistLock("via-proxy", client=through)
            with lock:
                assert lock.locked() and client.dbsize() > 0
        finally:
            reset_sessions()  # its session's connections go through the proxy: end them first
            through.close()


@pytest.mark.real_redis
def test_proxy_faults_pubsub_connections_alone(url: str, client: redis.Redis[Any]) -> None:
    with FaultProxy("127.0.0.1", _port(url)) as proxy:
        with _raw(proxy) as sub, _raw(proxy) as plain:
            assert _ask(sub, b"SUBSCRIBE ch\r\n").startswith(b"*3")
            assert _ask(plain, b"PING\r\n") == b"+PONG\r\n"
            assert proxy.connections(pubsub=True) == 1 and proxy.connections(pubsub=False) == 1
            assert proxy.reset_pubsub() == 1
            assert proxy.connections() == 1
            assert _ask(plain, b"PING\r\n") == b"+PONG\r\n"


def test_proxy_refuses_bad_input_and_a_closed_proxy() -> None:
    with pytest.raises(TypeError, match="port must be an int"):
        FaultProxy("127.0.0.1", "6379")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="port must be an int"):
        FaultProxy("127.0.0.1", True)
    with pytest.raises(ValueError, match="1..65535"):
        FaultProxy("127.0.0.1", 0)
    with pytest.raises(TypeError, match="host must be a str"):
        FaultProxy(None, 6379)  # type: ignore[arg-type]
    proxy = FaultProxy("127.0.0.1", 9)  # nothing listens there: connections fail, not faults
    try:
        with pytest.raises(ValueError, match="ms must be a finite number >= 0"):
            proxy.delay(-1)
        with pytest.raises(ValueError, match="ms must be a finite number >= 0"):
            proxy.delay(float("nan"))
        with pytest.raises(TypeError, match="ms must be a number"):
            proxy.delay("5")  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="direction must be"):
            proxy.blackhole("sideways")
        with pytest.raises(TypeError, match="direction must be"):
            proxy.delay(5, direction=None)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="one direction"):
            proxy.mode("both")
    finally:
        proxy.close()
    proxy.close()  # idempotent
    with pytest.raises(RuntimeError, match="closed"):
        proxy.blackhole()
    assert not proxy._thread.is_alive()


# --- the history and its checker ---------------------------------------------------------------

def _hold(name: str, token: int, start: float, end: float, shared: bool = False) -> Hold:
    return Hold(name, token, start, end, "released", "p", shared)


def test_checker_finds_overlaps_regressions_stale_writes_and_recoveries() -> None:
    records = [
        _hold("a", 1, 0.0, 1.0),
        _hold("a", 2, 1.0, 2.0),  # begins as the first ends: half-open, no overlap
        _hold("a", 3, 1.5, 2.5),  # overlaps the second
        _hold("a", 3, 3.0, 4.0),  # its token does not increase
        _hold("b", 7, 0.0, 5.0, shared=True),
        _hold("b", 7, 1.0, 2.0, shared=True),  # readers share
        _hold("b", 8, 4.5, 6.0),  # a writer meets a reader
        Write("a", 1, 0.5, True),  # current: fine
        Write("a", 1, 1.2, True),  # token 2 was granted, but nobody wrote with it: fine
        Write("a", 3, 1.6, True),
        Write("a", 2, 1.7, False),  # stale, and refused: fine
        Write("a", 2, 1.8, True),  # stale, and accepted (a store that forgot 3)
        Fault("blackhole", 0.2, 2.7),
        Fault("restart", 6.5, 7.0),
    ]
    report = check_history(records)
    assert [(a.token, b.token) for a, b in report.overlaps] == [(2, 3), (7, 8)]
    assert [(a.token, b.token) for a, b in report.token_regressions] == [(3, 3)]
    assert [(w.token, w.at) for w in report.stale_writes] == [(2, 1.8)]
    assert [(f.kind, r) for f, r in report.recoveries] == [("blackhole", pytest.approx(0.3)),
                                                           ("restart", None)]
    assert report.longest_recovery == float("inf")
    assert not report.ok and report.holds == 7 and report.writes == 5
    assert "2 belief overlaps" in str(report) and "1 stale writes" in str(report)
    assert check_history([_hold("a", 1, 0, 1), _hold("a", 2, 1, 2)]).ok


def test_an_open_hold_is_believed_until_the_horizon() -> None:
    history = History()
    first = history.begin("n", 1, at=10.0)
    assert first.end is None and first.cause == "open"
    second = history.end(history.begin("n", 2, at=12.0), at=13.0)
    assert second.cause == "released"
    closed = Hold("n", 1, 10.0, None, "open", first.who)
    assert check_history(history.records() + [closed]).overlaps == [(closed, second)]
    assert check_history(history.records() + [closed], horizon=11.0).ok


@st.composite
def _histories(draw: Any) -> List[Hold]:
    holds = []
    for _ in range(draw(st.integers(0, 12))):
        start = draw(st.integers(0, 40))
        length = draw(st.integers(0, 10))
        holds.append(Hold(draw(st.sampled_from("xy")), draw(st.integers(0, 5)), float(start),
                          float(start + length), "released", "p", draw(st.booleans())))
    return holds


@settings(max_examples=300, deadline=None)
@given(_histories())
def test_the_checker_agrees_with_brute_force(holds: List[Hold]) -> None:
    report = check_history(holds)
    expected = {
        frozenset((i, j)) for i, a in enumerate(holds) for j, b in enumerate(holds)
        if i < j and a.name == b.name and not (a.shared and b.shared)
        and a.start < b.until(0) and b.start < a.until(0)}
    found = {frozenset((holds.index(a), holds.index(b))) for a, b in report.overlaps}
    # identical holds make index() ambiguous: compare counts, and the pairs when all differ
    assert len(report.overlaps) == len(expected)
    if len(set(holds)) == len(holds):
        assert found == expected


def test_history_refuses_bad_input(tmp_path: Any) -> None:
    history = History()
    with pytest.raises(TypeError, match="name must be a str"):
        history.begin(b"n", 1)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="token must be an int or None"):
        history.begin("n", "1")  # type: ignore[arg-type]
    hold = history.begin("n", 1, at=5.0)
    with pytest.raises(ValueError, match="cause must be one of"):
        history.end(hold, "gone")
    with pytest.raises(ValueError, match="before it began"):
        history.end(hold, at=4.0)
    with pytest.raises(TypeError, match="the Hold that begin"):
        history.end("n")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="needs an int token"):
        history.write("n", None, True)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="before it began"):
        history.fault("blackhole", 2.0, 1.0)
    with pytest.raises(TypeError, match="time.monotonic"):
        history.fault("blackhole", "now", 1.0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="time.monotonic"):
        history.fault("blackhole", 0.0, float("inf"))
    with pytest.raises(ValueError, match="time.monotonic"):
        history.write("n", 1, True, at=float("nan"))
    assert history.records() == [] and set(BELIEF_ENDS) >= {"released", "lost", "deadline"}
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"type": "hold", "name": "n", "token": 1, "start": 0.0}\n{"type": "x"}\n')
    with pytest.raises(ValueError, match="broken.jsonl:2: not a history record"):
        History(broken).records()
    # a last line without its newline is one another process is still writing: left out
    partial = tmp_path / "partial.jsonl"
    partial.write_text('{"type": "hold", "name": "n", "token": 1, "start": 0.0}\n{"type": "ho')
    assert History(partial).records() == [Hold("n", 1, 0.0)]


def test_a_timeline_draws_every_belief_write_and_fault(tmp_path: Any) -> None:
    """One self-contained HTML file: a row per process, thread or task, a bar per belief (an
    overlap outlined), a tick per write, a shaded window per fault; names are escaped."""
    records = [Hold("a<b", 1, 10.0, 11.0, "released", "1:T-0"),
               Hold("a<b", 2, 10.9, 12.0, "lost", "2:T-0"),
               Hold("c", 3, 10.5, 11.5, "deadline", "1:T-1"),
               Hold("c", None, 12.0, None, "open", "2:T-1"),
               Write("a<b", 1, 10.5, True, "1:T-0"), Write("a<b", 1, 11.5, False, "1:T-0"),
               Fault("partition", 10.7, 11.2, "worker 0")]
    page = timeline_html(records, "a & b")
    assert page.startswith("<!doctype html>") and page.rstrip().endswith("</html>")
    assert "<script" not in page and "http://" not in page.replace(
        'xmlns="http://www.w3.org/2000/svg"', "")  # nothing runs, nothing is fetched
    assert "<title>a &amp; b</title>" in page and "a&lt;b" in page and "a<b" not in page
    assert page.count('class="hold') == 4 and page.count('class="hold overlap"') == 2
    assert page.count('class="write"') == 2 and page.count('class="fault"') == 1
    assert "partition worker 0: 0.700-1.200 s" in page  # times from the history's first
    # records made by hand, past the History's checks, with a time that is not finite
    assert "<svg" in timeline_html([Fault("x", 0.0, float("inf")), Hold("n", 1, 1.0, None)])
    path = write_timeline(History(), tmp_path / "empty.html")  # an empty history draws too
    with open(path, encoding="utf-8") as fh:
        assert "<svg" in fh.read()



def _record_holds(path: str, url: str, name: str, rounds: int) -> None:
    history = History(path)
    lock = distlock.DistLock(name, client=redis.Redis.from_url(url), lease=30)
    for _ in range(rounds):
        with lock:
            hold = history.begin(name, lock.token)
            history.write(name, lock.token, True)
            history.end(hold)


@pytest.mark.real_redis
def test_processes_share_one_history_of_real_holds(url: str, client: redis.Redis[Any],
                                                    tmp_path: Any) -> None:
    path = str(tmp_path / "history.jsonl")
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_record_holds, args=(path, url, "shared-name", 15))
             for _ in range(3)]
    for proc in procs:
        proc.start()
    try:
        for proc in procs:
            proc.join(60)
            assert proc.exitcode == 0
    finally:
        for proc in procs:
            if proc.is_alive():
                proc.kill()
                proc.join(10)
    history = History(path)
    assert len(history.holds()) == 45 and len(history.writes()) == 45
    assert len({h.who for h in history.holds()}) == 3
    report = check_history(history)
    assert report.ok, report  # one lock, three processes: no overlap, tokens increasing
    tokens = [h.token for h in sorted(history.holds(), key=lambda h: h.start)]
    assert tokens == sorted(tokens)


# --- the pytest plugin -------------------------------------------------------------------------

def test_importing_distlock_testing_imports_no_pytest(tmp_path: Any) -> None:
    out = subprocess.run(
        [sys.executable, "-c", "import sys, distlock.testing; print('pytest' in sys.modules)"],
        capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "False"
    # the topologies stand on their own too: no tests/support, no pytest
    out = subprocess.run(
        [sys.executable, "-c", "import sys, distlock.testing.cluster, distlock.testing.sentinel, "
         "distlock.testing.redlock; print('pytest' in sys.modules)"],
        capture_output=True, text=True, timeout=60, check=True, cwd=str(tmp_path))
    assert out.stdout.strip() == "False"


USER_TESTS = '''
import time

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

import distlock

def test_a_partitioned_holder_stops_believing(fault_proxy):
    lock = distlock.DistLock("job", client=fault_proxy.client(socket_timeout=0.5), lease=1)
    lock.acquire()
    fault_proxy.blackhole()
    time.sleep(lock.valid_for())
    assert lock.valid_for() == 0
    fault_proxy.heal()
    with pytest.raises(distlock.LockLostError):
        lock.release()

def test_a_lock_on_the_private_server(distlock_server):
    client = redis.Redis.from_url(distlock_server.url)
    lock = distlock.DistLock("user:1", client=client)
    with lock:
        assert client.dbsize() > 0
    assert not lock.locked()  # what is left is the name's fence counter, which the next test
                              # does not see: the server is emptied before it

def test_starts_empty(distlock_server):
    client = redis.Redis.from_url(distlock_server.url)
    assert client.dbsize() == 0
    client.set("left", 1)

def test_through_the_proxy(fault_proxy):
    # no retries: one timeout is the answer (redis-py's default would back off and try again)
    client = fault_proxy.client(socket_timeout=0.3, retry=Retry(NoBackoff(), 0))
    assert client.ping()
    fault_proxy.drop_replies()
    try:
        client.set("x", 1)
    except (redis.TimeoutError, redis.ConnectionError):
        pass
    else:
        raise AssertionError("a reply came through a blackhole")
    fault_proxy.heal()
'''


@pytest.mark.real_redis
def test_the_plugin_gives_a_users_suite_its_fixtures(tmp_path: Any, url: str) -> None:
    (tmp_path / "test_user.py").write_text(textwrap.dedent(USER_TESTS))
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "distlock.testing.pytest_plugin",
         "-p", "no:randomly", "-p", "no:cacheprovider", str(tmp_path)],
        cwd=str(tmp_path), capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "4 passed" in result.stdout


def test_without_the_plugin_the_fixtures_are_unknown(tmp_path: Any) -> None:
    (tmp_path / "test_user.py").write_text(
        "def test_x(distlock_server):\n    pass\n")
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)],
        cwd=str(tmp_path), capture_output=True, text=True, timeout=120)
    assert result.returncode != 0 and "fixture 'distlock_server' not found" in result.stdout


# --- the fenced store --------------------------------------------------------------------------

def _fenced_writes(directory: str, tokens: List[int]) -> None:
    from distlock.testing import FencedStore

    store = FencedStore(directory)
    for token in tokens:
        store.write("shared", token)


def test_the_fenced_store_takes_no_token_below_the_largest(tmp_path: Any) -> None:
    from distlock.testing import FencedStore

    store = FencedStore(str(tmp_path))
    assert store.highest("a") is None
    taken, at = store.write("a", 5)
    assert taken and isinstance(at, float)
    assert store.write("a", 5)[0]  # the same holder writes again
    assert not store.write("a", 4)[0] and store.highest("a") == 5
    assert store.write("b", 1)[0]  # names are independent
    assert store.write("a", 9)[0] and store.highest("a") == 9
    with pytest.raises(TypeError, match="token must be an int"):
        store.write("a", "9")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="name must be a str"):
        store.write(7, 9)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="directory must be a path"):
        FencedStore(3)  # type: ignore[arg-type]
    # processes share it: the largest of all their tokens wins
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_fenced_writes, args=(str(tmp_path), list(range(k, 200, 4))))
             for k in range(4)]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(60)
        assert proc.exitcode == 0
    assert store.highest("shared") == 199
