"""Even shares for the default locks (the yield rule, ``distlock/_shares.py``): a process that
got the lock by waiting keeps it for a quantum without waking anyone, then yields it to the
longest-registered waiting process, for which the lock is kept a moment.

The scripts' part runs on real servers (``url``); ``Runs`` and ``configure`` need none.
"""

from __future__ import annotations

import math
import subprocess
import sys
import textwrap
import threading
import time
from typing import Any, Dict, List

import pytest
from _fair_workers import queue_threads
from _procs import recv
from _shares_workers import hog, share, take_once
from _support import BOUND, until
from _support import other_client as other

import distlock
import distlock.asyncio as adistlock
from distlock._core.settings import reset_settings
from distlock._core.shares import COMEBACK, MOST, NUDGE_AFTER, TURNS, Runs, quantum
from distlock._primitives.lock_reach import session_of
from distlock._redis.pubsub import wake_count, yield_turns


def keys(name: str) -> Dict[str, str]:
    tag = f"distlock:{{{name}}}"
    return {"lock": tag, "queue": tag + ":q"}


def commands(client: Any) -> Dict[str, int]:
    stats = client.info("commandstats")
    return {name.split("_", 1)[1]: int(v["calls"]) for name, v in stats.items()}


# --- Runs: no I/O ---------------------------------------------------------------------------

def test_a_quantum_is_the_limit_shared_by_the_processes_taking_turns() -> None:
    assert quantum(0.1, 4) == pytest.approx(0.025)
    assert quantum(0.1, 16) == pytest.approx(0.00625)
    assert quantum(0.1, 0) == pytest.approx(0.1 / TURNS)  # no count came with the grant
    runs = Runs()
    assert not runs.keeps("k", 0.0)  # never waited: it yields at once
    runs.start("k", 100.0, 0.025)
    assert not runs.keeps("k", 100.0)  # a first turn: yet to show that it loops
    runs.released("k", 100.001, False)
    runs.touch("k", 100.001 + COMEBACK / 2)  # came straight back: it loops
    runs.start("k", 100.1, 0.025)
    assert runs.keeps("k", 100.1249) and not runs.keeps("k", 100.1251)
    runs.released("k", 100.2, True)
    runs.touch("k", 100.2 + COMEBACK * 2)  # came back late: its next turn yields at once
    runs.start("k", 100.3, 0.025)
    assert not runs.keeps("k", 100.3)


@pytest.mark.parametrize("hint, turns, wakes", [("y4", 4, 1), ("y1", 1, 1), ("y0", 1, 1), ("1", 0, 1),
                                                ("3", 0, 3), ("*", 0, None), ("yx", 0, 1)])
def test_a_yield_hint_wakes_one_waiter_and_counts_the_turns(hint: str, turns: int, wakes: Any) -> None:
    assert yield_turns(hint) == turns and wake_count(hint) == wakes


def test_a_nudge_is_due_only_when_the_process_did_not_try_again() -> None:
    runs = Runs()
    assert not runs.released("k", 0.0, True)  # no turn of its own: nothing to do
    runs.start("k", 0.0, 1.0)
    assert not runs.released("k", 0.05, False)  # a yield woke someone already
    assert runs.released("k", 0.1, True)  # schedule one
    assert not runs.released("k", 0.1005, True)  # one is pending: no second
    assert runs.nudge("k", 0.1 + NUDGE_AFTER) == pytest.approx(0.1005 + NUDGE_AFTER)  # later
    assert runs.nudge("k", 0.1005 + NUDGE_AFTER) == 0.0  # due: wake someone now
    assert runs.released("k", 0.2, True)
    runs.touch("k", 0.2001)  # tried to take it again: nothing to do
    assert runs.nudge("k", 0.2 + NUDGE_AFTER) is None
    assert Runs().nudge("k", 1.0) is None


def test_runs_stay_small_whatever_the_number_of_names() -> None:
    runs = Runs()
    for i in range(5000):
        runs.start(f"k{i}", float(i) * 2, 0.1)
    assert len(runs) <= 256
    assert runs.released("k4999", 9998.05, True)  # the latest is kept


