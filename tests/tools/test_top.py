"""``distlock top``: the rows (no I/O), one ``--once --json`` snapshot of held primitives and of
waiters in another process, what waiting leaves behind, bad input, and the live view in a real
terminal (tmux), driven as a person would: keys sent, the screen read back.

Child processes and tmux servers are always ended in ``finally``. No timing is asserted beyond
generous bounds: a hold's age is only checked against the wall time around it.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

import pytest
import redis
from _support import BOUND, distlock_keys, kill, read_line, settle

from distlock import DistEvent, DistLock, DistReadWriteLock, DistRLock, DistSemaphore, configure
from distlock._cli.inspect import exclusive_state, hold_age, permit_age, rw_state, token_age
from distlock._cli.top import snapshot
from distlock._cli.top_rows import (
    BARRIER,
    COND,
    EVENT,
    LOCK,
    RW,
    SEM,
    TopRow,
    TopSnapshot,
    barrier_row,
    condition_row,
    duration,
    event_row,
    format_top,
    group_keys,
    lock_row,
    plan_reads,
    rw_row,
    semaphore_row,
    sort_rows,
    split_key,
)
from distlock._core.permits import grant_ms, permit_id, stamped
from distlock.testing.server import free_port

ROOT = Path(__file__).resolve().parent.parent.parent
TIMEOUT = 60  # seconds: the bound of every subprocess call here
REQUIRE_REAL = os.environ.get("DISTLOCK_REQUIRE_REDIS") == "1"
HOLDER = f"{socket.gethostname()}:{os.getpid()}"


def cli(*args: str, url: Optional[str] = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "DISTLOCK_URL"}
    if url is not None:
        env["DISTLOCK_URL"] = url
    return subprocess.run([sys.executable, "-m", "distlock", *args], env=env, cwd=ROOT,
                          stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          timeout=TIMEOUT)


def top_json(url: str, *extra: str) -> Dict[str, Any]:
    result = cli("top", "--once", "--json", "--url", url, *extra)
    assert result.returncode == 0, result.stderr
    data: Dict[str, Any] = json.loads(result.stdout)
    return data


def rows_by_name(data: Dict[str, Any]) -> Dict[str, Dict[str, Any]]:
    return {row["name"]: row for row in data["rows"]}


def one_line_error(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert "Traceback" not in stderr
    return lines[-1]


# --- no I/O: keys, rows, order, text --------------------------------------------------------------

def test_keys_are_grouped_by_primitive() -> None:
    keys = [
        b"distlock:{a}", b"distlock:{a}:q", b"distlock:{a}:fence",       # a lock, waited on
        b"distlock:{only-fence}:fence",                                    # nothing held
        b"distlock:{rw}:rw:w", b"distlock:{rw}:rw:r", b"distlock:{rw}:rw:q",
        b"distlock:{s}:sem", b"distlock:{s}:sem:x",
        b"distlock:{e}:ev", b"distlock:{b}:bar", b"distlock:{b}:bar:w",
        b"distlock:{l}:cond:q:c1", b"distlock:{l}:cond:l:c1", b"distlock:{l}:cond:l:gone",
        b"distlock:{%7Bx%7D:1}", b"other:{a}", b"distlock:{}", b"distlock:nobrace",
    ]
    assert split_key("distlock:", b"distlock:{%7Bx%7D:1}:q") == ("{x}:1", ":q")
    assert split_key("distlock:", "distlock:{}") is None
    found = {(f.name, f.family, f.cond): f for f in group_keys("distlock:", keys)}
    assert set(found) == {("a", LOCK, None), ("rw", RW, None), ("s", SEM, None),
                          ("e", EVENT, None), ("b", BARRIER, None), ("l", COND, "c1"),
                          ("{x}:1", LOCK, None)}
    assert found[("a", LOCK, None)].keys == {"hold": "distlock:{a}", "wait": "distlock:{a}:q"}
    assert found[("rw", RW, None)].keys["readers"] == "distlock:{rw}:rw:r"
    assert [f.waited for f in found.values()].count(True) == 4  # a, rw, b, the condition
    ordered = group_keys("distlock:", keys)
    # the plan reads every waited primitive, then the others by name, up to the limit
    chosen = plan_reads(ordered, limit=5)
    assert [f.name for f in chosen if not f.waited] == ["e"]
    assert len(plan_reads(ordered, limit=None)) == len(ordered)
    assert len(plan_reads(ordered, limit=1, budget=2)) == 2  # the read budget caps them


def test_lock_rows_show_age_lease_token_and_the_oldest_wait() -> None:
    now = 10_000_000
    fields = {b"s1:140234567890123": b"2", b":t": b"17", b":i": b"web-1:9", b":l": b"40000",
              b":s": str(now - 2500).encode(), b":w": b"1"}
    state = exclusive_state("n", "distlock:{n}", b"hash", fields, 25_000, None)
    assert state is not None
    assert (state.age_ms, state.waiting_since_ms, state.extra) == (15_000, now - 2500, {":w": "1"})
    row = lock_row(state, "n", waiting=2, now_ms=now)
    assert row == TopRow(name="n", kind="DistRLock", held=True, holders=("web-1:9",),
                         age_ms=15_000, lease_ms=25_000, token=17, waiting=2,
                         oldest_wait_ms=2500, note="count 2")
    # nobody queued any more: a stale ':s' shows no wait
    assert lock_row(state, "n", waiting=0, now_ms=now).oldest_wait_ms is None  # type: ignore[union-attr]
    # a hold granted before ':l' existed shows no age
    old = exclusive_state("n", "k", "hash", {"s1:0a1b2c3d4e5f": "1", ":t": "5"}, 900, None)
    assert old is not None and old.age_ms is None and old.kind == "DistLock"
    assert hold_age(b"30000", -1) is None and hold_age(None, 5) is None
    assert hold_age("30000", 31_000) == 0  # never negative
    assert lock_row(None, "n", waiting=None, now_ms=now) is None
    free = lock_row(None, "n", waiting=1, now_ms=now)
    assert free is not None and not free.held and free.waiting == 1


def test_rows_of_the_other_primitives() -> None:
    now = 1_000_000
    writer = rw_state("rw", "w", writer_type="hash",
                      writer_fields={"s9:99": "1", ":t": "30", ":i": "h:1", ":l": "30000"},
                      writer_pttl=29_000, readers=[], queue=[("s8:88", now + 10.0)], now_ms=now,
                      fence=None)
    row = rw_row(writer, "rw")
    assert row is not None
    assert (row.holders, row.age_ms, row.token, row.waiting, row.note) == \
        (("h:1",), 1000, 30, 1, "write")
    readers = rw_state("rw", "w", writer_type="none", writer_fields=None, writer_pttl=None,
                       readers=[(b"s1:11#20@h:2", float(now + 5000)),
                                (b"s2:22#21@h:3", float(now + 9000))],
                       queue=None, now_ms=now, fence=None)
    row = rw_row(readers, "rw")
    assert row is not None and (row.holders, row.note, row.age_ms) == (("h:2", "h:3"), "2 readers", None)

    members = [(b"~v", -4.0), (b"~x", -2.0), (b"s1:7:1", float(now + 3000)),
               (b"s1:7:2", float("inf")), (b"s2:8:1", float(now - 1))]  # s2's permit ran out
    sem = semaphore_row("s", members, 20_000, waiting=3, now_ms=now)
    assert sem is not None
    assert (sem.holders, sem.lease_ms, sem.waiting, sem.note) == (("s1",), 3000, 3, "2/4 permits")
    assert semaphore_row("s", [(b"~v", -2.0)], -1, waiting=0, now_ms=now) is None

    assert event_row("e", True, waiting=None) == TopRow(name="e", kind="DistEvent", held=True,
                                                        note="set")
    assert event_row("e", False, waiting=0) is None
    bar = barrier_row("b", [b"3", None], waiting=2)
    assert bar is not None and (bar.waiting, bar.note, bar.held) == (2, "2/3 parties", False)
    assert barrier_row("b", [b"3", b"1"], waiting=0).note == "0/3 parties, broken"  # type: ignore[union-attr]
    assert barrier_row("b", [b"3", None], waiting=0) is None
    cond = condition_row("c", "l", waiting=1, oldest=[(b"w1", float((now - 1500) * 1000))],
                         now_ms=now)
    assert cond is not None and (cond.oldest_wait_ms, cond.note) == (1500, "lock l")
    assert condition_row("c", "c", waiting=0, oldest=[], now_ms=now) is None


def test_rows_are_sorted_by_the_oldest_wait() -> None:
    rows = [
        TopRow(name="idle-b", kind="DistLock", held=True),
        TopRow(name="sem", kind="DistSemaphore", held=True, waiting=5),     # wait not recorded
        TopRow(name="young", kind="DistLock", held=True, waiting=1, oldest_wait_ms=10),
        TopRow(name="idle-a", kind="DistRLock", held=True),
        TopRow(name="old", kind="DistRLock", held=True, waiting=1, oldest_wait_ms=9000),
        TopRow(name="ev", kind="DistEvent", held=False, waiting=9),
    ]
    assert [r.name for r in sort_rows(rows)] == ["old", "young", "ev", "sem", "idle-a", "idle-b"]


def test_the_text_of_a_snapshot() -> None:
    rows = (TopRow(name="orders:42", kind="DistLock", held=True, holders=("web-1:17", "web-2:3"),
                   age_ms=65_000, lease_ms=25_400, token=1763745123456789, waiting=2,
                   oldest_wait_ms=1234),
            TopRow(name="pool", kind="DistSemaphore", held=True, holders=("a" * 32,),
                   note="1/3 permits"))
    snap = TopSnapshot(url="redis://h:6379/0", server_time_ms=0, rows=rows, primitives=2,
                       waited=1, read=2, keys_scanned=5, scan_calls=1, commands=6,
                       refresh_ms=3.2)
    lines = format_top(snap, live=True)
    assert lines[0] == "distlock top - redis://h:6379/0 - 00:00:00 UTC  (q or Ctrl-C quits)"
    assert "2 held or waited on, 1 waited on, 2 shown" in lines[1]
    assert lines[2].split() == ["NAME", "KIND", "HOLDER", "AGE", "LEASE", "TOKEN", "WAITING",
                                "OLDEST", "NOTE"]
    assert lines[3].split() == ["orders:42", "DistLock", "web-1:17", "+1", "1m05s", "25.4s",
                                "1763745123456789", "2", "1.2s"]
    assert "session aaaaaaaa" in lines[4] and lines[4].endswith("1/3 permits")
    assert all(len(line) <= 30 for line in format_top(snap, 30))
    assert format_top(snap, 200, error="ConnectionError: gone")[1].startswith("ConnectionError")
    empty = TopSnapshot(url="u", server_time_ms=0, rows=(), primitives=0, waited=0, read=0,
                        keys_scanned=0, scan_calls=1, commands=2, refresh_ms=1.0)
    assert format_top(empty)[-1] == "(nothing held, nobody waiting)"
    assert [duration(v) for v in (None, 850, 12_345, 245_000, 7_380_000, 277_200_000)] == \
        ["-", "850ms", "12.3s", "4m05s", "2h03m", "3d05h"]
    data = snap.to_json()
    assert data["shown"] == 2 and data["rows"][0]["holders"] == ["web-1:17", "web-2:3"]


def test_read_holds_and_permits_get_their_age_from_the_grant_time_they_carry() -> None:
    now = 1_763_745_123_456  # server ms
    # a read hold's token is the server's clock at its grant, in µs (next_token)
    assert token_age((now - 2500) * 1000 + 999, now) == 2500
    assert token_age(now * 1000 + 5000, now) == 0        # never negative
    assert token_age(17, now) is None and token_age(None, now) is None  # a counter, not a time
    readers = rw_state("rw", "w", writer_type="none", writer_fields=None, writer_pttl=None,
                       readers=[(f"s1:11#{(now - 4000) * 1000}@h:2", float(now + 5000)),
                                (f"s2:22#{(now - 1000) * 1000}@h:3", float(now + 9000)),
                                (f"s3:33#{(now - 9000) * 1000}@h:4", float(now - 1)),  # gone
                                ("s4:44#12@h:5", float(now + 9000))],  # an old counter token
                       queue=None, now_ms=now, fence=None)
    row = rw_row(readers, "rw")
    assert row is not None and (row.age_ms, row.note) == (4000, "3 readers")  # the oldest live one
    # a permit's id carries the acquiring host's clock at the try that got it, in ms
    pid = permit_id("a" * 32, 7)
    assert pid.startswith("a" * 32 + ":7:") and "@" not in pid
    before = int(time.time() * 1000)
    permit = stamped(pid)
    assert permit.startswith(pid + "@") and before <= (grant_ms(permit) or 0) <= time.time() * 1000
    assert grant_ms("s1:7:1") is None and grant_ms("s1:7:1@12") is None  # none, or not a time
    assert grant_ms("s1:7:1@x") is None and grant_ms("s1:7:1@\u0663") is None
    assert permit_age(f"s1:7:1@{now - 1500}", now) == 1500
    assert permit_age(f"s1:7:1@{now + 40}", now) == 0  # a client clock ahead: clamped
    members = [(b"~v", -4.0), (f"s1:7:1@{now - 700}".encode(), float(now + 3000)),
               (f"s1:7:2@{now - 3200}".encode(), float("inf")), (b"s2:8:1", float(now + 9000)),
               (f"s3:9:1@{now - 9000}".encode(), float(now - 1))]  # ran out: not counted
    sem = semaphore_row("s", members, 20_000, waiting=0, now_ms=now)
    assert sem is not None and (sem.age_ms, sem.note, sem.holders) == \
        (3200, "3/3 permits", ("s1", "s2"))
    assert semaphore_row("s", [(b"~v", -2.0), (b"s2:8:1", float(now + 9))], -1, waiting=0,
                         now_ms=now).age_ms is None  # type: ignore[union-attr]


def test_long_marks_holds_older_than_its_threshold() -> None:
    rows = (TopRow(name="old", kind="DistLock", held=True, holders=("h:1",), age_ms=90_000),
            TopRow(name="young", kind="DistSemaphore", held=True, holders=("h:2",), age_ms=2_000),
            TopRow(name="ev", kind="DistEvent", held=True, note="set"))  # no age: never marked
    snap = TopSnapshot(url="u", server_time_ms=0, rows=rows, primitives=3, waited=0, read=3,
                       keys_scanned=3, scan_calls=1, commands=4, refresh_ms=1.0, long_ms=60_000)
    assert [snap.is_long(r) for r in rows] == [True, False, False]
    lines = format_top(snap)
    assert "; 1 held longer than 1m00s (!)" in lines[1] and "\x1b" not in "".join(lines)
    text = {line.split()[0]: line.split() for line in lines[3:]}
    assert (text["old"][3], text["young"][3], text["ev"][3]) == ("1m30s!", "2.0s", "-")
    # the ages stay aligned: an unmarked one has a space where the mark would be
    assert lines[3].index("1m30s!") + len("1m30s!") == lines[4].index("2.0s ") + len("2.0s ")
    live = format_top(snap, 20, live=True)
    assert live[3] == "\x1b[7m" + lines[3][:20] + "\x1b[0m" and live[4] == lines[4][:20]
    assert format_top(snap, highlight=True)[3].startswith("\x1b[7m")
    data = snap.to_json()
    assert data["long_ms"] == 60_000 and [r["long"] for r in data["rows"]] == [True, False, False]
    # without --long: no mark, no space, no count
    plain = format_top(TopSnapshot(**{**snap.__dict__, "long_ms": None}), live=True)
    assert "longer than" not in plain[1] and "!" not in "".join(plain) and "\x1b" not in plain[3]


# --- against the server -------------------------------------------------------------------------

# Waits in another process: first for the DistRLock top:b, then (once that wait is recorded) for
# the DistLock top:a, then on the condition top:cond; says "waiting", and on a line on stdin
# ends the condition's wait, lets the lock waits finish, and says "done <names it got>".
WAITERS = r"""
import sys, threading, time
import redis
from distlock import DistCondition, DistLock, DistRLock

