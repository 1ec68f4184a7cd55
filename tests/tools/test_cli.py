"""The ``distlock`` command line, through real subprocesses (``python -m distlock``).

Every subcommand runs against the fixture's redis-server (``url``), the demo also on both
embedded backends. Child processes are waited for with a bound and killed in ``finally``. No
timing is asserted beyond generous upper bounds.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from typing import Any, Dict, List, Optional, Tuple

import pytest
import redis
from _support import kill, read_line, settle

import distlock
from distlock import DistLock, DistReadWriteLock, DistRLock, LockLostError, configure
from distlock._cli import bench
from distlock._cli import main as _cli
from distlock._cli.connect import redact_url
from distlock._cli.demo import Row, format_table, handoff_latencies
from distlock._cli.inspect import (
    exclusive_state,
    free_state,
    glob_escape,
    name_from_key,
    parse_info,
    parse_owner,
    rw_state,
    scan_pattern,
)
from distlock.testing.server import free_port

TIMEOUT = 60  # seconds: the bound of every subprocess call here

# A child that says when it is ready, reports the signal it gets, and exits 3 on it.
# The signal reaches it through signal.set_wakeup_fd: the C-level handler writes the signal's
# number to a pipe the moment it arrives, and the main thread waits on that pipe. Two simpler
# children failed under load:
# - one printed from a Python-level handler, which runs in the main thread between any two
#   bytecodes, even inside print("ready")'s flush, and failed with "reentrant call inside
#   <_io.BufferedWriter name='<stdout>'>";
# - one wrote to the pipe from a Python-level handler, and missed about one signal in a hundred:
#   a signal that arrives after the interpreter's last check and before select() blocks runs
#   its Python handler only when select() returns, 60 s later.
TRAPPING_CHILD = """
import os, select, signal, sys
r, w = os.pipe()
os.set_blocking(w, False)
signal.set_wakeup_fd(w)
for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
    signal.signal(s, lambda signum, frame: None)
print("ready", flush=True)
if select.select([r], [], [], 60)[0]:
    print("got", os.read(r, 1)[0], flush=True)
    sys.exit(3)
