"""``distlock top``: the I/O (SCAN, pipelined reads, the terminal). The parsing is in ``inspect``,
the rows, their order and their text in ``top_rows`` (no I/O in either).

One refresh:

1. ``TIME`` and the first ``SCAN`` in one round trip, then ``SCAN ... COUNT 1000`` until the
   cursor is back at 0 (never ``KEYS``): every key under the prefix, grouped by primitive;
2. the reads of the primitives to show, pipelined ``READ_CHUNK`` primitives per round trip:
   every primitive that may be waited on (their waits decide the order), then the others by
   name up to the limit (the screen's height in the live view; all of them for ``--once``
   without ``--limit``).

So a refresh costs one SCAN per 1000 keys under the prefix (a held DistLock is two keys: its
hash and its ``:fence``), plus about two reads per row shown or waited on.

On a Redis Cluster every master is SCANned (each with its own ``TIME``), and the reads go, one
pipeline per master, to the master of each primitive's slot (all keys of a primitive share its
name's hash tag). The helpers for that (``servers``, ``by_server``, ``routed``) are in
``servers``, shared with ``distlock status``, ``list`` and ``release``: on one server they see one
server.
"""

from __future__ import annotations

import argparse
import json
import os
import select
import shutil
import sys
import time
from typing import Any, Callable, List, Optional, TextIO, Tuple

import redis
from redis.exceptions import RedisClusterException

from .._core.settings import settings
from .connect import client_for, redact_url
from .inspect import exclusive_state, glob_escape, rw_state
from .servers import SCAN_COUNT, by_server, execute, routed, servers, time_ms
from .top_rows import (
    BARRIER,
    COND,
    EVENT,
    HOLD,
    LEASES,
    LOCK,
    READERS,
    RW,
    SEM,
    WAIT,
    Found,
    TopRow,
    TopSnapshot,
    barrier_row,
    condition_row,
    event_row,
    format_top,
    group_keys,
    lock_row,
    plan_reads,
    rw_row,
    semaphore_row,
    sort_rows,
)

__all__ = ["snapshot", "run_top", "cmd_top", "scan", "READ_CHUNK", "READ_BUDGET"]

#: primitives read per pipelined round trip
READ_CHUNK = 500
#: the live view reads at most this many primitives per refresh (about 2 commands each): past
#: it, the waited ones are read in name order and the oldest wait is among those
READ_BUDGET = 2000

#: header lines above the rows, and lines kept free below them
_HEADER_LINES = 3


def scan(client: Any, prefix: str) -> Tuple[List[Tuple[Any, int]], List[Any], int]:
    """((server, its ms) for each server, every key under ``prefix``, SCAN calls): SCAN to the
    end on every server (every master of a cluster), never KEYS."""
    match = glob_escape(prefix) + "*"
    clocks: List[Tuple[Any, int]] = []
    found: List[Any] = []
    calls = 0
    for server in servers(client):
        pipe = server.pipeline(transaction=False)
        pipe.time()
        pipe.scan(cursor=0, match=match, count=SCAN_COUNT)
        now, (cursor, keys) = execute(pipe)
        clocks.append((server, time_ms(now)))
        found.extend(keys)
        calls += 1
        while int(cursor) != 0:
            cursor, keys = server.scan(cursor=cursor, match=match, count=SCAN_COUNT)
            found.extend(keys)
            calls += 1
    return clocks, found, calls


Reader = Callable[[List[Any]], Optional[TopRow]]