def test_a_full_table_keeps_the_run_whose_nudge_is_pending() -> None:
    """Making room for a new name forgets what it must, never a run whose nudge is scheduled:
    that nudge would find nothing, and the next process would sleep out its bound."""
    runs = Runs()
    runs.start("kept", 0.0, 1.0)
    assert runs.released("kept", 0.1, True)  # a nudge is scheduled for it
    for i in range(MOST):  # a full table of names whose quanta are not long past
        runs.start(f"k{i}", 0.5, 1.0)
    assert runs.nudge("kept", 0.1 + NUDGE_AFTER) == 0.0  # not None: it wakes the next one
    assert len(runs) <= MOST


def test_two_threads_making_room_at_once_do_not_trip_over_each_other() -> None:
    """Two threads granted new names of a full table at once (start is the one method that
    changes the table): the second waits for the first, instead of changing the table under
    its walk (RuntimeError: dictionary changed size during iteration, out of an acquire that
    took the lock)."""
    runs = Runs()
    for i in range(MOST - 1):
        runs.start(f"k{i}", 0.0, 1.0)
    other = threading.Thread(target=runs.start, args=("other", 10.0, 1.0))

    class Midway:
        """A run whose 'end' hands over to the other thread while the table is walked."""
        pending = False

        @property
        def end(self) -> float:
            if not other.is_alive() and other.ident is None:
                other.start()
                other.join(0.5)  # it changes the table now, unless it has to wait its turn
            return 0.0

    runs._runs["midway"] = Midway()  # type: ignore[assignment]
    runs.start("mine", 10.0, 1.0)
    other.join(BOUND)
    assert not other.is_alive()
    assert "other" in runs._runs and "mine" in runs._runs


# --- configure --------------------------------------------------------------------------------

@pytest.mark.parametrize("value", [0, 0.0, 0.25, 3, math.inf])
def test_barge_limit_takes_zero_or_more_seconds(value: Any) -> None:
    try:
        assert distlock.configure(barge_limit=value).barge_limit == float(value)
    finally:
        reset_settings()


@pytest.mark.parametrize("bad, error, match", [
    ("0.1", TypeError, "^barge_limit must be a number of seconds, not str$"),
    (True, TypeError, "^barge_limit must be a number of seconds, not bool$"),
    (-0.001, ValueError, r"^barge_limit must be zero or more seconds \(math.inf: never\)$"),
    (math.nan, ValueError, r"^barge_limit must be zero or more seconds \(math.inf: never\)$"),
])
def test_barge_limit_bad_values(bad: Any, error: type, match: str) -> None:
    before = distlock.configure()
    with pytest.raises(error, match=match):
        distlock.configure(barge_limit=bad)
    assert distlock.configure() == before


# --- the scripts --------------------------------------------------------------------------------

def run(lock: Any, script: str, keys_: tuple, args: tuple) -> Any:
    """One script through ``lock``'s session, as its own calls send it."""
    return session_of(lock).run(script, keys_, args)


def register(client: Any, k: Dict[str, str], channel: str) -> None:
    """A process waiting for the lock, as its failed try registers it (and flags the hold)."""
    client.zadd(k["queue"], {channel: int(time.time() * 1000) + 60_000})
    client.hset(k["lock"], ":w", 1)