sys.exit(9)
"""

# A child that ignores SIGTERM: only SIGKILL ends it.
STUBBORN_CHILD = """
import signal, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
print("ready", flush=True)
time.sleep(60)
"""

SLEEPING_CHILD = """
import time
print("ready", flush=True)
time.sleep(60)
"""


def _env(url: Optional[str] = None, **extra: str) -> Dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "DISTLOCK_URL"}
    if "PATH" in extra:  # a PATH without redis-server means no server at all, not the chosen one
        env.pop("DISTLOCK_SERVER_BIN", None)
    if url is not None:
        env["DISTLOCK_URL"] = url
    env.update(extra)
    return env


def cli(*args: str, url: Optional[str] = None, env: Optional[Dict[str, str]] = None,
        timeout: float = TIMEOUT) -> subprocess.CompletedProcess[str]:
    """Run ``python -m distlock ARGS`` to completion (stdin not a terminal)."""
    return subprocess.run(
        [sys.executable, "-m", "distlock", *args], env=env or _env(url), stdin=subprocess.DEVNULL,
        capture_output=True, text=True, timeout=timeout)


def start(*args: str, url: str) -> subprocess.Popen[str]:
    """Start ``python -m distlock ARGS`` in the background, its output piped."""
    return subprocess.Popen(
        [sys.executable, "-m", "distlock", *args], env=_env(url), stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(proc: subprocess.Popen[str], timeout: float = TIMEOUT) -> tuple[int, str, str]:
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, out, err


def status_json(url: str, *names: str) -> List[Dict[str, Any]]:
    result = cli("status", "--json", *names, url=url)
    assert result.returncode == 0, result.stderr
    data: List[Dict[str, Any]] = json.loads(result.stdout)
    return data


def one_line_error(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert "Traceback" not in stderr
    return lines[-1]


def keys_of(client: redis.Redis[Any]) -> List[str]:
    return sorted(k.decode() for k in client.scan_iter(count=1000))


# --- no I/O: parsing and figures ---------------------------------------------------------------

def test_parse_owner_tells_threads_from_hold_ids() -> None:
    rlock_owner = parse_owner("abc:140234567890123", 2, "web-1", 42)
    assert (rlock_owner.session, rlock_owner.thread, rlock_owner.hold_id) == ("abc", 140234567890123, None)
    lock_owner = parse_owner("abc:0a1b2c3d4e5f", 1)
    assert (lock_owner.thread, lock_owner.hold_id) == (None, "0a1b2c3d4e5f")
    assert parse_owner("abc:123456789012", 1).hold_id == "123456789012"  # could be either
    assert parse_info("host:with:colons:77") == ("host:with:colons", 77)
    assert parse_info(None) == (None, None)


def test_exclusive_state_from_raw_replies() -> None:
    fields = {b"s1:140234567890123": b"2", b":t": b"17", b":i": b"h:9", b":w": b"1"}
    state = exclusive_state("n", "distlock:{n}", b"hash", fields, 1500, b"17")
    assert state is not None
    assert (state.kind, state.held, state.count, state.token, state.lease_ms) == \
        ("DistRLock", True, 2, 17, 1500)
    (owner,) = state.owners
    assert (owner.session, owner.thread, owner.host, owner.pid) == ("s1", 140234567890123, "h", 9)
    assert state.extra == {":w": "1"}
    lock = exclusive_state("n", "k", "hash", {"s1:0a1b2c3d4e5f": "1", ":t": "5"}, -1, None)
    assert lock is not None and lock.kind == "DistLock" and lock.lease_ms is None
    assert exclusive_state("n", "k", b"none", None, -2, b"4") is None
    assert exclusive_state("n", "k", b"string", None, 10, None).kind == "unknown (string)"  # type: ignore[union-attr]
    free = free_state("n", "k", b"4")
    assert (free.held, free.token, free.kind) == (False, 4, "free")
    assert json.loads(json.dumps(state.to_json()))["owners"][0]["thread"] == 140234567890123


def test_rw_state_counts_live_readers_only() -> None:
    now = 1_000_000
    readers = [(b"s1:11#20", float(now + 5000)), (b"s2:22#21", float(now + 9000)),
               (b"s3:33#19", float(now - 1))]  # s3's lease ran out: gone
    state = rw_state("n", "w", writer_type=b"none", writer_fields=None, writer_pttl=-2,
                     readers=readers, queue=[("wr", now + 10.0)], now_ms=now, fence=b"21")
    assert state is not None
    assert [o.owner for o in state.owners] == ["s1:11", "s2:22"]
    assert {o.mode for o in state.owners} == {"read"}
    assert (state.count, state.token, state.lease_ms, state.waiting_writers) == (2, 21, 9000, 1)
    writer = rw_state("n", "w", writer_type="hash",
                      writer_fields={"s9:99": "1", ":t": "30", ":i": "h:1"}, writer_pttl=700,
                      readers=[], queue=[], now_ms=now, fence="30")
    assert writer is not None and writer.owners[0].mode == "write" and writer.token == 30
    assert rw_state("n", "w", writer_type="none", writer_fields=None, writer_pttl=-2, readers=[],
                    queue=[], now_ms=now, fence=None) is None


def test_key_names_and_patterns() -> None:
    assert name_from_key("distlock:", b"distlock:{orders:42}") == "orders:42"
    assert name_from_key("distlock:", "distlock:{a}:fence") is None
    assert name_from_key("distlock:", "distlock:{a}:rw:w", ("", ":rw:w")) == "a"
    assert name_from_key("distlock:", "distlock:{%7Bx%7D}") == "{x}"
    assert name_from_key("distlock:", "other:{a}") is None
    assert scan_pattern("distlock:", "jobs:*") == "distlock:{jobs:*}*"
    assert glob_escape("a*b?[c]") == "a\\*b\\?\\[c\\]"
    assert redact_url("redis://user:secret@host:6379/0") == "redis://user:***@host:6379/0"
    assert redact_url("redis://host:6379/0") == "redis://host:6379/0"


def test_handoff_latencies_count_only_waiting_successors() -> None:
    records = {
        0: [(0.0, 0.0, 1.0), (1.0, 1.0, 2.0)],   # re-acquires at once: not a hand-off
        1: [(0.5, 2.25, 3.0)],                    # waited since 0.5: hand-off of 0.25 s
        2: [(3.5, 3.6, 4.0)],                     # arrived after the release: not a hand-off
    }
    assert handoff_latencies(records) == [0.25]
    lines = format_table([Row("no lock", 7, 10, 0.5, None, 0), Row("DistLock", 10, 10, 1.0, 0.001, 3)])
    assert "lost updates" in lines[0] and lines[2].split()[:5] == ["no", "lock", "7", "10", "3"]
    assert "1.00 ms (n=3)" in lines[3]


# --- argument errors and an unreachable server ----------------------------------------------

@pytest.mark.parametrize("args", [
    ["bogus"],
    [],
    ["run"],
    ["run", "x"],
    ["run", "x", "--timeout", "-1", "--", "true"],
    ["run", "x", "--timeout", "1", "--nonblock", "--", "true"],
    ["run", "x", "--lease", "nan", "--", "true"],
    ["run", "x", "--conflict-exit-code", "300", "--", "true"],
    ["status"],
    ["release"],
    ["demo", "--workers", "0"],
    ["list", "a", "b"],
])
def test_bad_arguments_exit_2_with_a_usage_error(args: List[str]) -> None:
    result = cli(*args, url="redis://127.0.0.1:1/0")
    assert result.returncode == 2
    assert "error:" in one_line_error(result.stderr)


@pytest.mark.parametrize("args", [
    ["status", "x"],
    ["list"],
    ["release", "--force", "x"],
    ["run", "x", "--", sys.executable, "-c", "pass"],
])
def test_unreachable_server_exits_69_naming_the_url(args: List[str]) -> None:
    url = f"redis://127.0.0.1:{free_port()}/0"
    result = cli(*args, url=url)
    assert result.returncode == 69, result.stderr
    line = one_line_error(result.stderr)
    assert url in line and len(result.stderr.strip().splitlines()) == 1


def test_shared_without_a_read_write_lock_is_a_usage_error(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delattr(distlock, "DistReadWriteLock", raising=False)
    with pytest.raises(SystemExit) as exc:
        _cli.main(["run", "x", "--shared", "--url", "redis://127.0.0.1:1/0", "--", "true"])
    assert exc.value.code == 2
    assert "DistReadWriteLock" in capsys.readouterr().err


def test_bench_outside_a_source_tree_says_how_to_run_it(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Any, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(bench, "bench_script", lambda: tmp_path / "missing.py")
    assert _cli.main(["bench"]) == 1
    assert "benchmarks/bench_locks.py" in capsys.readouterr().err


def test_bench_hands_its_arguments_to_bench_locks() -> None:
    if not bench.bench_script().is_file():
        pytest.skip("benchmarks/bench_locks.py is not in this tree")
    result = cli("bench", "no-such-figure")
    assert result.returncode == 2
    assert "no-such-figure" in result.stderr and "Traceback" not in result.stderr


# --- run ---------------------------------------------------------------------------------------

@pytest.mark.real_redis
def test_run_passes_exit_status_and_token_through(url: str, client: redis.Redis[Any]) -> None:
    code = "import os, sys; print(os.environ['DISTLOCK_TOKEN'], os.environ['DISTLOCK_NAME']); sys.exit(7)"
    result = cli("run", "job", "--url", url, "--", sys.executable, "-c", code)
    assert result.returncode == 7, result.stderr
    token, name = result.stdout.split()
    assert name == "job" and int(token) > 0
    (state,) = status_json(url, "job")
    assert state["held"] is False and state["token"] == int(token)  # free: the last token
    # After a normal release only the token counter is left.
    assert keys_of(client) == ["distlock:{job}:fence"]

    again = cli("run", "job", "--url", url, "--", sys.executable, "-c", code)
    assert again.returncode == 7 and int(again.stdout.split()[0]) > int(token)
    ok = cli("run", "job", "--", sys.executable, "-c", "pass", url=url)  # $DISTLOCK_URL
    assert ok.returncode == 0, ok.stderr


@pytest.mark.real_redis
def test_run_reports_death_by_signal_and_a_missing_command(url: str) -> None:
    result = cli("run", "job", "--url", url, "--", sys.executable, "-c",
                 "import os, signal; os.kill(os.getpid(), signal.SIGKILL)")
    assert result.returncode == 128 + signal.SIGKILL
    missing = cli("run", "job", "--url", url, "--", "/nonexistent/command")
    assert missing.returncode == 127 and "nonexistent" in missing.stderr
    (state,) = status_json(url, "job")
    assert state["held"] is False


@pytest.mark.real_redis
def test_run_conflict_exit_code(url: str, client: redis.Redis[Any]) -> None:
    holder = DistLock("job", client=client)
    assert holder.acquire()
    try:
        result = cli("run", "job", "--nonblock", "--url", url, "--", sys.executable, "-c", "pass")
        assert result.returncode == 75
        line = one_line_error(result.stderr)
        assert "job" in line and str(os.getpid()) in line  # says who holds it
        custom = cli("run", "job", "--timeout", "0.2", "-E", "9", "--url", url, "--", "true")
        assert custom.returncode == 9
    finally:
        holder.release()
    assert cli("run", "job", "--nonblock", "--url", url, "--", "true").returncode == 0


@pytest.mark.real_redis
@pytest.mark.parametrize("signame", ["SIGTERM", "SIGINT", "SIGHUP"])
def test_run_forwards_signals_and_releases(url: str, signame: str) -> None:
    proc = start("run", "job", "--url", url, "--", sys.executable, "-c", TRAPPING_CHILD, url=url)
    try:
        assert read_line(proc) == "ready"
        signum = getattr(signal, signame)
        proc.send_signal(signum)
        status, out, err = finish(proc)
        assert f"got {int(signum)}" in out, err
        assert status == 3, err
    finally:
        kill(proc)
    (state,) = status_json(url, "job")
    assert state["held"] is False


def test_run_forwards_a_signal_the_kernel_gave_to_another_thread() -> None:
    """The kernel gives a process' signal to any thread that does not block it. One given to a
    session thread did not interrupt run's blocking wait for its command in the main thread,
    where Python runs the forwarding handler: run hung until the command ended on its own
    (seen once in three full runs). Here the signal goes to another thread on purpose
    (pthread_kill); the handler must still run while the command is waited for."""
    from distlock._cli.run import _wait

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    stop = threading.Event()
    other = threading.Thread(target=stop.wait, args=(60,))
    other.start()
    previous = signal.signal(signal.SIGHUP, lambda signum, frame: child.terminate())
    try:
        threading.Timer(0.3, signal.pthread_kill, (other.ident, signal.SIGHUP)).start()
        started = time.monotonic()
        assert _wait(child) == -signal.SIGTERM
        assert time.monotonic() - started < 30, "the handler ran only when the command ended"
    finally:
        signal.signal(signal.SIGHUP, previous)
        stop.set()
        other.join(10)
        if child.poll() is None:
            child.kill()
            child.wait()


@pytest.mark.real_redis
def test_lost_lease_by_expiry_stops_the_command_and_exits_76(
        url: str, client: redis.Redis[Any]) -> None:
    proc = start("run", "job", "--lease", "1", "--url", url, "--", sys.executable, "-c",
                 SLEEPING_CHILD, url=url)
    other = DistLock("job", client=client)
    try:
        assert read_line(proc) == "ready"
        # Another holder takes the name once the lease has run out.
        assert other.acquire(timeout=30)
        status, _, err = finish(proc)
        assert status == 76, err
        assert "ran out" in err and "lost" in err
        assert other.owned() and other.locked()  # the new holder was left alone
    finally:
        kill(proc)
        if other.owned():
            other.release()


@pytest.mark.real_redis
def test_run_shared_stops_within_a_second_of_losing_its_read_hold(
        url: str, client: redis.Redis[Any]) -> None:
    """The monitor checks a read hold where it lives, the readers' sorted set: it read it as a
    hash, and the WRONGTYPE error was swallowed, so while another reader kept the set alive a
    lost read hold went unseen until the command ended.

    Timed from the removal of the read member to the exit of ``distlock run``: the monitor
    looks about once a second, so the bound (5 s, while the command would sleep 60 s) leaves
    room for a loaded machine and still fails a monitor that misses the loss."""
    other = DistReadWriteLock("rwjob", client=client).read_lock()
    assert other.acquire()
    readers = "distlock:{rwjob}:rw:r"
    mine = set(client.zrange(readers, 0, -1))
    # --lease: no watchdog renews the hold, so only the monitor can notice the loss in time
    proc = start("run", "rwjob", "--shared", "--lease", "60", "--url", url, "--", sys.executable,
                 "-c", SLEEPING_CHILD, url=url)
    try:
        assert read_line(proc) == "ready"
        (theirs,) = set(client.zrange(readers, 0, -1)) - mine
        removed = time.monotonic()
        assert client.zrem(readers, theirs) == 1  # its read hold is gone; ours stays
        try:
            status, _, err = finish(proc, timeout=15)  # the command sleeps 60 s
        except subprocess.TimeoutExpired:
            pytest.fail(f"run --shared still running {time.monotonic() - removed:.1f} s after "
                        "its read hold was removed")
        stopped_after = time.monotonic() - removed
        assert status == 76, err
        assert "lost" in err
        assert stopped_after <= 5.0, (
            f"run --shared exited {stopped_after:.2f} s after its read hold was removed "
            "(the monitor checks about once a second)")
        assert other.owned()
    finally:
        kill(proc)
        other.release()


@pytest.mark.real_redis
def test_run_write_stops_when_its_hold_is_force_released(url: str, client: redis.Redis[Any]) -> None:
    proc = start("run", "rwjob", "--write", "--url", url, "--", sys.executable, "-c",
                 SLEEPING_CHILD, url=url)
    try:
        assert read_line(proc) == "ready"
        forced = cli("release", "--force", "rwjob", "--url", url)
        assert forced.returncode == 0, forced.stderr
        status, _, err = finish(proc, timeout=15)  # the command sleeps 60 s
        assert status == 76, err
    finally:
        kill(proc)


@pytest.mark.real_redis
@pytest.mark.parametrize("style", [(), ("--write",)])
def test_run_keeps_flocks_rule_exclusive_and_shared_runs_exclude_each_other(
        url: str, client: redis.Redis[Any], style: Tuple[str, ...]) -> None:
    """flock(1)'s rule, across hosts: a plain (or --write) run and a --shared run of one name
    exclude each other, and both exclude a Python DistLock of that name (a name is one lock,
    docs/guides/kinds.rst); --write is a plain run."""
    name = f"flock-{uuid.uuid4().hex[:8]}"
    proc = start("run", name, *style, "--url", url, "--", sys.executable, "-c", SLEEPING_CHILD,
                 url=url)
    try:
        assert read_line(proc) == "ready"
        (state,) = status_json(url, name)
        assert state["kind"] == "DistLock" and state["held"] is True
        shared = cli("run", name, "--shared", "--nonblock", "--url", url, "--", "true")
        assert shared.returncode == 75, shared.stderr
        assert distlock.DistLock(name, client=client).acquire(blocking=False) is False
        assert distlock.DistReadWriteLock(name, client=client).read_lock().acquire(
            blocking=False) is False
        _stop(proc)
    finally:
        kill(proc)
    assert not client.exists(f"distlock:{{{name}}}")
    proc = start("run", name, "--shared", "--url", url, "--", sys.executable, "-c", SLEEPING_CHILD,
                 url=url)
    try:
        assert read_line(proc) == "ready"
        assert cli("run", name, "--shared", "--nonblock", "--url", url, "--", "true").returncode == 0
        plain = cli("run", name, *style, "--nonblock", "--url", url, "--", "true")
        assert plain.returncode == 75, plain.stderr
        assert distlock.DistLock(name, client=client).acquire(blocking=False) is False
        _stop(proc)
    finally:
        kill(proc)
    lock = distlock.DistLock(name, client=client)
    assert lock.acquire(blocking=False)
    try:
        for args in ((), ("--write",), ("--shared",)):
            taken = cli("run", name, *args, "--nonblock", "--url", url, "--", "true")
            assert taken.returncode == 75, (args, taken.stderr)
    finally:
        lock.release()


def _stop(proc: subprocess.Popen[str]) -> None:
    """SIGTERM to a ``run``: forwarded to its command, which ends; the hold is released."""
    proc.send_signal(signal.SIGTERM)
    status, _, err = finish(proc, timeout=30)
    assert status == 128 + signal.SIGTERM, err


@pytest.mark.real_redis
def test_force_release_kills_a_stubborn_command_after_the_grace(
        url: str, client: redis.Redis[Any]) -> None:
    proc = start("run", "job", "--kill-after", "0.5", "--url", url, "--", sys.executable, "-c",
                 STUBBORN_CHILD, url=url)
    try:
        assert read_line(proc) == "ready"
        refused = cli("release", "job", "--url", url)
        assert refused.returncode == 1
        assert f"pid {proc.pid}" in refused.stderr and "--force" in refused.stderr
        forced = cli("release", "--force", "job", "--url", url)
        assert forced.returncode == 0, forced.stderr
        status, _, err = finish(proc)
        assert status == 76, err
        assert "SIGKILL" in err
    finally:
        kill(proc)


# --- status, list, release -----------------------------------------------------------------------

@pytest.mark.real_redis
def test_status_and_list_json(url: str, client: redis.Redis[Any]) -> None:
    rlock = DistRLock("jobs:a", client=client)
    lock = DistLock("jobs:b", client=client)
    assert rlock.acquire() and rlock.acquire() and lock.acquire()
    try:
        before = client.info("commandstats")
        a, b, c = status_json(url, "jobs:a", "jobs:b", "other")
        assert (a["name"], a["held"], a["kind"], a["count"]) == ("jobs:a", True, "DistRLock", 2)
        assert a["token"] == rlock.token and 0 < a["lease_ms"] <= 30_000
        (owner,) = a["owners"]
        session = rlock._session()
        assert owner["session"] == session.id and owner["thread"] == threading.get_ident()
        assert owner["pid"] == os.getpid() and owner["host"] and owner["count"] == 2
        assert (b["kind"], b["token"], b["owners"][0]["thread"]) == ("DistLock", lock.token, None)
        assert (c["held"], c["kind"], c["token"]) == (False, "free", None)

        listed = cli("list", "--json", "jobs:*", "--url", url)
        assert listed.returncode == 0, listed.stderr
        assert [s["name"] for s in json.loads(listed.stdout)] == ["jobs:a", "jobs:b"]
        only_a = json.loads(cli("list", "--json", "*:a", "--url", url).stdout)
        assert [s["name"] for s in only_a] == ["jobs:a"]
        human = cli("list", "--url", url)
        assert "jobs:a: held, DistRLock" in human.stdout and "jobs:b: held, DistLock" in human.stdout
        after = client.info("commandstats")
        assert after.get("cmdstat_keys", {}).get("calls", 0) == \
            before.get("cmdstat_keys", {}).get("calls", 0)  # SCAN, never KEYS
        assert after["cmdstat_scan"]["calls"] > before.get("cmdstat_scan", {}).get("calls", 0)
    finally:
        rlock.release()
        rlock.release()
        lock.release()
    assert json.loads(cli("list", "--json", "--url", url).stdout) == []
    assert "nothing held, waited on or set matches" in cli("list", "--url", url).stdout


@pytest.mark.real_redis
def test_status_list_run_and_release_know_every_kind(url: str, client: redis.Redis[Any]) -> None:
    """``status`` and ``list`` show a held semaphore, a set event and a broken barrier, as
    ``top`` does, with their kind and in words; ``run`` on a name of another kind says so (exit
    65), and ``release --force`` breaks locks only. A lock's waiting flag, and its waiting
    process' hand-off record, read as words."""
    sem = distlock.DistSemaphore("kinds:sem", 2, client=client)
    event = distlock.DistEvent("kinds:event", client=client)
    barrier = distlock.DistBarrier("kinds:barrier", 3, client=client)
    lock = DistLock("kinds:lock", client=client)
    assert sem.acquire() and lock.acquire()
    event.set()
    barrier.abort()
    waiter = threading.Thread(target=lambda: DistLock("kinds:lock", client=client).acquire(timeout=2),
                              name="kinds-lock-waiter", daemon=True)
    waiter.start()
    try:
        assert settle(lambda: client.exists("distlock:{kinds:lock}:q"), 10)
        shown = cli("status", "kinds:sem", "kinds:event", "kinds:barrier", "kinds:lock", "--url", url)
        assert shown.returncode == 0, shown.stderr
        out = shown.stdout
        assert "kinds:sem: held, DistSemaphore" in out and "permits: 1 of 2 held" in out
        assert "free (never granted)" not in out
        assert "kinds:event: in use, DistEvent" in out and "state: set" in out
        assert "kinds:barrier: in use, DistBarrier" in out and "state: broken" in out
        assert "waiting: a process is registered as waiting" in out and ":w" not in out
        assert "hand-off record: a yield may hand the lock to a waiter of session" in out
        listed = cli("list", "kinds:*", "--url", url).stdout
        for name in ("kinds:sem", "kinds:event", "kinds:barrier", "kinds:lock"):
            assert f"{name}: " in listed
        listed_json = json.loads(cli("list", "--json", "kinds:*", "--url", url).stdout)
        as_json = {s["name"]: s["kind"] for s in listed_json}
        assert as_json == {"kinds:sem": "DistSemaphore", "kinds:event": "DistEvent",
                           "kinds:barrier": "DistBarrier", "kinds:lock": "DistLock"}
        run = cli("run", "-n", "--url", url, "kinds:sem", "--", sys.executable, "-c", "pass")
        assert run.returncode == 65 and "'kinds:sem' is a DistSemaphore here" in run.stderr
        forced = cli("release", "--force", "kinds:event", "--url", url)
        assert forced.returncode == 65 and "not a lock" in forced.stderr
        assert client.exists("distlock:{kinds:event}:ev")
    finally:
        waiter.join(10)
        sem.release()
        lock.release()
        event.clear()
        barrier.reset()
    assert "nothing held, waited on or set matches" in cli("list", "kinds:*", "--url", url).stdout



