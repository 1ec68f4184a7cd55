"""The Redlock executor's fan-out: every master sent its commands at once, and the *plans*
that drive it.

- ``Master``: one master of the quorum, reached through a private twin of its client
  (``clients.renewer``: a pool of its own, timeouts of at most ``REPLY_CAP``, no hidden
  retries), and what is known of its server (its run id, since when it is up, the scripts in
  its cache, whether it could be reached a moment ago).
- ``FanOut``, what ``QuorumExecutor`` does with its masters: ``fanout`` takes a connection to
  every master, writes each its whole packed command (behind an ``INFO server`` and the
  SCRIPT LOADs a new connection needs), and only then reads the replies, waiting for all of
  them until one deadline; an entry answered NOSCRIPT did not run, and goes again with its
  script. The steps of one fan-out that do no I/O (``prepare``, ``absorb``, ``reloads``,
  ``skipped``, ``unreached``, ``behind``, and ``merge``) are shared with the asyncio port's
  fan-out (``aport_quorum``): one copy of the rules for both shells.
- A *plan* (``Plan``) is a generator that decides everything an operation does and yields
  each fan-out it needs as ``(jobs, deadline, undo)``, then is sent what ``fanout`` returned
  (or thrown its error). ``drive`` runs one with the blocking ``fanout``; the asyncio port
  drives the same plans with its own. The plans themselves (a grant, a release, ...) are the
  executor's (``executor_quorum``).
"""

from __future__ import annotations

import threading
import time
from typing import Any, Dict, Generator, List, Optional, Set, Tuple, TypeVar

import redis
from redis.commands.core import Script

from .._core.quorum import REPLY_CAP, parse_info
from .clients import renewer
from .direct import packer, taker
from .executor import NOSCRIPT_TRIES
from .failpoints import BEFORE, LATE, FailPoints, injected

__all__ = ["Master", "FanOut", "Entry", "Plan", "T", "merge", "unsent", "late", "DOWN_PAUSE"]

#: How long (seconds) a master that could not be reached (no connection) is left out of the
#: fan-outs before it is tried again: a host that is down costs one connect timeout per pause,
#: not one per try.
DOWN_PAUSE = 1.0

#: One entry of a fan-out: (script name, keys, args), or ('', the command, ()).
Entry = Tuple[str, Tuple[Any, ...], Tuple[Any, ...]]

T = TypeVar("T")

#: A plan (see the module's docstring): yields (jobs, deadline, undo), is sent fanout's result.
Plan = Generator[Tuple[Dict[int, List[Entry]], float, Optional[Entry]], Dict[int, Any], T]


class Master:
    """One master: a private twin of its client, and what is known of its server."""

    def __init__(self, index: int, client: Any) -> None:
        self.index = index
        twin = renewer(client, REPLY_CAP)
        if twin is None:
            raise TypeError(f"client[{index}] must be a redis.Redis on redis-py's own connection pool")
        self.twin = twin
        pool = twin.connection_pool
        kwargs = pool.connection_kwargs
        self.name = kwargs.get("path") or f"{kwargs.get('host', 'localhost')}:{kwargs.get('port', 6379)}"
        self.take = taker(pool)
        self.give_back = pool.release
        self.pack = packer(pool.get_encoder())
        self.lock = threading.Lock()
        self.run_id: Optional[str] = None
        #: when the server started (monotonic, as best known from its uptime); None: unknown
        self.started_at: Optional[float] = None
        #: the scripts known to be in its script cache
        self.loaded: Set[str] = set()
        #: a master that could not be reached is not tried again before then (monotonic),
        #: and this is every try's answer meanwhile
        self.down_until = 0.0
        self.down: BaseException = redis.exceptions.ConnectionError("not reached")

    def learn(self, info: Any, at: float) -> None:
        """What a new connection's ``INFO server`` says: its run id and since when it is up."""
        run_id, uptime = parse_info(info)
        with self.lock:
            if run_id != self.run_id:
                self.loaded.clear()  # a restarted server has an empty script cache
                self.run_id = run_id
            if uptime is not None:
                self.started_at = at - uptime