def _queue_reads(pipe: Any, entry: Found, now_ms: int) -> Tuple[int, Reader]:
    """Queue the reads of one primitive on ``pipe``: (how many, what makes its row of them)."""
    keys = entry.keys
    after = f"({now_ms}"
    n = 0

    def q(method: str, *args: Any, **kwargs: Any) -> int:
        nonlocal n
        getattr(pipe, method)(*args, **kwargs)
        n += 1
        return n - 1

    if entry.family == LOCK:
        hold = keys.get(HOLD)
        fields_at = q("hgetall", hold) if hold else None
        pttl_at = q("pttl", hold) if hold else None
        wait_at = q("zcount", keys[WAIT], after, "+inf") if WAIT in keys else None

        def read_lock(r: List[Any]) -> Optional[TopRow]:
            state = None
            if hold is not None:
                fields = r[fields_at] if fields_at is not None else None
                key_type = "hash" if fields else ("none" if fields == {} else "unknown")
                pttl = r[pttl_at] if pttl_at is not None else None
                state = exclusive_state(entry.name, hold, key_type, fields, pttl, None)
            return lock_row(state, entry.name, now_ms=now_ms,
                            waiting=r[wait_at] if wait_at is not None else None)
        return n, read_lock
    if entry.family == RW:
        writer = keys.get(HOLD)
        fields_at = q("hgetall", writer) if writer else None
        pttl_at = q("pttl", writer) if writer else None
        readers_at = q("zrange", keys[READERS], 0, -1, withscores=True) if READERS in keys else None
        queue_at = q("zrange", keys[WAIT], 0, -1, withscores=True) if WAIT in keys else None

        def read_rw(r: List[Any]) -> Optional[TopRow]:
            fields = r[fields_at] if fields_at is not None else None
            state = rw_state(
                entry.name, writer or "", writer_type="hash" if fields else "none",
                writer_fields=fields, writer_pttl=r[pttl_at] if pttl_at is not None else None,
                readers=r[readers_at] if readers_at is not None else None,
                queue=r[queue_at] if queue_at is not None else None, now_ms=now_ms, fence=None)
            return rw_row(state, entry.name)
        return n, read_rw
    if entry.family == SEM:
        sem = keys.get(HOLD)
        members_at = q("zrange", sem, 0, -1, withscores=True) if sem else None
        pttl_at = q("pttl", sem) if sem else None
        wait_at = q("zcount", keys[WAIT], after, "+inf") if WAIT in keys else None
        return n, lambda r: semaphore_row(
            entry.name, r[members_at] if members_at is not None else None,
            r[pttl_at] if pttl_at is not None else None, now_ms=now_ms,
            waiting=r[wait_at] if wait_at is not None else None)
    if entry.family == EVENT:
        wait_at = q("zcount", keys[WAIT], after, "+inf") if WAIT in keys else None
        return n, lambda r: event_row(entry.name, HOLD in keys,
                                      waiting=r[wait_at] if wait_at is not None else None)
    if entry.family == BARRIER:
        state_at = q("hmget", keys[HOLD], "p", "b") if HOLD in keys else None
        wait_at = q("zcount", keys[WAIT], after, "+inf") if WAIT in keys else None
        return n, lambda r: barrier_row(
            entry.name, (r[state_at] or []) if state_at is not None else [],
            waiting=r[wait_at] if wait_at is not None else None)
    if entry.family == COND:
        live_at = q("zcount", keys[LEASES], after, "+inf") if LEASES in keys else None
        oldest_at = q("zrange", keys[WAIT], 0, 0, withscores=True)
        return n, lambda r: condition_row(
            entry.cond or entry.name, entry.name, now_ms=now_ms, oldest=r[oldest_at],
            waiting=r[live_at] if live_at is not None else None)
    return n, lambda r: None


def snapshot(client: Any, url: str, limit: Optional[int] = None,
             budget: Optional[int] = None, long_ms: Optional[int] = None) -> TopSnapshot:
    """One refresh: SCAN, then the pipelined reads of the rows to show (``limit`` rows, all
    when None; at most ``budget`` primitives read, no cap when None), sorted by the oldest
    wait; holds older than ``long_ms`` are marked (``--long``; None: none). On a cluster, each
    master is scanned and each primitive read on its slot's master (done again on a fresh slot
    map when a slot moved meanwhile: ``routed``)."""
    return routed(client, lambda: _snapshot(client, url, limit, budget, long_ms))


def _snapshot(client: Any, url: str, limit: Optional[int], budget: Optional[int],
              long_ms: Optional[int]) -> TopSnapshot:
    started = time.monotonic()
    prefix = settings().prefix
    clocks, keys, scans = scan(client, prefix)
    found = group_keys(prefix, keys)
    chosen = plan_reads(found, limit, budget)
    rows: List[TopRow] = []
    commands = scans + len(clocks)  # + one TIME per server
    now_of = {id(server): now for server, now in clocks}
    first_now = clocks[0][1]
    for server, indexes in by_server(client, [next(iter(f.keys.values())) for f in chosen]):
        now_ms = now_of.get(id(server), first_now)  # a master the scan did not know: rare
        for at in range(0, len(indexes), READ_CHUNK):
            pipe = server.pipeline(transaction=False)
            readers: List[Tuple[int, Reader]] = []
            for i in indexes[at:at + READ_CHUNK]:
                readers.append(_queue_reads(pipe, chosen[i], now_ms))
            replies = execute(pipe)
            commands += len(replies)
            pos = 0
            for count, read in readers:
                row = read(replies[pos:pos + count])
                pos += count
                if row is not None:
                    rows.append(row)
    ordered = sort_rows(rows)
    if limit is not None:
        ordered = ordered[:limit]
    return TopSnapshot(url=url, server_time_ms=first_now, rows=tuple(ordered),
                       primitives=len(found), waited=sum(1 for f in found if f.waited),
                       read=len(chosen),
                       keys_scanned=len(keys), scan_calls=scans, commands=commands,
                       refresh_ms=(time.monotonic() - started) * 1000, long_ms=long_ms)


# --- the terminal --------------------------------------------------------------------------