@pytest.mark.real_redis
def test_status_and_run_with_a_read_write_lock(url: str, client: redis.Redis[Any]) -> None:
    rw_class = getattr(distlock, "DistReadWriteLock", None)
    if rw_class is None:
        pytest.skip("this version has no DistReadWriteLock")
    reader = rw_class("shared", client=client).read_lock()
    assert reader.acquire()
    try:
        (state,) = status_json(url, "shared")
        assert (state["kind"], state["held"], state["count"]) == ("DistReadWriteLock", True, 1)
        (owner,) = state["owners"]
        assert owner["mode"] == "read" and owner["thread"] == threading.get_ident()
        assert owner["token"] == reader.token == state["token"] and owner["lease_ms"] > 0
        # finding 5: a read holder's host and pid are recorded and shown, as a writer's are
        assert (owner["host"], owner["pid"]) == (socket.gethostname(), os.getpid())
        text = cli("status", "shared", "--url", url).stdout
        assert f"on {socket.gethostname()} pid {os.getpid()}" in text and "not recorded" not in text
        assert [s["name"] for s in json.loads(cli("list", "--json", "--url", url).stdout)] == ["shared"]
        # --shared joins the readers; --write must wait for them.
        ok = cli("run", "shared", "--shared", "--nonblock", "--url", url, "--", sys.executable,
                 "-c", "import os; print(os.environ['DISTLOCK_TOKEN'])")
        assert ok.returncode == 0, ok.stderr
        assert int(ok.stdout) > reader.token
        refused = cli("run", "shared", "--write", "--nonblock", "--url", url, "--", "true")
        assert refused.returncode == 75
    finally:
        reader.release()
    assert cli("run", "shared", "--write", "--nonblock", "--url", url, "--", "true").returncode == 0
    forced_reader = rw_class("shared", client=client).read_lock()
    assert forced_reader.acquire()
    try:
        assert cli("release", "--force", "shared", "--url", url).returncode == 0
        (state,) = status_json(url, "shared")
        assert state["held"] is False
        with pytest.raises(LockLostError):
            forced_reader.release()
    finally:
        if forced_reader.owned():
            forced_reader.release()


