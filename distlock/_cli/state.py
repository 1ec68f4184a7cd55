"""``distlock status``, ``list``, ``release`` and ``top``: the commands that look at what is held
(and ``release --force``, which breaks a hold), and the reads of lock state they share.

``fetch_states`` reads every primitive held under some names in one pipelined round trip per
server (each with that server's TIME) and hands the replies to ``inspect``, which parses them
without I/O; ``list_names`` SCANs (never KEYS) every server for the names held. On a cluster
both read each name on its slot's master and read again when the slot map changed under them
(``servers.routed``). ``distlock run`` uses them too, to say who holds a lock it could not take.
"""

from __future__ import annotations

import argparse
import json
from typing import Any, List, Sequence

from .._core.keys import BarrierKeys, EventKeys, Keys, SemKeys
from .._core.settings import settings
from .._session.session import session_for
from .connect import client_for
from .exits import EXIT_REFUSED, EXIT_WRONG_KIND, err
from .inspect import (
    LockState,
    Owner,
    barrier_state,
    event_state,
    exclusive_state,
    free_state,
    name_from_key,
    rw_state,
    scan_pattern,
    semaphore_state,
)
from .servers import by_server, execute, routed, scan_keys, servers, time_ms

__all__ = ["fetch_states", "list_names", "describe", "holder_summary", "cmd_status", "cmd_list",
           "cmd_release"]


def _rw_keys(name: str) -> Any:
    """The read/write lock's keys of ``name``, or None when this version has no such lock."""
    try:
        from .._core.keys import RWKeys
    except ImportError:
        return None
    return RWKeys.of(settings().prefix, name)


def fetch_states(client: Any, names: Sequence[str]) -> List[LockState]:
    """Every primitive held under each name (or one ``free`` state): one round trip per server
    that holds one of the names (one server; on a cluster, the masters of their slots), with
    that server's TIME."""
    return routed(client, lambda: _fetch_states(client, names))


def _fetch_states(client: Any, names: Sequence[str]) -> List[LockState]:
    prefix = settings().prefix
    found: List[List[LockState]] = [[] for _ in names]
    for server, indexes in by_server(client, [Keys(prefix, name).lock for name in names]):
        pipe = server.pipeline(transaction=False)
        pipe.time()
        for i in indexes:
            _queue_state_reads(pipe, prefix, names[i])
        replies = execute(pipe)
        now_ms = time_ms(replies[0])
        at = 1
        for i in indexes:
            found[i], at = _read_states(prefix, names[i], replies, at, now_ms)
    return [state for states in found for state in states]


def _queue_state_reads(pipe: Any, prefix: str, name: str) -> None:
    k = Keys(prefix, name)
    pipe.type(k.lock)
    pipe.hgetall(k.lock)
    pipe.pttl(k.lock)
    pipe.get(k.fence)
    rw = _rw_keys(name)
    if rw is not None:
        pipe.type(rw.writer)
        pipe.hgetall(rw.writer)
        pipe.pttl(rw.writer)
        pipe.zrange(rw.readers, 0, -1, withscores=True)
        pipe.zrange(rw.queue, 0, -1, withscores=True)
    sem, ev, bar = SemKeys.of(prefix, name), EventKeys.of(prefix, name), BarrierKeys.of(prefix, name)
    pipe.zrange(sem.sem, 0, -1, withscores=True)
    pipe.pttl(sem.sem)
    pipe.zcard(sem.queue)
    pipe.exists(ev.flag)
    pipe.zcard(ev.waiters)
    pipe.hmget(bar.state, "p", "b")
    pipe.zcard(bar.waiters)


