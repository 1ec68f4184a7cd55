"""DistEvent: threading.Event's contract, and what must hold across processes.

``EventContract`` runs against ``threading.Event`` itself (which proves the tests) and against
DistEvent; "as threading does" is checked by running the same call on a threading twin in the
same state. Timing is asserted only as generous bounds; every thread and process is joined (or
killed) with a bound.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Dict, List

import _sem_event_barrier_workers
import pytest
from _event_contract import EventContract, Waiters, _name, _registered  # noqa: F401 - the contract is collected here
from _procs import Children, recv
from _support import BOUND
from _support import distlock_keys as _keys
from _support import until as _until

import distlock
from distlock import DistEvent
from distlock._core.replies import EV_EXPIRED, EV_TAKEN
from distlock._session.session import session_for


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "type_id" in metafunc.fixturenames and metafunc.cls is not None:
        metafunc.parametrize("type_id", metafunc.cls.eventtypes)


# --- what only DistEvent does --------------------------------------------------------------------

def test_constructor_checks(client: Any) -> None:
    with pytest.raises(TypeError):
        DistEvent(1, client=client)
    with pytest.raises(ValueError):
        DistEvent("", client=client)
    with pytest.raises(TypeError):
        DistEvent("x", client=42)
    with pytest.raises(TypeError):
        DistEvent("x", client)
    assert DistEvent("x", client=client).name == "x"


def test_keys_while_set_and_after_clear(client: Any) -> None:
    event = DistEvent(_name(), client=client)
    assert event.wait(0.05) is False
    assert _keys(client) == []  # a waiter that timed out left
    event.set()
    assert _keys(client) == [event._keys.flag]
    assert client.ttl(event._keys.flag) == -1  # an Event is state: set stays set
    assert DistEvent(event.name, client=client).is_set() is True  # any object of the name
    event.clear()
    assert _keys(client) == []


def test_a_set_whose_hint_is_lost_still_wakes(client: Any) -> None:
    """The set() reaches Redis but its hint goes nowhere, and the event is cleared at once: the
    waiter, at its next look, finds its entry taken, and returns True."""
    distlock.configure(wait_cap=0.3)
    event = DistEvent(_name(), client=client)
    waiters = Waiters(event, 2)
    keys = event._keys
    _until(lambda: client.zcard(keys.waiters) == 2)
    session = session_for(client)
    assert session.run("ev_set", (keys.flag, keys.waiters, keys.channel + ":nowhere", keys.taken), ()) == 1
    event.clear()
    assert waiters.join() == [True, True]
    assert _keys(client) == []


def test_an_entry_that_ran_out_joins_again(client: Any) -> None:
    event = DistEvent(_name(), client=client)
    session = session_for(client)
    keys = (event._keys.flag, event._keys.waiters, event._keys.taken)
    deadline = int(session.run("ev_wait", keys, ("w1", "j", 50)))
    assert deadline > 0
    time.sleep(0.1)
    assert session.run("ev_wait", keys, ("w1", "p", 50, deadline)) == EV_EXPIRED
    deadline = int(session.run("ev_wait", keys, ("w1", "j", 5000)))
    event.set()
    event.clear()
    assert session.run("ev_wait", keys, ("w1", "p", 5000, deadline)) == EV_TAKEN
    assert _keys(client) == []


def test_set_at_the_timeout_counts(client: Any) -> None:
    """A set() whose hint is lost, landing before the waiter's last look: True."""
    event = DistEvent(_name(), client=client)
    box: Dict[str, Any] = {}
    thread = threading.Thread(target=lambda: box.setdefault("ok", event.wait(0.8)), daemon=True)
    thread.start()
    keys = event._keys
    _until(lambda: client.zcard(keys.waiters) == 1)
    session_for(client).run("ev_set", (keys.flag, keys.waiters, keys.channel + ":nowhere", keys.taken), ())
    event.clear()
    thread.join(BOUND)
    assert box == {"ok": True}


# --- across processes ---------------------------------------------------------------------------

@pytest.mark.real_redis
@pytest.mark.slow
def test_set_wakes_waiters_in_every_process(client: Any, url: str, children: Children) -> None:
    """Four processes wait; one set() wakes them all, and a set() cleared at once still does.
    A timed-out round: everyone returns False."""
    event = DistEvent(_name(), client=client)
    conns = [children.start(_sem_event_barrier_workers.event_waiter, url, event.name, 60.0) for _ in range(4)]
    for conn in conns:
        assert recv(conn)[0] == "ready"
    for pulse in (False, True):
        for conn in conns:
            conn.send("go")
            assert recv(conn) == ("waiting",)
        _until(lambda: client.zcard(event._keys.waiters) == 4)
        assert not any(conn.poll(0) for conn in conns)
        event.set()
        if pulse:
            event.clear()
        results = [recv(conn, BOUND)[0] for conn in conns]
        assert results == [True] * 4
        event.clear()
    # a waiter woken by the hint returns at once; its entry goes a moment later (deferred)
    _until(lambda: _keys(client) == [])


@pytest.mark.real_redis
@pytest.mark.slow
def test_waiters_in_processes_time_out(client: Any, url: str, children: Children) -> None:
    event = DistEvent(_name(), client=client)
    conns = [children.start(_sem_event_barrier_workers.event_waiter, url, event.name, 0.3) for _ in range(3)]
    for conn in conns:
        assert recv(conn)[0] == "ready"
    for conn in conns:
        conn.send("go")
    for conn in conns:
        assert recv(conn) == ("waiting",)
        assert recv(conn, BOUND)[0] is False
    _until(lambda: _keys(client) == [])


def test_clear_is_a_script_never_a_command_that_may_be_sent_again(
        client: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """clear() changes state, so it is one script through ``run`` (EVALSHA, never sent twice),
    not a DEL through ``read``, which the client retries after a connection error: a DEL sent
    again could wipe a set() another host made in between."""
    event = DistEvent(_name(), client=client)
    event.set()
    session = event._session()
    ran: List[str] = []
    run = session.run

    def spy(name: str, keys: Any, args: Any) -> Any:
        ran.append(name)
        return run(name, keys, args)

    def refuse(*command: Any) -> Any:
        raise AssertionError(f"clear() sent {command!r} through read()")

    monkeypatch.setattr(session, "run", spy)
    monkeypatch.setattr(session, "read", refuse)
    event.clear()
    event.clear()  # clear already: still fine
    monkeypatch.undo()
    assert ran == ["ev_clear", "ev_clear"]
    assert not client.exists(event._keys.flag)
    assert event.is_set() is False
    assert _keys(client) == []
