"""distlock.asyncio across processes, side by side with the blocking classes.

- Exclusion: processes whose tasks hold ``distlock.asyncio`` locks and processes whose threads
  hold ``distlock`` locks, all on one name, each hold a read-modify-write of a counter in
  Redis (GET, a pause, SET). A lost update, or two holders at once (a gauge raised inside the
  hold), would show.
- Wake-ups: a release in one process wakes a waiter of the other shell in another process, by
  pub/sub: the waiter's own polling is set far longer than the bound the test allows.

Child processes are spawned by the ``children`` fixture (tests/support/_procs.py) and run the code of
tests/support/_aio_workers.py (and tests/support/_workers.py for a blocking holder); they are joined, or
killed, after each test. Keys go with the fixture's FLUSHDB.
"""

from __future__ import annotations

import time
import uuid
from typing import Any, List, Tuple

import _aio_workers
import _workers
import faults
import pytest
from _aio_workers import Mailbox
from _procs import recv

pytestmark = pytest.mark.real_redis

#: per async process: tasks; per sync process: threads; per task or thread: holds
TASKS, THREADS, ROUNDS = 4, 3, 25
#: no worker goes on past this (seconds): a hang fails instead of stalling the suite
GIVE_UP = 90.0

#: (shell, kind) of each process, by mix; DistLock and DistRLock of one name are one lock
MIXES = {
    "DistLock": [("async", "DistLock"), ("async", "DistLock"), ("sync", "DistLock"),
                 ("sync", "DistLock")],
    "DistRLock": [("async", "DistRLock"), ("async", "DistRLock"), ("sync", "DistRLock"),
                  ("sync", "DistRLock")],
    "mixed": [("async", "DistLock"), ("async", "DistRLock"), ("sync", "DistLock"),
              ("sync", "DistRLock")],
}


def _unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def _rest(client: Any, name: str) -> List[bytes]:
    return sorted(client.scan_iter(match=f"distlock:{{{name}}}*"))


@pytest.mark.parametrize("mix", sorted(MIXES))
def test_async_and_sync_processes_never_lose_an_update(url: str, client: Any, children: Any,
                                                       mix: str) -> None:
    name, counter, gauge = _unique("aiop"), _unique("aiop-counter"), _unique("aiop-gauge")
    boxes: List[Tuple[str, Mailbox]] = []
    expected = 0
    for shell, kind in MIXES[mix]:
        reenter = kind == "DistRLock"
        if shell == "async":
            conn = children.start(_aio_workers.count_async, url, kind, name, counter, gauge, TASKS,
                                  ROUNDS, reenter, GIVE_UP)
            expected += TASKS * ROUNDS
        else:
            conn = children.start(_aio_workers.count_sync, url, kind, name, counter, gauge, THREADS,
                                  ROUNDS, reenter, GIVE_UP)
            expected += THREADS * ROUNDS
        boxes.append((f"{shell}-{kind}-{len(boxes)}", Mailbox(conn)))
    for _label, box in boxes:
        box.take("ready", 60)
    for _label, box in boxes:  # all start together, once every process has imported
        box.send("go")
    results = {label: box.take("done", GIVE_UP + 60) for label, box in boxes}

    errors = {label: r[3] for label, r in results.items() if r[3]}
    assert errors == {}, errors
    done = sum(r[1] for r in results.values())
    assert done == expected, {label: r[1] for label, r in results.items()}
    assert int(client.get(counter)) == done, "an update was lost: two holders at once"
    assert int(client.get(gauge + ":high")) == 1, "two holders were inside at once"
    assert int(client.get(gauge)) == 0
    tokens = [t for r in results.values() for t in r[2]]
    assert len(tokens) == done and all(t > 0 for t in tokens)
    assert len(set(tokens)) == len(tokens), "two holds shared a fencing token"
    for label, (_kind, _done, got, _errors) in results.items():
        if label.startswith("async"):  # one loop: its holds follow each other, in token order
            assert got == sorted(got), label
    # nothing left but the fencing counter (waiter registrations end with their last waiter)
    fence = f"distlock:{{{name}}}:fence".encode()
    assert faults.wait_until(lambda: _rest(client, name) == [fence], 10), _rest(client, name)


#: the waiter's polling bound (``wait_cap``) and the holder's lease, both far above the bound
#: on the wake-up below: only the release's pub/sub hint can wake the waiter that soon
WAITER_SETTINGS = {"wait_cap": 60.0}
HOLDER_LEASE = 120.0
WAKE_BOUND = 20.0


@pytest.mark.parametrize("holder_shell,waiter_shell",
                         [("sync", "async"), ("async", "sync"), ("async", "async")])
@pytest.mark.parametrize("kind", ["DistLock", "DistRLock"])
def test_release_wakes_a_waiter_of_the_other_shell_in_another_process(
        url: str, client: Any, children: Any, kind: str, holder_shell: str,
        waiter_shell: str) -> None:
    name = _unique("aiow")
    if holder_shell == "sync":
        holder_conn = children.start(_workers.hold_until_killed, url, kind, name, HOLDER_LEASE)
        token, _sent, _pid = recv(holder_conn)
    else:
        holder = Mailbox(children.start(_aio_workers.async_holder, url, kind, name, HOLDER_LEASE,
                                        None))
        _, token, _at, _pid, ok = holder.take("acquired", 60)
        assert ok is True
    assert isinstance(token, int) and token > 0
    target = _aio_workers.async_waiter if waiter_shell == "async" else _aio_workers.sync_waiter
    waiter = Mailbox(children.start(target, url, kind, name, 60.0, WAITER_SETTINGS))
    waiter.take("ready", 60)
    waiter.send("go")
    waiter.take("waiting")
    queue = f"distlock:{{{name}}}:q"
    # its try failed and registered its process: it sleeps on its channel now
    assert faults.wait_until(lambda: client.zcard(queue) >= 1, 20), "the waiter never queued"
    assert not waiter.has("got", 0.3), "the waiter got a lock that was held"

    released = time.monotonic()
    if holder_shell == "sync":
        holder_conn.send("release")
        assert recv(holder_conn) == ("released", False)
    else:
        holder.send(("release",))
        assert holder.take("release")[1] == "ok"
    _, ok, got_at, got_token = waiter.take("got", 90)
    assert ok is True
    assert got_token > token
    assert got_at - released < WAKE_BOUND, "not woken by the release (its polling bound is 60 s)"
    if holder_shell == "sync":
        holder_conn.send("exit")
    else:
        holder.send(("exit",))
    fence = f"distlock:{{{name}}}:fence".encode()
    assert faults.wait_until(lambda: _rest(client, name) == [fence], 10), _rest(client, name)