@pytest.mark.real_redis
@pytest.mark.cluster_too
def test_a_yielding_release_keeps_the_lock_for_the_longest_registered_process(url: str,
                                                                             client: Any) -> None:
    name = "yield"
    k = keys(name)
    lock = distlock.DistLock(name, client=other(url))
    acquire_keys = lock._acquire_keys
    first, second = f"{k['lock']}:wake:aaa", f"{k['lock']}:wake:bbb"
    assert lock.acquire()
    register(client, k, first)
    register(client, k, second)
    watcher = client.pubsub() if not url.startswith("redis+cluster://") else None
    hold = session_of(lock).holds[(k["lock"], next(iter(session_of(lock).holds))[1])]
    assert run(lock, "lock_release", (k["lock"], k["queue"]), (hold.owner, hold.token, 1, "y")) == 0
    session_of(lock).drop_hold(hold)
    # kept for the first registered process, a moment, and it is off the registry
    assert client.hgetall(k["lock"]) == {b":r": first.encode(), b":w": b"1"}
    assert 0 < client.pttl(k["lock"]) <= 250
    # The rest looks at what the kept lock does, not at how long it is kept: the moment is
    # made 30 s, so that a loaded machine (a new cluster client below takes a while) does not
    # see it run out.
    client.pexpire(k["lock"], 30_000)
    assert client.zrange(k["queue"], 0, -1) == [second.encode()]
    # a first try, and a waiter of another process, are refused as if it were held
    assert not distlock.DistLock(name, client=other(url)).acquire(blocking=False)
    owner = "someone:1"
    args = (owner, 10_000, 20_000, "h:1", "p", 1)
    refused = run(lock, "lock_acquire", acquire_keys, args + (second, 60_000, "0"))
    assert -30_001 <= refused < 0
    # the process it is kept for takes it, whole: no ':r', no ':s' left
    token = run(lock, "lock_acquire", acquire_keys, args + (first, 60_000, "0"))
    assert token > 0
    fields = client.hgetall(k["lock"])
    assert fields[owner.encode()] == b"1" and b":r" not in fields and b":s" not in fields
    assert fields[b":w"] == b"1"  # another process waits: its release wakes it
    assert run(lock, "lock_release", (k["lock"], k["queue"]), (owner, token)) == 0
    if watcher is not None:
        watcher.close()


@pytest.mark.real_redis
def test_a_release_in_a_quantum_wakes_nobody(url: str, client: Any) -> None:
    name = "keep"
    k = keys(name)
    lock = distlock.DistLock(name, client=other(url))
    channel = f"{k['lock']}:wake:aaa"
    assert lock.acquire()
    register(client, k, channel)
    hold = next(iter(session_of(lock).holds.values()))
    before = commands(client).get("publish", 0)
    assert run(lock, "lock_release", (k["lock"], k["queue"]), (hold.owner, hold.token, 1, "k")) == 0
    session_of(lock).drop_hold(hold)
    assert commands(client).get("publish", 0) == before
    assert client.exists(k["lock"]) == 0 and client.zrange(k["queue"], 0, -1) == [channel.encode()]
    # ...and the nudge wakes it while the lock is free, not while it is held
    assert lock.acquire()
    assert run(lock, "lock_nudge", (k["lock"], k["queue"]), ()) == 0
    lock.release()  # (this process never waited: it yields, to the registered one)
    client.delete(k["lock"])
    register(client, k, channel)
    client.delete(k["lock"])
    assert run(lock, "lock_nudge", (k["lock"], k["queue"]), ()) == 1
    assert client.exists(k["queue"]) == 0


@pytest.mark.real_redis
def test_a_process_that_stops_waiting_gives_up_the_lock_kept_for_it(url: str, client: Any) -> None:
    name = "unwait"
    k = keys(name)
    lock = distlock.DistLock(name, client=other(url))
    mine, next_ = f"{k['lock']}:wake:aaa", f"{k['lock']}:wake:bbb"
    client.hset(k["lock"], mapping={":r": mine, ":w": 1})
    # free_hold keeps it 250 ms; here 60 s, so that the first look cannot find it gone by its
    # TTL on a loaded machine (it did, in a run of three suites at once)
    client.pexpire(k["lock"], 60_000)
    client.zadd(k["queue"], {next_: int(time.time() * 1000) + 60_000})
    assert run(lock, "lock_unwait", (k["queue"], k["lock"]), (next_ + "x",)) == 0
    assert client.exists(k["lock"]) == 1  # kept for someone else: untouched
    assert run(lock, "lock_unwait", (k["queue"], k["lock"]), (mine,)) == 0
    assert client.exists(k["lock"]) == 0  # free, and the next waiting process was woken
    assert client.exists(k["queue"]) == 0


# --- across processes -----------------------------------------------------------------------