@pytest.mark.real_redis
def test_release_force_wakes_waiters_moves_the_token_and_loses_the_old_lease(
        url: str, client: redis.Redis[Any]) -> None:
    # A short watchdog period, so the old holder hears of its loss quickly; a long wait cap, so
    # the waiter can only have been woken by the force-release's message, not by polling.
    configure(lease=30.0, renew_interval=0.2, wait_cap=60.0)
    holder = DistLock("stuck", client=client)
    lost = threading.Event()
    holder.on_lost(lambda _lock: lost.set())
    assert holder.acquire()
    old_token = holder.token
    assert old_token is not None
    waiter = DistLock("stuck", client=client)
    got: List[bool] = []
    thread = threading.Thread(target=lambda: got.append(waiter.acquire(timeout=40)))
    thread.start()
    try:
        deadline = time.monotonic() + 20
        while client.hget("distlock:{stuck}", ":w") is None and time.monotonic() < deadline:
            time.sleep(0.05)  # until the waiter has tried once and is sleeping
        refused = cli("release", "stuck", "--url", url)
        assert refused.returncode == 1
        assert str(os.getpid()) in refused.stderr and holder._session().id in refused.stderr
        assert holder.locked()  # refused: nothing changed

        forced = cli("release", "--force", "stuck", "--url", url)
        assert forced.returncode == 0, forced.stderr
        assert str(old_token) in forced.stdout
        thread.join(timeout=30)
        assert got == [True]
        new_token = waiter.token
        assert new_token is not None and new_token > old_token + 1  # the counter moved on
        assert lost.wait(timeout=20)
        with pytest.raises(LockLostError):
            holder.release()
        assert waiter.owned()  # the old holder's failed release left the new hold alone
    finally:
        thread.join(timeout=30)
        if waiter.owned():
            waiter.release()
    nothing = cli("release", "--force", "stuck", "--url", url)
    assert nothing.returncode == 0 and "not held" in nothing.stdout