class FanOut:
    """The fan-out of the Redlock executor, over ``masters`` with ``scripts`` (the executor's:
    see ``QuorumExecutor``)."""

    masters: List[Master]
    scripts: Dict[str, Script]
    #: the tests' seam (``_redis.failpoints``): it fails a fan-out's script per master
    failpoints: Optional[FailPoints]

    def fanout(self, jobs: Dict[int, List[Entry]], deadline: float,
               undo: Optional[Entry] = None) -> Dict[int, Any]:
        """Send each master its entries at once; per master, the list of its replies (an
        error reply in place), or the exception that stopped it (it could not be reached, or
        did not answer by ``deadline``: what it was sent may or may not have run). An entry
        answered NOSCRIPT did not run: it is sent again with its script.

        ``undo``: a script that undoes what was sent, written (as EVAL) on the very connection
        of a master that did not answer by ``deadline``, behind what it was sent, before that
        connection is given up: a server runs one connection's commands in order, so however
        late the master runs the try, the undo runs after it (a new connection could overtake
        it). Its ``TimeoutError`` then has ``undone`` set."""
        failpoints = self.failpoints
        faults = failpoints.fanout(jobs)[1] if failpoints is not None else None
        out = self._round(jobs, deadline, undo, faults)
        for _ in range(NOSCRIPT_TRIES):
            again, where = self.reloads(jobs, out)
            if not again:
                break
            merge(out, where, self._round(again, deadline, undo))
        return out

    # --- what both shells' fan-outs share (the asyncio one: ``aport_quorum``) -------------

    def reloads(self, jobs: Dict[int, List[Entry]], out: Dict[int, Any]) -> Tuple[Dict[int, List[Entry]],
                                                                                  Dict[int, List[int]]]:
        """The entries answered NOSCRIPT (they did not run: sent again, with their script),
        per master, and where their replies go."""
        again: Dict[int, List[Entry]] = {}
        where: Dict[int, List[int]] = {}
        for i, replies in out.items():
            if isinstance(replies, BaseException):
                continue
            for k, reply in enumerate(replies):
                if isinstance(reply, redis.exceptions.NoScriptError):
                    self.masters[i].loaded.discard(jobs[i][k][0])
                    again.setdefault(i, []).append(jobs[i][k])
                    where.setdefault(i, []).append(k)
        return again, where

    def skipped(self, master: Master) -> Optional[BaseException]:
        """The answer of a master that could not be reached a moment ago (not tried again
        before ``DOWN_PAUSE`` has passed), else None."""
        return master.down if master.down_until > time.monotonic() else None

    @staticmethod
    def unreached(master: Master, exc: BaseException) -> BaseException:
        """A connection to ``master`` could not be opened: nothing was sent; leave it alone for
        ``DOWN_PAUSE``."""
        exc.unsent = True  # type: ignore[attr-defined]
        master.down, master.down_until = exc, time.monotonic() + DOWN_PAUSE
        return exc

    def prepare(self, master: Master, entries: List[Entry],
                fresh: bool) -> Tuple[List[Tuple[str, str]], bytes]:
        """What to write to ``master`` for ``entries``: on a ``fresh`` connection, first who
        the server is (INFO) and every script its entries run (its cache may be empty), else
        the scripts not known to be loaded; then the entries. Returns that prefix and the
        packed bytes."""
        prefix: List[Tuple[str, str]] = [("info", "")] if fresh else []
        names = {name for name, _, _ in entries if name}
        prefix += [("load", name) for name in sorted(names if fresh else names - master.loaded)]
        commands: List[Tuple[Any, ...]] = []
        for kind, name in prefix:
            commands.append(("INFO", "server") if kind == "info" else
                            ("SCRIPT", "LOAD", self.scripts[name].script))
        for name, keys, args in entries:
            if name:
                commands.append(("EVALSHA", self.scripts[name].sha, len(keys), *keys, *args))
            else:
                commands.append(keys)
        return prefix, b"".join(master.pack(c)[0] for c in commands)

    @staticmethod
    def absorb(master: Master, prefix: List[Tuple[str, str]], replies: List[Any]) -> Tuple[List[Any], bool]:
        """Learn from the prefix's replies (who the server is, the scripts now loaded); return
        the entries' replies and whether the server was identified (the connection is then
        known)."""
        at = time.monotonic()
        known = False
        for (kind, name), reply in zip(prefix, replies):
            if isinstance(reply, BaseException):
                continue
            if kind == "info":
                master.learn(reply, at)
                known = True
            else:
                master.loaded.add(name)
        return replies[len(prefix):], known

    def behind(self, master: Master, entry: Entry) -> List[bytes]:
        """``entry`` packed as EVAL (no script cache needed), to write behind a try."""
        name, keys, args = entry
        return master.pack(("EVAL", self.scripts[name].script, len(keys), *keys, *args))

    # --- the blocking fan-out -----------------------------------------------------------------

    def _round(self, jobs: Dict[int, List[Entry]], deadline: float,
               undo: Optional[Entry] = None, faults: Optional[Dict[int, str]] = None) -> Dict[int, Any]:
        out: Dict[int, Any] = {}
        sent: List[Tuple[Master, Any, List[Tuple[str, str]], int]] = []
        for i, entries in jobs.items():
            master = self.masters[i]
            skip = self.skipped(master)
            if not entries or skip is not None:
                out[i] = skip if skip is not None else []
                continue
            if faults and faults.get(i) == BEFORE:
                out[i] = unsent(injected(BEFORE))
                continue
            try:
                conn = master.take()
            except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, OSError) as exc:
                out[i] = self.unreached(master, exc)
                continue
            fresh = getattr(conn, "_distlock_sock", None) is not conn._sock
            prefix, packed = self.prepare(master, entries, fresh)
            try:
                conn.send_packed_command([packed])
            except BaseException as exc:
                conn.disconnect()
                master.give_back(conn)
                if not isinstance(exc, Exception):
                    raise
                exc.unsent = True  # type: ignore[attr-defined]  # not all of it: the last command is incomplete
                out[i] = exc
                continue
            sent.append((master, conn, prefix, len(entries)))
        for master, conn, prefix, count in sent:
            try:
                replies = self._read(conn, len(prefix) + count, deadline)
            except BaseException as exc:
                if undo is not None and isinstance(exc, redis.exceptions.TimeoutError):
                    exc.undone = self._send_behind(master, conn, undo)  # type: ignore[attr-defined]
                conn.disconnect()  # a reply may still be on its way: the connection is unusable
                master.give_back(conn)
                if not isinstance(exc, Exception):
                    raise
                out[master.index] = exc
                continue
            fault = faults.get(master.index) if faults else None
            undone = False
            if fault == LATE and undo is not None:  # what a real late reply leaves: the undo ran after it
                undone = self._undo_now(master, conn, undo, deadline)
            master.give_back(conn)
            out[master.index], known = self.absorb(master, prefix, replies)
            if known:
                conn._distlock_sock = conn._sock
            if fault is not None:  # it ran; its reply is dropped (see ``_redis.failpoints``)
                out[master.index] = late(injected(fault), undone)
        return out

    def _undo_now(self, master: Master, conn: Any, entry: Entry, deadline: float) -> bool:
        """A failpoint's late reply: write ``entry`` behind the try, as ``_send_behind`` does,
        and read its reply (so that it ran before the error is reported)."""
        if not self._send_behind(master, conn, entry):
            return False
        try:
            self._read(conn, 1, max(deadline, time.monotonic() + REPLY_CAP))
        except Exception:  # noqa: BLE001 - written behind the try: the server runs it anyway
            conn.disconnect()
        return True

    def _send_behind(self, master: Master, conn: Any, entry: Entry) -> bool:
        """Write ``entry`` behind what ``conn`` was sent, not reading its reply; True when it
        was written."""
        try:
            conn.send_packed_command(self.behind(master, entry))
        except Exception:  # noqa: BLE001 - the connection broke: the server has what it got
            return False
        return True

    @staticmethod
    def _read(conn: Any, count: int, deadline: float) -> List[Any]:
        replies: List[Any] = []
        for _ in range(count):
            if not conn.can_read(timeout=max(0.0, deadline - time.monotonic())):
                raise redis.exceptions.TimeoutError("no reply in time")
            try:
                replies.append(conn.read_response())
            except redis.exceptions.ResponseError as exc:
                replies.append(exc)  # the whole reply was read: the connection is clean
        return replies

    def drive(self, plan: Plan[T]) -> T:
        """Run ``plan`` with the blocking ``fanout``; its result, or its error."""
        try:
            request = next(plan)
            while True:
                try:
                    out = self.fanout(*request)
                except BaseException as exc:  # noqa: BLE001 - the plan decides what it means
                    request = plan.throw(exc)
                else:
                    request = plan.send(out)
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]


def unsent(exc: BaseException) -> BaseException:
    """``exc``, marked: nothing was sent (the entries did not run)."""
    exc.unsent = True  # type: ignore[attr-defined]
    return exc


def late(exc: BaseException, undone: bool) -> BaseException:
    """``exc``, marked with whether the undo was written behind the try (``fanout``)."""
    if undone:
        exc.undone = True  # type: ignore[attr-defined]
    return exc


def merge(out: Dict[int, Any], where: Dict[int, List[int]], again: Dict[int, Any]) -> None:
    """Put the replies of entries sent again (``reloads``) in their places in ``out``."""
    for i, replies in again.items():
        for k, reply in zip(where[i], replies if isinstance(replies, list) else [replies] * len(where[i])):
            out[i][k] = reply