@pytest.mark.real_redis
@pytest.mark.parametrize("kind", ["DistLock", "DistRLock"])
def test_a_waiter_gets_the_lock_from_a_process_that_keeps_taking_it(url: str, client: Any,
                                                                    children: Any, kind: str) -> None:
    """A process takes and releases the lock back to back; a waiter in another process gets
    it while that loop still runs (the loop is bounded, and is told to stop after)."""
    name = f"hog-{kind}"
    conn = children.start(hog, url, name, kind, 200_000, 60.0)
    assert recv(conn, 60) == "started"
    lock = getattr(distlock, kind)(name, client=other(url))
    assert lock.acquire(timeout=60)
    lock.release()
    conn.send("stop")
    ops, stopped = recv(conn, 90)
    assert stopped, f"the loop ended by its bound ({ops} operations) before the waiter got the lock"


@pytest.mark.real_redis
@pytest.mark.parametrize("kind", ["DistLock", "DistRLock"])
def test_processes_share_the_lock_and_exclude_each_other(url: str, client: Any, children: Any,
                                                         kind: str) -> None:
    """Four processes increment one counter (GET then SET) under the lock until it reaches a
    total: no update is lost, and every process gets a share. The share bound is loose (a
    quarter of the mean) so that a slow machine cannot fail it; the benchmark measures it."""
    name, counter, total = f"share-{kind}", f"test:shares:{kind}", 1200
    conns = [children.start(share, url, name, kind, counter, total) for _ in range(4)]
    for conn in conns:
        assert recv(conn, 60) == "ready"
    for conn in conns:
        conn.send("go")
    mine = [recv(conn, 240) for conn in conns]
    assert sum(mine) == total == int(client.get(counter))
    assert min(mine) >= 0.25 * total / 4, mine


@pytest.mark.real_redis
@pytest.mark.parametrize("kind, fair", [("DistLock", False), ("DistRLock", False), ("DistLock", True)])
def test_commands_per_hand_off_stay_flat(url: str, client: Any, children: Any, kind: str,
                                         fair: bool) -> None:
    """No herd: each hand-off publishes to one process, and costs the same few commands
    whether 1, 10 or 50 processes wait (their bounded re-checks set far apart here), for the
    default and the fair locks. Counted on the server (INFO commandstats, which counts the
    commands scripts run too)."""
    figures = {}
    for round_, processes in enumerate([1, 10, 50]):
        name = f"herd-{kind}-{fair}-{round_}"
        line = f"distlock:{{{name}}}" + (":fq" if fair else ":q")  # one entry per wait / process
        holder = getattr(distlock, kind)(name, client=other(url), fair=fair)
        assert holder.acquire()
        if fair:
            conns = [children.start(queue_threads, url, name, kind, 1, "", 60.0) for _ in range(processes)]
        else:
            conns = [children.start(take_once, url, name, kind, 1, 60.0) for _ in range(processes)]
        for conn in conns:
            assert recv(conn, 120) == "started"
        until(lambda line=line, n=processes: client.zcard(line) >= n, bound=120,
              what=f"{processes} waiting processes")
        time.sleep(0.5)  # the first tries' dust settles
        before = commands(client)
        holder.release()
        assert sum(recv(conn, 180) for conn in conns) == processes
        time.sleep(0.6)  # the last unsubscribes
        after = commands(client)
        delta = {cmd: after.get(cmd, 0) - before.get(cmd, 0) for cmd in after}
        delta.pop("info", None)
        # one PUBLISH per hand-off, to one process (and one wake-up when the line empties)
        assert processes <= delta.get("publish", 0) <= processes + 1, delta
        figures[processes] = (sum(delta.values()) / processes, delta.get("evalsha", 0) / processes)
        for conn in conns:
            conn.close()
    print(f"{kind} fair={fair}: commands per hand-off (all, EVALSHA) by waiting processes:",
          {n: (round(a, 1), round(e, 1)) for n, (a, e) in figures.items()})
    # a herd would grow with the waiting processes: every woken one would try
    assert figures[50][1] <= figures[1][1] + 0.5 and figures[10][1] <= figures[1][1] + 0.5
    assert figures[50][0] <= figures[1][0] * 1.25 and figures[10][0] <= figures[1][0] * 1.25


