"""DistElection, blocking shell (docs/guides/elections.rst): one leader at a time, its epoch
the fencing token, its value readable by anyone, each change of leader observed.

A leadership is the exclusive hold of the name, so the lock's own tests cover its wait,
renewal and belief; these check what the election adds, on one server, a cluster and
Sentinel, and exclusion across processes.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
import uuid
from typing import Any, List, Optional

import pytest
from _election_workers import lead_in_turns
from _procs import recv
from _support import distlock_keys, until

import distlock
from distlock import DistElection, DistLock, Leader, LockLostError, LockNotOwnedError

pytestmark = [pytest.mark.real_redis, pytest.mark.cluster_too, pytest.mark.sentinel_too]


def _name() -> str:
    return f"elect:{uuid.uuid4().hex[:10]}"


def test_a_campaign_leads_with_its_value_and_an_epoch_that_resign_gives_up(client: Any) -> None:
    name = _name()
    election, onlooker = DistElection(name, client=client), DistElection(name, client=client)
    assert onlooker.leader() is None and not election.is_leader() and election.valid_for() == 0.0
    leadership = election.campaign("host-a | 1", timeout=10)
    assert election.is_leader() and leadership.is_leader() and 0 < leadership.valid_for() <= 30
    seen = onlooker.leader()
    assert isinstance(seen, Leader)
    assert (seen.value, seen.epoch, seen.pid) == ("host-a | 1", leadership.epoch, os.getpid())
    assert 0 < seen.ttl <= 30 and leadership.name == name and "leading" in repr(leadership)
    leadership.resign()
    assert not election.is_leader() and not leadership.is_leader()
    assert onlooker.leader() is None
    assert [k for k in distlock_keys(client) if name in k and not k.endswith(":fence")] == []


def test_the_next_candidate_wins_at_the_resignation_with_a_greater_epoch(client: Any) -> None:
    name = _name()
    first, second = DistElection(name, client=client), DistElection(name, client=client)
    won: List[Any] = []
    lead = first.campaign("a")
    waiter = threading.Thread(target=lambda: won.append(second.campaign("b", timeout=30)))
    waiter.start()
    time.sleep(0.2)
    assert not won  # it waits while "a" leads
    lead.resign()
    waiter.join(30)
    assert won and won[0].epoch > lead.epoch and second.is_leader()
    assert first.leader()[:2] == ("b", won[0].epoch)
    won[0].resign()


def test_a_campaign_times_out_while_another_leads(client: Any) -> None:
    name = _name()
    leader, other = DistElection(name, client=client), DistElection(name, client=client)
    with leader.campaign("a"):
        with pytest.raises(TimeoutError):
            other.campaign("b", timeout=0)
        with pytest.raises(TimeoutError):
            other.campaign("b", timeout=0.1)
        assert not other.is_leader()
    assert leader.leader() is None  # the with block resigned
    assert other.campaign("b", timeout=0).is_leader()
    other.resign()


def test_a_lock_of_the_same_name_is_the_leader_while_held(client: Any) -> None:
    """A name is one lock: the lock and the election of a name exclude each other."""
    name = _name()
    lock, election = DistLock(name, client=client), DistElection(name, client=client)
    with lock:
        with pytest.raises(TimeoutError):
            election.campaign("a", timeout=0)
        assert election.leader()[:2] == ("", lock.token)
    with election.campaign("a"):
        assert not lock.acquire(blocking=False)


def test_observe_yields_the_leader_then_each_change(client: Any) -> None:
    name = _name()
    watcher, a, b = (DistElection(name, client=client) for _ in range(3))
    seen: List[Optional[Leader]] = []

    def watch() -> None:
        for leader in watcher.observe(timeout=20):
            seen.append(leader)
            if len(seen) == 4:
                return

    thread = threading.Thread(target=watch)
    thread.start()
    until(lambda: len(seen) == 1, what="the first look")
    lead_a = a.campaign("a")
    until(lambda: len(seen) == 2, what="a's leadership observed")
    lead_a.resign()
    until(lambda: len(seen) == 3, what="a's resignation observed")
    lead_b = b.campaign("b")
    thread.join(30)
    lead_b.resign()
    assert seen[0] is None and seen[2] is None
    assert (seen[1].value, seen[1].epoch) == ("a", lead_a.epoch)
    assert (seen[3].value, seen[3].epoch) == ("b", lead_b.epoch)


def test_observe_ends_after_its_timeout_without_a_change(client: Any) -> None:
    watcher = DistElection(_name(), client=client)
    assert list(watcher.observe(timeout=0.2)) == [None]


def test_a_lost_leadership_is_revoked_and_no_longer_believed(client: Any) -> None:
    name = _name()
    election = DistElection(name, client=client, lease=0.3)
    revoked: List[Any] = []
    election.on_revoked(revoked.append)
    leadership = election.campaign("a")
    until(lambda: revoked == [election], what="on_revoked")
    assert not election.is_leader() and not leadership.is_leader() and leadership.valid_for() == 0.0
    with pytest.raises(LockLostError):
        leadership.resign()
    again = election.campaign("a", timeout=10)  # a lost leadership needs no resign first
    assert again.epoch > leadership.epoch
    with pytest.raises(LockNotOwnedError):
        leadership.resign()  # an ended leadership, not the current one
    with contextlib.suppress(LockLostError):  # its lease is short: it may be over already
        again.resign()


def test_campaign_again_after_a_revocation_without_resigning(client: Any) -> None:
    election = DistElection(_name(), client=client, lease=0.3)
    first = election.campaign("a")
    until(lambda: not election.is_leader(), what="the lease to run out")
    second = election.campaign("b", timeout=10)
    assert second.epoch > first.epoch
    with contextlib.suppress(LockLostError):  # its lease is short: it may be over already
        second.resign()


def test_bound_runs_the_block_as_the_leader_and_resigns(client: Any) -> None:
    name = _name()
    election, onlooker = DistElection(name, client=client), DistElection(name, client=client)
    if distlock._primitives.bound.UNSAFE:
        with pytest.raises(RuntimeError):
            election.bound("a").__enter__()
        return
    with election.bound("a", timeout=5) as scope:
        assert election.is_leader()
        assert onlooker.leader()[:2] == ("a", scope.token)
    assert onlooker.leader() is None


@pytest.mark.server_only
def test_candidates_in_other_processes_never_lead_at_once(url: str, children: Any) -> None:
    name, rounds = _name(), 4
    conns = [children.start(lead_in_turns, url, name, rounds) for _ in range(3)]
    for conn in conns:
        assert recv(conn) == "ready"
    for conn in conns:
        conn.send("go")
    terms = sorted(term for conn in conns for term in recv(conn, 120))
    assert len(terms) == 3 * rounds
    for (epoch, _began, ended), (next_epoch, next_began, _) in zip(terms, terms[1:]):
        assert next_epoch > epoch
        assert next_began >= ended, "two leaders at once"  # sorted by epoch: in turn, in time


@pytest.mark.server_only
def test_bad_input_gets_the_right_error(client: Any, redlock_clients: Any) -> None:
    election = DistElection(_name(), client=client)
    with pytest.raises(TypeError):
        election.campaign(42)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        election.campaign("x" * 1025)
    with pytest.raises(ValueError):
        election.campaign("a", timeout=-1)
    with pytest.raises(ValueError):
        election.campaign("a", timeout=float("nan"))
    with pytest.raises(TypeError):
        election.campaign("a", timeout="1")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        DistElection(3, client=client)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        DistElection("", client=client)
    with pytest.raises(TypeError, match="Redlock"):
        DistElection("x", client=redlock_clients)
    with pytest.raises(LockNotOwnedError):
        election.resign()
    with pytest.raises(ValueError):
        list(election.observe(timeout=-1))
    with election.campaign("a"):
        with pytest.raises(RuntimeError, match="already"):
            election.campaign("a")