# --- demo ----------------------------------------------------------------------------------------

def _demo_rows(stdout: str) -> Dict[str, List[str]]:
    rows = {}
    for line in stdout.splitlines():
        for label in ("no lock", "DistLock", "DistRLock, taken twice"):
            if line.startswith(label + " "):
                rows[label] = line[len(label):].split()
    return rows


def _check_demo(result: subprocess.CompletedProcess[str], workers: int, k: int) -> None:
    assert result.returncode == 0, result.stdout + result.stderr
    rows = _demo_rows(result.stdout)
    assert set(rows) == {"no lock", "DistLock", "DistRLock, taken twice"}, result.stdout
    for label in ("DistLock", "DistRLock, taken twice"):
        final, expected, lost = rows[label][:3]
        assert (int(final), int(expected), int(lost)) == (workers * k, workers * k, 0)
    final, expected, lost = rows["no lock"][:3]
    assert int(final) + int(lost) == int(expected) == workers * k


@pytest.mark.slow
@pytest.mark.real_redis
def test_demo_on_a_private_redis_server() -> None:
    result = cli("demo", "--workers", "2", "--increments", "40", timeout=180)
    assert "private redis-server" in result.stdout
    _check_demo(result, 2, 40)


@pytest.mark.slow
def test_demo_on_fakeredis_when_there_is_no_redis_server(tmp_path: Any) -> None:
    pytest.importorskip("fakeredis")
    pytest.importorskip("lupa", reason="fakeredis needs lupa for Lua scripts")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    path = str(bin_dir)
    assert shutil.which("redis-server", path=path) is None
    result = cli("demo", "--workers", "2", "--increments", "25", env=_env(PATH=path), timeout=180)
    assert "fakeredis" in result.stdout
    _check_demo(result, 2, 25)