def _read_states(prefix: str, name: str, replies: List[Any], at: int,
                 now_ms: int) -> tuple[List[LockState], int]:
    """The states of ``name`` from ``replies[at:]``, queued by ``_queue_state_reads``; and
    where the next name's replies begin."""
    k = Keys(prefix, name)
    key_type, fields, pttl, fence = replies[at:at + 4]
    at += 4
    found = [exclusive_state(name, k.lock, key_type, fields, pttl, fence)]
    rw = _rw_keys(name)
    if rw is not None:
        w_type, w_fields, w_pttl, readers, queue = replies[at:at + 5]
        at += 5
        found.append(rw_state(name, rw.writer, writer_type=w_type, writer_fields=w_fields,
                              writer_pttl=w_pttl, readers=readers, queue=queue,
                              now_ms=now_ms, fence=fence))
    members, sem_pttl, sem_waiting, is_set, ev_waiting, bar_fields, bar_waiting = replies[at:at + 7]
    at += 7
    found.append(semaphore_state(name, SemKeys.of(prefix, name).sem, members, sem_pttl,
                                 waiting=sem_waiting, now_ms=now_ms, fence=fence))
    found.append(event_state(name, EventKeys.of(prefix, name).flag, bool(is_set),
                             waiting=ev_waiting, fence=fence))
    found.append(barrier_state(name, BarrierKeys.of(prefix, name).state, bar_fields or (),
                               waiting=bar_waiting, fence=fence))
    held = [state for state in found if state is not None]
    return held or [free_state(name, k.lock, fence)], at


#: the kinds ``status`` shows that are not locks: ``release --force`` leaves them alone
NOT_LOCKS = ("DistSemaphore", "DistEvent", "DistBarrier")

#: what a person reads for each metadata field of a lock's hash that ``status`` shows
FIELD_WORDS = {
    ":w": ("waiting", "a process is registered as waiting: the release wakes one"),
    ":r": ("kept for", "a waiting process (the lock is being handed to it)"),
}


def _field_line(key: str, value: str) -> str:
    if key in FIELD_WORDS:
        label, meaning = FIELD_WORDS[key]
        return f"  {label}: {meaning}"
    if key.startswith(":h"):  # a waiting process' hand-off record (lock_acquire)
        session = key.rpartition(":")[2]  # of its wake-up channel, ...:wake:<session id>
        return f"  hand-off record: a yield may hand the lock to a waiter of session {session}"
    if key.startswith(":"):
        return f"  field {key!r} (not known to this version of distlock) = {value}"
    return f"  {key}: {value}"


def _who(o: Owner) -> str:
    if o.mode == "permit":  # its id: <session>:<thread>:<n>
        thread = f" thread {o.thread}" if o.thread is not None else ""
        return f"session {o.session}{thread}, permit {o.owner.rpartition(':')[2].partition('@')[0]}"
    who = f"thread {o.thread}" if o.thread is not None else f"hold {o.hold_id}"
    where = f"{o.host} pid {o.pid}" if o.host is not None else "host not recorded"
    mode = "" if o.mode == "exclusive" else f"{o.mode} "
    holder = f", holder {o.holder!r}" if o.holder else ""
    return f"{mode}session {o.session} {who} on {where}{holder}"


def describe(state: LockState) -> List[str]:
    """Human-readable lines for one state."""
    if state.kind == "free":
        last = f"last token {state.token}" if state.token is not None else "never granted"
        return [f"{state.name}: free ({last})"]
    lease = "no expiry" if state.lease_ms is None else f"lease {state.lease_ms / 1000:.1f} s left"
    if state.kind in NOT_LOCKS:
        what = "held" if state.kind == "DistSemaphore" and state.held else "in use"
        head = f"{state.name}: {what}, {state.kind}"
        if state.kind == "DistSemaphore" and state.held:
            head += f", {lease}"
        lines = [head]
    else:
        lines = [f"{state.name}: held, {state.kind}, token {state.token}, count {state.count}, {lease}"]
    for o in state.owners:
        extra = "" if o.token is None else f", token {o.token}"
        if o.lease_ms is not None:
            extra += f", lease {o.lease_ms / 1000:.1f} s left"
        count = "" if o.mode == "permit" else f", count {o.count}"
        lines.append(f"  owner {_who(o)}{count}{extra}")
    if state.waiting_writers:
        lines.append(f"  {state.waiting_writers} writer(s) waiting")
    for key, value in state.extra.items():
        lines.append(_field_line(key, value))
    return lines


def _print_states(states: Sequence[LockState], as_json: bool) -> None:
    if as_json:
        print(json.dumps([s.to_json() for s in states], indent=2, sort_keys=True))
        return
    for state in states:
        for line in describe(state):
            print(line)