client = redis.Redis.from_url(sys.argv[1])

def until(check):
    deadline = time.monotonic() + 60
    while not check():
        if time.monotonic() > deadline:
            raise SystemExit("timed out")
        time.sleep(0.02)

got = []
def take(lock):
    if lock.acquire(timeout=120):
        got.append(lock.name)
        lock.release()

cond = DistCondition("top:cond", client=client)
def wait_on_cond():
    with cond:
        cond.wait(120)

threads = [threading.Thread(target=take, args=(DistRLock("top:b", client=client),))]
threads[-1].start()
until(lambda: client.hexists("distlock:{top:b}", ":s"))
time.sleep(0.3)
threads.append(threading.Thread(target=take, args=(DistLock("top:a", client=client),)))
threads[-1].start()
until(lambda: client.hexists("distlock:{top:a}", ":s"))
time.sleep(0.3)
threads.append(threading.Thread(target=wait_on_cond))
threads[-1].start()
until(lambda: client.exists("distlock:{top:cond}:cond:q:top:cond"))
print("waiting", flush=True)
sys.stdin.readline()
with cond:
    cond.notify_all()
for t in threads:
    t.join(120)
print("done", ",".join(sorted(got)), flush=True)
"""


@pytest.mark.real_redis
def test_once_json_shows_holds_and_waiters_sorted_by_the_oldest_wait(
        url: str, client: redis.Redis[Any]) -> None:
    a = DistLock("top:a", client=client)
    b = DistRLock("top:b", client=client)
    reader = DistReadWriteLock("top:c", client=client).read_lock()
    sem = DistSemaphore("top:d", 2, client=client)
    event = DistEvent("top:e", client=client)
    started = time.monotonic()
    assert a.acquire() and b.acquire() and b.acquire() and reader.acquire() and sem.acquire()
    event.set()
    child = subprocess.Popen([sys.executable, "-c", WAITERS, url], cwd=ROOT, text=True,
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    released = False
    try:
        assert read_line(child) == "waiting"
        before = client.info("commandstats")
        data = top_json(url)
        elapsed_ms = (time.monotonic() - started) * 1000
        after = client.info("commandstats")
        assert after.get("cmdstat_keys", {}).get("calls", 0) == \
            before.get("cmdstat_keys", {}).get("calls", 0)  # SCAN, never KEYS
        assert set(data) == {"url", "server_time_ms", "rows", "shown", "primitives", "waited",
                             "read", "keys_scanned", "scan_calls", "commands", "refresh_ms",
                             "long_ms"}
        assert data["long_ms"] is None
        assert (data["primitives"], data["waited"], data["shown"]) == (6, 3, 6)
        assert data["commands"] >= data["scan_calls"] + 1 and data["url"] == url
        names = [row["name"] for row in data["rows"]]
        # the oldest wait first: top:b's, then top:a's, then the condition's; then by name
        assert names == ["top:b", "top:a", "top:cond", "top:c", "top:d", "top:e"], names
        rows = rows_by_name(data)
        for row in data["rows"]:
            assert set(row) == {"name", "kind", "held", "holders", "age_ms", "lease_ms", "token",
                                "waiting", "oldest_wait_ms", "note", "long"}
            assert row["long"] is False  # no --long: nothing marked
        rb, ra, rc = rows["top:b"], rows["top:a"], rows["top:cond"]
        assert (rb["kind"], rb["waiting"], rb["token"], rb["note"]) == \
            ("DistRLock", 1, b.token, "count 2")
        assert (ra["kind"], ra["waiting"], ra["token"], ra["holders"]) == \
            ("DistLock", 1, a.token, [HOLDER])
        assert rb["oldest_wait_ms"] > ra["oldest_wait_ms"] > rc["oldest_wait_ms"] >= 0
        assert 0 <= ra["age_ms"] <= elapsed_ms + 5 and 0 < ra["lease_ms"] <= 30_000
        assert (rc["kind"], rc["waiting"], rc["held"]) == ("DistCondition", 1, False)
        assert ra["oldest_wait_ms"] <= ra["age_ms"] + 5  # nobody waited before the hold began
        c, d, e = rows["top:c"], rows["top:d"], rows["top:e"]
        assert (c["kind"], c["note"], c["holders"], c["waiting"]) == \
            ("DistReadWriteLock", "1 reader", [HOLDER], 0)
        assert (d["kind"], d["note"], d["holders"]) == \
            ("DistSemaphore", "1/2 permits", [sem._session().id])
        # a read hold's age from its token, a permit's from the grant time its id carries
        assert 0 <= c["age_ms"] <= elapsed_ms + 5 and 0 <= d["age_ms"] <= elapsed_ms + 50
        assert (e["kind"], e["note"], e["held"]) == ("DistEvent", "set", True)
        limited = top_json(url, "--limit", "2")
        assert [row["name"] for row in limited["rows"]] == ["top:b", "top:a"]

        # the waiters get what they waited for, and leave
        a.release()
        b.release()
        b.release()
        released = True
        assert child.stdin is not None
        child.stdin.write("go\n")
        child.stdin.flush()
        assert read_line(child) == "done top:a,top:b"
        assert child.wait(TIMEOUT) == 0
    finally:
        if not released:
            for lock in (a, b, b):
                if lock.locked():
                    try:
                        lock.release()
                    except RuntimeError:
                        pass
        kill(child)
        reader.release()
        sem.release()
        event.clear()
    # nothing of the waits stays at rest: only the names' token counters
    assert settle(lambda: not top_json(url)["rows"], BOUND)
    left = distlock_keys(client)
    assert all(key.endswith(":fence") for key in left), left


@pytest.mark.real_redis
def test_a_waiter_that_gives_up_leaves_no_wait_behind(backend: Any, client: redis.Redis[Any]) -> None:
    holder = DistLock("top:g", client=client, lease=60)
    assert holder.acquire()
    other = backend.client()

    def give_up_after(seconds: float) -> threading.Thread:
        waiter = DistLock("top:g", client=other, lease=60)
        thread = threading.Thread(target=waiter.acquire, kwargs={"timeout": seconds})
        thread.start()
        return thread

    def row() -> Dict[str, Any]:
        (found,) = [r for r in snapshot(client, "u").rows if r.name == "top:g"]
        return found.to_json()

    try:
        first = give_up_after(1.5)
        assert settle(lambda: row()["waiting"] == 1, BOUND)
        since = int(client.hget("distlock:{top:g}", ":s") or 0)
        assert since > 0 and row()["oldest_wait_ms"] is not None
        first.join(BOUND)
        assert settle(lambda: not client.exists("distlock:{top:g}:q"), BOUND)
        assert (row()["waiting"], row()["oldest_wait_ms"]) == (0, None)
        time.sleep(0.05)
        # the next waiter starts the hold's wait afresh: no stale waiting-since
        second = give_up_after(1.5)
        assert settle(lambda: row()["waiting"] == 1, BOUND)
        assert int(client.hget("distlock:{top:g}", ":s") or 0) > since
        second.join(BOUND)
    finally:
        holder.release()
        other.close()
    assert settle(lambda: distlock_keys(client) == ["distlock:{top:g}:fence"], BOUND)


@pytest.mark.real_redis
def test_hold_age_counts_across_renewals_and_reentries(client: redis.Redis[Any]) -> None:
    configure(lease=1.0, renew_interval=0.2)  # many renewals within the test
    rlock = DistRLock("top:age", client=client)
    writer = DistReadWriteLock("top:age-rw", client=client).write_lock()
    started = time.monotonic()
    assert rlock.acquire() and writer.acquire()
    try:
        time.sleep(0.6)
        assert rlock.acquire()  # a re-entry that lengthens the hold
        time.sleep(1.2)         # past the 1 s lease: only renewals keep the holds
        rows = {r.name: r for r in snapshot(client, "u").rows}
        elapsed_ms = (time.monotonic() - started) * 1000
        for name in ("top:age", "top:age-rw"):
            age = rows[name].age_ms
            assert age is not None and 1800 - 5 <= age <= elapsed_ms + 5, (name, age)
            assert rows[name].lease_ms is not None and rows[name].lease_ms <= 1000
        rlock.release()
    finally:
        rlock.release()
        writer.release()


@pytest.mark.real_redis
def test_read_holds_and_permits_show_an_age_that_grows(client: redis.Redis[Any]) -> None:
    reader = DistReadWriteLock("top:age-r", client=client).read_lock()
    sem = DistSemaphore("top:age-s", 3, client=client)
    started = time.monotonic()
    # a permit taken at rest (scored +inf, no clock read on the server), then one that is not
    assert reader.acquire() and sem.acquire() and sem.acquire()

    def ages() -> List[Optional[int]]:
        rows = {r.name: r for r in snapshot(client, "u").rows}
        return [rows["top:age-r"].age_ms, rows["top:age-s"].age_ms]

    try:
        members = [m.decode() for m in client.zrangebyscore("distlock:{top:age-s}:sem", 0, "+inf")]
        assert len(members) == 2 and all(grant_ms(m) is not None for m in members), members
        first = ages()
        elapsed_ms = (time.monotonic() - started) * 1000
        assert all(a is not None and 0 <= a <= elapsed_ms + 50 for a in first), first
        time.sleep(1.0)
        second = ages()
        assert all(a is not None and a >= 500 for a in second), second
    finally:
        reader.release()
        sem.release(2)


@pytest.mark.real_redis
def test_a_permit_granted_to_a_waiter_is_aged_from_its_grant(backend: Any,
                                                             client: redis.Redis[Any]) -> None:
    """A waiter sends each try under a fresh grant time; its queue entry keeps the plain id."""
    holder = DistSemaphore("top:wait-s", 1, client=client)
    assert holder.acquire()
    other = backend.client()
    waiter = DistSemaphore("top:wait-s", 1, client=other)
    got: List[bool] = []
    thread = threading.Thread(target=lambda: got.append(waiter.acquire(timeout=60)))
    thread.start()
    held = True
    try:
        assert settle(lambda: client.exists("distlock:{top:wait-s}:sem:q") == 1, BOUND)
        time.sleep(1.0)  # the wait, which is not the permit's age
        released = time.monotonic()
        holder.release()
        held = False
        thread.join(BOUND)
        assert got == [True]
        (row,) = [r for r in snapshot(client, "u").rows if r.name == "top:wait-s"]
        assert row.age_ms is not None and row.age_ms <= (time.monotonic() - released) * 1000 + 50
        assert not client.exists("distlock:{top:wait-s}:sem:q")  # its entry left with it
    finally:
        if held:
            holder.release()
        thread.join(BOUND)
        if got == [True]:
            waiter.release()
        other.close()


@pytest.mark.real_redis
def test_long_marks_the_holds_past_its_threshold(url: str, client: redis.Redis[Any]) -> None:
    seconds, micros = client.time()
    now = seconds * 1000 + micros // 1000
    granted = now - 2 * 3600 * 1000  # two hours ago, as the grants record it:
    old_r, old_s = "distlock:{top:long-r}:rw:r", "distlock:{top:long-s}:sem"
    client.zadd(old_r, {f"{'c' * 32}:1#{granted * 1000}@h:1": now + 60_000})  # a token, µs
    client.zadd(old_s, {"~v": -3, f"{'c' * 32}:1:1@{granted}": now + 60_000})  # an id, ms
    for key in (old_r, old_s):
        client.pexpire(key, 60_000)
    reader = DistReadWriteLock("top:long-yr", client=client).read_lock()
    sem = DistSemaphore("top:long-ys", 1, client=client)
    lock = DistLock("top:long-yl", client=client)
    assert reader.acquire() and sem.acquire() and lock.acquire()
    names = ["top:long-r", "top:long-s", "top:long-yr", "top:long-ys", "top:long-yl"]
    try:
        # 10 minutes: the two-hour-old holds are past it, those taken just now are not
        data = top_json(url, "--long", "600")
        rows = rows_by_name(data)
        assert data["long_ms"] == 600_000
        assert [rows[n]["long"] for n in names] == [True, True, False, False, False], rows
        assert rows["top:long-r"]["age_ms"] >= 2 * 3600 * 1000
        assert rows["top:long-s"]["age_ms"] >= 2 * 3600 * 1000
        text = cli("top", "--once", "--long", "600", "--url", url)
        assert text.returncode == 0, text.stderr
        assert "; 2 held longer than 10m00s (!)" in text.stdout.splitlines()[1]
        marked = {line.split()[0]: "!" in line for line in text.stdout.splitlines()[3:]}
        assert [marked[n] for n in names] == [True, True, False, False, False], text.stdout
        assert "2h00m! " in text.stdout
        assert "\x1b" not in text.stdout  # not a terminal: the mark, no highlighting
        # once the holds taken here are older than the threshold, they are marked too
        time.sleep(1.0)
        rows = rows_by_name(top_json(url, "--long", "0.5"))
        assert all(rows[n]["long"] for n in names), rows
    finally:
        reader.release()
        sem.release()
        lock.release()
        client.delete(old_r, old_s)


@pytest.mark.parametrize("args", [
    ["top", "--interval", "-1"],
    ["top", "--interval", "0"],
    ["top", "--interval", "0.01"],
    ["top", "--interval", "nan"],
    ["top", "--interval", "soon"],
    ["top", "--limit", "0"],
    ["top", "--limit", "x"],
    ["top", "--long", "-1"],
    ["top", "--long", "nan"],
    ["top", "--long", "soon"],
    ["top", "extra"],
])
def test_bad_arguments_exit_2_with_a_usage_error(args: List[str]) -> None:
    result = cli(*args, url="redis://127.0.0.1:1/0")
    assert result.returncode == 2, result.stderr
    assert "error:" in one_line_error(result.stderr)


@pytest.mark.parametrize("args", [["top", "--once"], ["top", "--json"], ["top"]])
def test_unreachable_server_exits_69_naming_the_url(args: List[str]) -> None:
    url = f"redis://127.0.0.1:{free_port()}/0"
    result = cli(*args, url=url)
    assert result.returncode == 69, result.stderr
    assert url in one_line_error(result.stderr)
    assert len(result.stderr.strip().splitlines()) == 1 and not result.stdout


# --- a real terminal ------------------------------------------------------------------------------

class Tmux:
    """A private tmux server (its own socket) running one session of a fixed size."""

    def __init__(self, socket_path: Path, command: str, width: int = 150, height: int = 30):
        self.base = [shutil.which("tmux") or "tmux", "-S", str(socket_path)]
        self.run("new-session", "-d", "-s", "top", "-x", str(width), "-y", str(height), command)

    def run(self, *args: str) -> str:
        result = subprocess.run([*self.base, *args], capture_output=True, text=True,
                                timeout=TIMEOUT)
        assert result.returncode == 0, result.stderr
        return result.stdout

    def screen(self) -> str:
        return self.run("capture-pane", "-p", "-t", "top")

    def wait_for(self, check: Callable[[str], bool], what: str) -> str:
        deadline = time.monotonic() + BOUND
        while True:
            text = self.screen()
            if check(text):
                return text
            if time.monotonic() > deadline:
                raise AssertionError(f"{what} did not show within {BOUND} s; the screen:\n{text}")
            time.sleep(0.1)

    def close(self) -> None:
        subprocess.run([*self.base, "kill-server"], capture_output=True, timeout=TIMEOUT)


def _need_tmux() -> None:
    if shutil.which("tmux") is None:
        if REQUIRE_REAL:
            pytest.fail("DISTLOCK_REQUIRE_REDIS=1 but tmux is not installed (apt-get install tmux)")
        pytest.skip("the real-terminal test needs tmux (apt-get install tmux)")


@pytest.mark.real_redis
@pytest.mark.parametrize("quit_key", ["C-c", "q"])
def test_live_view_in_a_real_terminal(url: str, backend: Any, client: redis.Redis[Any],
                                      tmp_path: Path, quit_key: str) -> None:
    _need_tmux()
    held = DistLock("term:held", client=client)
    waited = DistRLock("term:waited", client=client)
    assert held.acquire() and waited.acquire()
    other = backend.client()

    def wait() -> None:
        lock = DistRLock("term:waited", client=other)
        if lock.acquire(timeout=60):
            lock.release()

    waiter = threading.Thread(target=wait)
    waiter.start()
    command = (f"cd {shlex.quote(str(ROOT))} && {shlex.quote(sys.executable)} -m distlock top "
               f"--long 1 --url {shlex.quote(url)}; echo \"top exited with status $?\"; sleep 600")
    tmux = Tmux(tmp_path / "tmux.sock", command)
    try:
        screen = tmux.wait_for(lambda s: "term:held" in s and "term:waited" in s
                               and "DistRLock" in s and " 1 " in s.split("term:waited", 1)[1],
                               "the rows, with the waiter")
        lines = screen.splitlines()
        assert lines[0].startswith(f"distlock top - {url} - ") and "q or Ctrl-C quits" in lines[0]
        assert lines[2].split() == ["NAME", "KIND", "HOLDER", "AGE", "LEASE", "TOKEN", "WAITING",
                                    "OLDEST", "NOTE"]
        rows = [line.split() for line in lines[3:] if line.startswith("term:")]
        # the waited-on lock first (sorted by the oldest wait), then the other
        assert [row[0] for row in rows] == ["term:waited", "term:held"], screen
        assert rows[0][1:3] == ["DistRLock", HOLDER] and rows[0][5] == str(waited.token)
        assert rows[0][6] == "1" and rows[0][7] != "-"      # one waiting process, and for how long
        assert rows[1][1:3] == ["DistLock", HOLDER] and rows[1][6:8] == ["-", "-"]
        # it refreshes: the hold's age grows
        age = rows[1][3]
        tmux.wait_for(lambda s: any(line.startswith("term:held") and line.split()[3] != age
                                    for line in s.splitlines()), "a refresh")
        # --long 1: past a second, the hold's AGE is marked and its line in reverse video
        tmux.wait_for(lambda s: any(line.startswith("term:held") and line.split()[3].endswith("!")
                                    for line in s.splitlines()), "the --long mark")
        assert settle(lambda: "\x1b[7mterm:held" in tmux.run("capture-pane", "-p", "-e", "-t", "top"),
                      BOUND), tmux.run("capture-pane", "-p", "-e", "-t", "top")
        tmux.run("send-keys", "-t", "top", quit_key)
        after = tmux.wait_for(lambda s: "top exited with status" in s, "the exit")
        assert "top exited with status 0" in after
        assert "term:held" not in after  # the terminal's own screen is back
    finally:
        tmux.close()
        held.release()
        waited.release()
        waiter.join(BOUND)
        other.close()