@pytest.mark.slow
@pytest.mark.real_redis
def test_demo_on_a_given_server_leaves_nothing_behind(url: str, client: redis.Redis[Any]) -> None:
    result = cli("demo", "--url", url, "--workers", "2", "--increments", "20", timeout=180)
    assert url in result.stdout
    _check_demo(result, 2, 20)
    assert keys_of(client) == []


@pytest.mark.real_redis
def test_force_release_wakes_waiters_at_once(url: str, client: Any) -> None:
    """A waiter of another process is woken by the force-release's hint, not by polling: its
    polling bound is set far beyond the test's patience."""
    configure(wait_cap=60.0)
    stuck = DistLock("stuck", client=client, lease=60)
    assert stuck.acquire()
    got = threading.Event()

    def wait() -> None:
        waiter = DistLock("stuck", client=redis.Redis.from_url(url), lease=60)
        if waiter.acquire(timeout=50):
            got.set()
            waiter.release()

    thread = threading.Thread(target=wait)
    thread.start()
    try:
        deadline = time.monotonic() + 20
        while not client.zcard("distlock:{stuck}:q") and time.monotonic() < deadline:
            time.sleep(0.02)
        assert client.zcard("distlock:{stuck}:q") == 1  # the waiting process registered
        assert cli("release", "--force", "stuck", "--url", url).returncode == 0
        assert got.wait(20), "the waiter was not woken by the force-release"
    finally:
        thread.join(60)