def cmd_status(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    client = client_for(args.url, parser)
    _print_states(fetch_states(client, args.names), args.json)
    return 0


def _held_suffixes() -> List[str]:
    """The key suffixes (after ``}``) that exist only while something holds the name, waits on
    it or keeps its state at rest (a set event, a broken barrier): every kind's."""
    prefix = settings().prefix
    tag = Keys(prefix, "x").tag
    suffixes = [Keys(prefix, "x").lock[len(tag):]]
    rw = _rw_keys("x")
    if rw is not None:
        suffixes += [rw.writer[len(tag):], rw.readers[len(tag):]]
    sem, ev, bar = SemKeys.of(prefix, "x"), EventKeys.of(prefix, "x"), BarrierKeys.of(prefix, "x")
    suffixes += [key[len(tag):] for key in (sem.sem, sem.queue, ev.flag, ev.waiters, bar.state,
                                              bar.waiters)]
    return suffixes


def list_names(client: Any, pattern: str) -> List[str]:
    """Names whose hold keys exist and match ``pattern``, found with SCAN (never KEYS) on
    every server: the one, or every master of a cluster."""
    return routed(client, lambda: _list_names(client, pattern))


def _list_names(client: Any, pattern: str) -> List[str]:
    prefix = settings().prefix
    suffixes = _held_suffixes()
    match = scan_pattern(prefix, pattern)
    found = set()
    for server in servers(client):
        for key in scan_keys(server, match):
            name = name_from_key(prefix, key, suffixes)
            if name is not None:
                found.add(name)
    return sorted(found)


def cmd_list(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    client = client_for(args.url, parser)
    names = list_names(client, args.pattern)
    states = [s for s in fetch_states(client, names) if s.kind != "free"] if names else []
    if not states and not args.json:
        print(f"nothing held, waited on or set matches {args.pattern!r}")
        return 0
    _print_states(states, args.json)
    return 0



def holder_summary(state: LockState) -> str:
    owners = "; ".join(_who(o) for o in state.owners) or "an unknown holder"
    return f"{owners} ({state.kind}, token {state.token})"


def _force_release(client: Any, state: LockState) -> tuple[int, int]:
    """Run force_release.lua on the keys of ``state``'s primitive; return its reply."""
    k = Keys(settings().prefix, state.name)
    rw = _rw_keys(state.name) if state.kind == "DistReadWriteLock" else None
    # every process waiting for the lock of the name listens on its own channel, registered in
    # the lock's queue (a read/write lock's waiters too: a name is one lock); so do the
    # read/write lock's channels that the lock refused
    registered = {m.decode() if isinstance(m, bytes) else m for m in client.zrange(k.queue, 0, -1)}
    if rw is not None:
        channels = [rw.writer_channel, rw.reader_channel,
                    *sorted(registered - {rw.writer_channel, rw.reader_channel})]
        data = [rw.writer, rw.readers]
        writer = [o for o in state.owners if o.mode == "write"]
        seen = str(state.token) if writer and state.token is not None else ""
    else:
        channels = [k.channel, *sorted(registered - {k.channel})]
        data = [k.lock]
        seen = "" if state.token is None or state.kind.startswith("unknown") else str(state.token)
    retention = max(1, settings().fence_retention_ms)
    # A state change: through the executor, sent once (a retry after a lost reply could break
    # the next holder's hold), with errors located in force_release.lua.
    broken, fence = session_for(client).run("force_release", (k.fence, *channels, *data),
                                            (seen, len(channels), retention))
    return int(broken), int(fence)


def cmd_release(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    client = client_for(args.url, parser)
    states = fetch_states(client, [args.name])
    held = [s for s in states if s.held and s.kind not in NOT_LOCKS]
    others = [s for s in states if s.kind in NOT_LOCKS]
    if not held and others:
        err(f"{args.name!r} is a {others[0].kind}, not a lock: release --force breaks locks only")
        return EXIT_WRONG_KIND
    if not held:
        print(f"{args.name}: not held; nothing to release")
        return 0
    if not args.force:
        for state in held:
            err(f"{args.name} is held by {holder_summary(state)}")
        err(f"refusing to break {args.name!r} without --force")
        return EXIT_REFUSED
    status = 0
    for state in held:
        broken, fence = _force_release(client, state)
        if broken == -1:
            err(f"{args.name} changed hands meanwhile (now token {fence}); nothing broken, "
                 "run the command again")
            status = EXIT_REFUSED
        elif broken == 0 and fence == 0:
            print(f"{args.name}: no longer held; nothing to release")
        else:
            print(f"{args.name}: released by force; it was held by {holder_summary(state)}. "
                  f"Waiters were woken; the next grant gets a token above {fence}.")
    return status