@pytest.mark.real_redis
@pytest.mark.parametrize("kind", ["DistLock", "DistRLock"])
def test_an_asyncio_waiter_gets_its_turn_too(url: str, client: Any, children: Any, aio: Any,
                                             kind: str) -> None:
    """The rule is the engine's, so a task waiting in the asyncio shell gets its turn from a
    process that keeps taking the lock, as a thread does."""
    name = f"ahog-{kind}"
    conn = children.start(hog, url, name, kind, 200_000, 60.0)
    assert recv(conn, 60) == "started"

    async def turn() -> bool:
        lock = getattr(adistlock, kind)(name, client=url)
        got = await lock.acquire(timeout=60)
        if got:
            await lock.release()
        return bool(got)

    assert aio.run(turn(), bound=90)
    conn.send("stop")
    ops, stopped = recv(conn, 90)
    assert stopped, f"the loop ended by its bound ({ops} operations) before the task got the lock"


@pytest.mark.real_redis
def test_with_no_limit_a_release_never_yields(url: str, client: Any) -> None:
    distlock.configure(barge_limit=math.inf)
    name = "nolimit"
    k = keys(name)
    lock = distlock.DistLock(name, client=other(url))
    assert lock.acquire()
    register(client, k, f"{k['lock']}:wake:aaa")
    lock.release()
    assert client.exists(k["lock"]) == 0  # freed, not kept for the waiter (who was woken)
    assert client.exists(k["queue"]) == 0


# --- interpreter exit -------------------------------------------------------------------------

_EXITING_IN_A_QUANTUM = textwrap.dedent("""
    import sys, time, redis
    import distlock
    from distlock._core import shares
    from distlock._primitives import lock_wait
    from distlock._primitives.lock_reach import session_of
    # no nudge comes due while the process lives: only its exit can send one
    shares.NUDGE_AFTER = lock_wait.NUDGE_AFTER = 600.0
    distlock.configure(lease=600.0)  # the waiter's bound is its wait cap, not this lease
    kind, how = sys.argv[2], sys.argv[3]
    lock = getattr(distlock, kind)("exit-nudge", client=redis.Redis.from_url(sys.argv[1]))
    assert lock.acquire()
    # in its quantum, as a process is that got the lock by waiting and loops (_core.shares)
    runs, key, now = session_of(lock).runs, lock._keys.lock, time.monotonic()
    runs.start(key, now, 0.0)
    runs.released(key, now, False)
    runs.touch(key, now)
    runs.start(key, now, 3600.0)
    assert runs.keeps(key, time.monotonic())
    print("held", flush=True)
    sys.stdin.readline()  # another process waits now
    if how == "release":
        lock.release()  # kept: it wakes nobody, and its nudge is not due before the exit
    # else the interpreter exits holding it: release_at_exit gives it back, in the quantum
""")


@pytest.mark.real_redis
@pytest.mark.parametrize("kind, how", [("DistRLock", "held"), ("DistRLock", "release"),
                                       ("DistLock", "release")])
def test_a_release_in_a_quantum_at_exit_still_wakes_the_next_process(
        url: str, client: Any, kind: str, how: str) -> None:
    """A process that releases in its quantum wakes nobody and leaves the next waiter to its
    nudge. If it exits first (giving the lock back at exit, or having just released it), the
    exit sends that nudge: the waiter of another process is woken at once, long before its
    bound (a wait cap of 120 s here; its timeout of 40 s would end it first)."""
    distlock.configure(wait_cap=120.0)
    k = keys("exit-nudge")
    proc = subprocess.Popen([sys.executable, "-c", _EXITING_IN_A_QUANTUM, url, kind, how],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    got: List[bool] = []
    waiter = getattr(distlock, kind)("exit-nudge", client=other(url))

    def wait() -> None:
        got.append(waiter.acquire(timeout=BOUND * 2))
        if got[0]:
            waiter.release()
    thread = threading.Thread(target=wait)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
        thread.start()
        until(lambda: client.zcard(k["queue"]) == 1, what="the waiter registered")
        _, err = proc.communicate("go\n", timeout=BOUND)
        assert proc.returncode == 0, err
        thread.join(BOUND)
        assert got == [True], "the waiter was not woken: it sleeps out its bound"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        if thread.is_alive():
            thread.join(BOUND * 2)