_ENTER = "\x1b[?1049h\x1b[?25l"   # alternate screen, cursor hidden
_LEAVE = "\x1b[?25h\x1b[?1049l"   # cursor shown, back to the normal screen
_HOME = "\x1b[H"
_EOL = "\x1b[K"                   # erase to the end of the line
_EOS = "\x1b[J"                   # erase below


def _draw(out: TextIO, lines: List[str]) -> None:
    out.write(_HOME + "".join(line + _EOL + "\r\n" for line in lines) + _EOS)
    out.flush()


class _Keys:
    """Keys typed at the terminal, when stdin is one (cbreak mode: no echo, no line buffering;
    Ctrl-C still sends SIGINT). Otherwise it only sleeps."""

    def __init__(self, stream: TextIO) -> None:
        self.fd: Optional[int] = None
        self.saved: Any = None
        try:
            fd = stream.fileno()
        except (AttributeError, OSError, ValueError):
            return
        if not os.isatty(fd):
            return
        try:
            import termios
            import tty
        except ImportError:  # not on a POSIX system: no keys, Ctrl-C only
            return
        self.saved = termios.tcgetattr(fd)
        tty.setcbreak(fd)
        self.fd = fd

    def wait(self, seconds: float) -> str:
        """Wait up to ``seconds`` for keys; return what was typed ('' when nothing)."""
        if self.fd is None:
            time.sleep(max(0.0, seconds))
            return ""
        ready, _, _ = select.select([self.fd], [], [], max(0.0, seconds))
        if not ready:
            return ""
        return os.read(self.fd, 64).decode("utf-8", "replace")

    def restore(self) -> None:
        if self.fd is not None:
            import termios

            termios.tcsetattr(self.fd, termios.TCSADRAIN, self.saved)
            self.fd = None


def _terminal_size(out: TextIO) -> os.terminal_size:
    """The size of the terminal ``out`` is, as it is now (resizes included); $COLUMNS and
    $LINES, else 120 x 40, when it is none."""
    try:
        return os.get_terminal_size(out.fileno())
    except (AttributeError, OSError, ValueError):
        return shutil.get_terminal_size((120, 40))


def _screen_limit(out: TextIO, limit: Optional[int]) -> Tuple[int, int]:
    """(rows that fit the terminal, capped by ``limit``; the terminal's width)."""
    size = _terminal_size(out)
    fit = max(1, size.lines - _HEADER_LINES - 1)
    return (min(fit, limit) if limit is not None else fit), size.columns


def cmd_top(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """The ``distlock top`` command: ``run_top`` on the server of ``--url``."""
    client = client_for(args.url, parser)
    return run_top(client, redact_url(args.url), interval=args.interval, limit=args.limit,
                   once=args.once, as_json=args.json, long_s=args.long)


def run_top(client: Any, url: str, *, interval: float, limit: Optional[int],
            once: bool, as_json: bool, long_s: Optional[float] = None,
            out: TextIO = sys.stdout, inp: TextIO = sys.stdin) -> int:
    """``distlock top``: one snapshot (``once``, text or JSON), or the live view until ``q`` or
    Ctrl-C; holds older than ``long_s`` seconds (``--long``) are marked. A server that cannot
    be reached at the first refresh raises (the command line reports it); later, the view says
    so and keeps trying at every refresh."""
    long_ms = None if long_s is None else int(long_s * 1000)
    try:
        if once or as_json:
            snap = snapshot(client, url, limit, long_ms=long_ms)
            if as_json:
                out.write(json.dumps(snap.to_json(), indent=2, sort_keys=True) + "\n")
            else:
                tty = out.isatty()
                width = _terminal_size(out).columns if tty else None
                out.write("\n".join(format_top(snap, width, highlight=tty)) + "\n")
            out.flush()
            return 0
        rows, _ = _screen_limit(out, limit)
        # before the screen: an unreachable server is an error, as for status
        snap = snapshot(client, url, rows, READ_BUDGET, long_ms)
    except KeyboardInterrupt:
        return 0
    keys: Optional[_Keys] = None
    out.write(_ENTER)
    try:
        keys = _Keys(inp)
        error: Optional[str] = None
        while True:
            rows, width = _screen_limit(out, limit)
            _draw(out, format_top(snap, width, live=True, error=error))
            typed = keys.wait(interval - snap.refresh_ms / 1000 if error is None else interval)
            if "q" in typed.lower():
                return 0
            try:
                snap = snapshot(client, url, rows, READ_BUDGET, long_ms)
                error = None
            except (redis.RedisError, RedisClusterException) as exc:
                error = " ".join(f"{type(exc).__name__}: {exc}".split())
    except KeyboardInterrupt:
        return 0
    finally:
        if keys is not None:
            keys.restore()
        out.write(_LEAVE)
        out.flush()
