"""The Redlock executor: a lock on a quorum of independent masters (``client=[c1, ..., cN]``).

Picked by ``distlock._redis.executor_for`` for a ``_core.quorum.Quorum`` (what a list of masters given to
DistLock or DistRLock becomes). Behind the executor's methods the lock's flows are unchanged:
they run ``lock_acquire``, ``lock_release`` and ``lock_unwait`` and renew with ``lock_renew``,
as on one server, and this executor sends each to every master *at once* and folds the
replies into the one reply a single server would have given (the arithmetic is in
``_core.quorum``, without I/O):

- **Concurrently, without a thread per try.** ``fanout`` (``fanout_quorum.FanOut``) takes a
  connection to every master, writes each its whole packed command (the EVALSHA, behind an
  ``INFO server`` and the SCRIPT LOADs a new connection needs), and only then reads the
  replies, waiting for all of them until one deadline. N masters cost about one round trip,
  not N. Each operation is a *plan* (``plan``, ``read_plan``): a generator that yields the
  fan-outs it needs, driven by ``drive`` here and by the asyncio port (``aport_quorum``).
- **A grant** needs N//2+1 masters that granted, and a validity, lease - elapsed - drift,
  above zero. Its token (``Hold.token``) is the largest of the quorum's tokens; each master's
  own is kept here (``_Part``), and its releases, renewals and re-entries are sent with it.
- **A failed try is undone** on every master that granted, and on every master whose reply
  did not come back in time (it may have run: docs/design.rst, principle 13), with ``lock_undo``, which
  ends only the hold that very try made (each try writes a holder info of its own). A grant
  that counted is undone likewise where it did not count (no reply in time; a master that
  sits out); where even the undo got no reply, the release sends it again.
- **Too few masters answered**: ``QuorumError`` (the lock's wait retries it until its timeout).
- **Renewals** (the watchdog's batch) go to every master that still has the hold; a master
  that says it is gone is dropped, so the quorum only shrinks. A quorum renewed it: renewed
  (its deadline: when the renewal was sent + lease - drift); a quorum can no longer renew it:
  lost now; too few answered to tell: an error, and the hold is lost when its validity ends.
- **Delayed restarts.** Every new connection to a master reads ``INFO server`` in front of its
  first command (no extra round trip). A master whose uptime is less than a try's lease
  does not vote in that try (``_core.quorum.sits_out``); a grant it made anyway is undone. A new
  ``run_id`` (a restart) also means its scripts must be loaded again.
- **Waiters** join every master's channel: one dispatcher per master
  (``pubsub_quorum.QuorumDispatcher``), whose hints all wake the same waiter.

Each master (``fanout_quorum.Master``) is reached through a private twin of its client
(``clients.renewer``): a pool of its own, timeouts of at most ``REPLY_CAP``, no hidden
retries; the user's clients are not kept.
"""

from __future__ import annotations

import itertools
import os
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

import redis

from .._core.errors import WRONG_KIND, QuorumError
from .._core.quorum import (
    REPLY_CAP,
    busy_reply,
    drift,
    quorum,
    reply_bound,
    sits_out,
    tally_acquire,
    tally_release,
    tally_renew,
    validity,
)
from .._core.settings import settings
from .direct import disconnect_quietly
from .executor import Batch, Executor
from .fanout_quorum import Entry, FanOut, Master, Plan
from .pubsub_quorum import QuorumDispatcher

__all__ = ["QuorumExecutor", "QuorumBatch"]


class _Part:
    """A live Redlock hold as the masters know it: each master's token, the holder info of the
    try that made it, its deadline and (for the tests) the validity it was granted with."""

    __slots__ = ("token", "tokens", "info", "until", "validity", "doubtful")

    def __init__(self, token: int, tokens: Dict[int, int], info: str, until: float, validity_: float) -> None:
        self.token = token
        self.tokens = tokens
        self.info = info
        self.until = until
        self.validity = validity_
        #: masters where the try may have left a hold that no undo has ended yet (their reply,
        #: and the undo's, were lost): the release sends them ``lock_undo`` again
        self.doubtful: List[int] = []


#: the reply of a master that did not vote (it has been up for less than one lease)
_SAT_OUT = QuorumError("up for less than one lease: does not vote yet")

#: what a master that refused the name (another kind there) counts as: it answered, and
#: refused, as a holder with no known lease would (``lock_acquire``'s -(pttl + 1))
_REFUSED = -1


class QuorumExecutor(FanOut, Executor):
    """Runs the lock's scripts on a quorum of independent masters (see the module's docstring)."""

    #: no in-process hand-off: each master would have to hand over, as a grant of the quorum
    hands_off = False

    def __init__(self, client: Any, real: Any = None) -> None:
        group = client if real is None else real
        self.masters = [Master(i, c) for i, c in enumerate(group.masters)]
        # the scripts (their text and SHA) are bound to the first master's twin; every master
        # is sent them by ``fanout``, which never goes through the base class' paths
        super().__init__(self.masters[0].twin)
        self.n = len(self.masters)
        self.required = quorum(self.n)
        #: live holds, by (lock key, owner)
        self.parts: Dict[Tuple[str, str], _Part] = {}
        self._parts_lock = threading.Lock()
        self._tries = itertools.count(1)
        self._nonce = os.urandom(3).hex()

    def margin(self, lease_ms: int) -> float:
        """How much earlier than a single server's a hold's deadline is: the drift."""
        return drift(lease_ms / 1000.0, settings().redlock_drift)

    # --- scripts: each operation is a *plan* (see ``fanout_quorum``) ---------------------------
    #
    # Each plan decides everything and yields the fan-outs it needs: ``_send`` drives it with
    # the blocking ``fanout``; the asyncio port (``aport_quorum``) drives the same plan with
    # its own, so the quorum's rules have one copy.

    def _failing(self, failpoints: Any, name: str, script: Any, keys: Tuple[str, ...],
                 args: Tuple[Any, ...], acks: Optional[Tuple[int, int]]) -> Any:
        """A test's failpoints apply per master, in the fan-outs (``fanout_quorum``)."""
        return self._send(name, script, keys, args, None if acks is None else ("WAIT", *acks))

    def _send(self, name: str, script: Any, keys: Tuple[str, ...], args: Tuple[Any, ...],
              tail: Optional[Tuple[Any, ...]] = None) -> Any:
        if tail is not None:
            # a command sent behind the script on its connection (WAIT, for min_replicas): a
            # quorum's masters are independent, with no replicas to wait for
            raise TypeError("min_replicas does not apply to a Redlock quorum (a list of masters)")
        return self.drive(self.plan(name, keys, args))

    def plan(self, name: str, keys: Tuple[str, ...], args: Tuple[Any, ...]) -> Plan[Any]:
        """The plan of script ``name`` (see above)."""
        if name == "lock_acquire":
            mode = args[4] if len(args) > 4 else ""
            if mode in ("", "w", "p"):
                return self._acquire(keys, args)
            return self._reenter(keys, args)
        if name == "lock_release":
            return self._release(keys, args)
        if name == "lock_unwait":
            return self._everywhere(name, keys, args)
        raise TypeError(f"distlock: script {name} does not run on a Redlock quorum")

    def _quorum_error(self, answered: int) -> QuorumError:
        return QuorumError(f"only {answered} of {self.n} masters answered ({self.required} required)",
                           answered=answered, required=self.required)

    def _acquire(self, keys: Tuple[str, ...], args: Tuple[Any, ...]) -> Plan[int]:
        owner, ms = str(args[0]), int(args[1])
        lease = ms / 1000.0
        drift_ = self.margin(ms)
        now = time.monotonic()
        voters = [m.index for m in self.masters if not sits_out(m.started_at, now, lease)]
        if len(voters) < self.required:
            raise QuorumError(f"only {len(voters)} of {self.n} masters can vote ({self.required} required): "
                              "the others have been up for less than one lease",
                              answered=len(voters), required=self.required)
        # a holder info of this try's own: lock_undo ends only the hold this very try made
        host, _, pid = str(args[3]).rpartition(":")
        info = f"{host}#{self._nonce}{next(self._tries):x}:{pid}"
        entry = ("lock_acquire", keys, (args[0], args[1], args[2], info, *args[4:]))
        sent = time.monotonic()
        # lock_acquire's keys: the hash, the fence, the registry of waiting processes, ...
        undone = (keys[0], keys[2])
        undo_entry = ("lock_undo", undone, (owner, info))
        try:
            out = yield ({i: [entry] for i in voters}, sent + reply_bound(lease, drift_), undo_entry)
        except BaseException:
            # interrupted (KeyboardInterrupt, a cancelled task) with replies unread: undo the
            # try everywhere
            try:
                yield from self._undo(undone, owner, info, voters)
            except Exception:  # noqa: BLE001 - what cannot be undone ends with its lease
                pass
            raise
        done = time.monotonic()
        replies: Dict[int, Any] = {}
        undo: List[int] = []
        refusals: List[BaseException] = []
        for i, got in out.items():
            reply = got if isinstance(got, BaseException) else got[0]
            if isinstance(reply, redis.exceptions.ResponseError) and str(reply).startswith(WRONG_KIND):
                # the name is another kind there (a name is one lock): an answer, and a no
                refusals.append(reply)
                reply = _REFUSED
            elif isinstance(reply, BaseException):
                lost = not isinstance(reply, redis.exceptions.ResponseError)
                if lost and not getattr(reply, "unsent", False) and not getattr(reply, "undone", False):
                    undo.append(i)  # no reply, and no undo behind the try: the try may have run there
            elif sits_out(self.masters[i].started_at, done, lease):
                # a new connection found the master up for less than one lease: not a vote
                if int(reply) > 0:
                    undo.append(i)
                reply = _SAT_OUT
            replies[i] = reply
        grants, _, answered = tally_acquire(list(replies.values()), len(voters))
        valid = validity(lease, done - sent, drift_)
        if grants >= self.required and valid > 0:
            tokens = {i: int(r) for i, r in replies.items()
                      if not isinstance(r, BaseException) and int(r) > 0}
            doubtful = (yield from self._undo(undone, owner, info, undo)) if undo else []
            token = max(tokens.values())
            part = _Part(token, tokens, info, sent + lease - drift_, valid)
            part.doubtful = doubtful
            self._keep(keys[0], owner, part)
            return token
        undo += [i for i, r in replies.items() if not isinstance(r, BaseException) and int(r) > 0]
        if undo:
            yield from self._undo(undone, owner, info, undo)
        if len(refusals) >= self.required:
            raise refusals[0]  # the name is another kind on a majority (a name is one lock)
        if answered < self.required:
            raise self._quorum_error(answered)
        return busy_reply(replies.values())

    def _undo(self, keys: Tuple[str, str], owner: str, info: str, masters: List[int]) -> Plan[List[int]]:
        """Send ``lock_undo`` for one try to ``masters`` (``keys``: the lock's hash and its
        registry of waiting processes); return those where it may not have run (no reply). Such a master keeps
        the try's hold until its lease ends (the try did not count there). Safe to repeat: it
        ends only that try's hold."""
        entry = ("lock_undo", keys, (owner, info))
        out = yield ({i: [entry] for i in masters}, time.monotonic() + REPLY_CAP, entry)
        return [i for i, got in out.items() if isinstance(got, BaseException)
                and not getattr(got, "undone", False) and not getattr(got, "unsent", False)]

    def _keep(self, key: str, owner: str, part: _Part) -> None:
        now = time.monotonic()
        with self._parts_lock:
            if len(self.parts) > 64:
                for gone in [k for k, p in self.parts.items() if p.until < now]:
                    del self.parts[gone]
            self.parts[(key, owner)] = part

    def _part(self, key: str, owner: str, token: Any) -> Optional[_Part]:
        with self._parts_lock:
            part = self.parts.get((key, owner))
        return part if part is not None and str(part.token) == str(token) else None

    def _drop(self, key: str, owner: str, part: _Part) -> None:
        with self._parts_lock:
            if self.parts.get((key, owner)) is part:
                del self.parts[(key, owner)]

    def _reenter(self, keys: Tuple[str, ...], args: Tuple[Any, ...]) -> Plan[int]:
        owner = str(args[0])
        part = self._part(keys[0], owner, args[4])
        if part is None:
            return 0
        ms = int(args[1])
        jobs = {i: [("lock_acquire", keys, (*args[:4], str(tok), *args[5:]))]
                for i, tok in part.tokens.items()}
        out = yield (jobs, time.monotonic() + reply_bound(ms / 1000.0, self.margin(ms)), None)
        replies: List[Any] = []
        for i, got in out.items():
            reply = got if isinstance(got, BaseException) else got[0]
            if not isinstance(reply, BaseException):
                reply = int(int(reply) > 0)
                if not reply:
                    part.tokens.pop(i, None)  # gone there: the quorum only shrinks
            replies.append(reply)
        renewed = tally_renew(replies, self.n)
        if renewed == 1:
            part.until = max(part.until, time.monotonic() + ms / 1000.0 - self.margin(ms))
            return part.token
        if renewed == 0:
            self._drop(keys[0], owner, part)
            return 0
        raise self._quorum_error(sum(1 for r in replies if not isinstance(r, BaseException)))

    def _release(self, keys: Tuple[str, ...], args: Tuple[Any, ...]) -> Plan[int]:
        owner = str(args[0])
        part = self._part(keys[0], owner, args[1])
        if part is None:
            return -1
        jobs = {i: [("lock_release", keys, (args[0], str(tok), *args[2:]))]
                for i, tok in part.tokens.items()}
        out = yield (jobs, time.monotonic() + REPLY_CAP, None)
        replies: List[Any] = []
        for i in range(self.n):
            got = out.get(i)
            if got is None:
                replies.append(-1)  # it did not have the hold (or its grant's reply was lost)
                continue
            reply = got if isinstance(got, BaseException) else got[0]
            replies.append(reply)
            if not isinstance(reply, BaseException) and int(reply) <= 0:
                part.tokens.pop(i, None)
        left = tally_release(replies, self.n)
        if left is None:
            raise self._quorum_error(sum(1 for i, r in enumerate(replies)
                                         if i in out and not isinstance(r, BaseException)))
        if left <= 0:
            self._drop(keys[0], owner, part)
            if part.doubtful:  # masters where the grant's try may still be, not undone yet
                yield from self._undo((keys[0], keys[1]), owner, part.info, part.doubtful)
        return left

    def _everywhere(self, name: str, keys: Tuple[str, ...], args: Tuple[Any, ...]) -> Plan[Any]:
        out = yield ({i: [(name, keys, args)] for i in range(self.n)}, time.monotonic() + REPLY_CAP, None)
        replies = [got if isinstance(got, BaseException) else got[0] for got in out.values()]
        for reply in replies:
            if not isinstance(reply, BaseException):
                return reply
        raise replies[0]

    # --- the other kinds of traffic ---------------------------------------------------------

    def read(self, *command: Any) -> Any:
        return self.drive(self.read_plan(*command))

    def read_plan(self, *command: Any) -> Plan[Any]:
        """EXISTS of a lock (``locked()``): 1 when a quorum of masters has it. Other commands
        are not read on a quorum."""
        if str(command[0]).upper() == "HMGET":
            # what a lock reads after a try's reply was lost, to undo a grant: a quorum's
            # executor has undone it already (``_acquire``), so there is nothing to find
            return [None] * (len(command) - 2)
        if str(command[0]).upper() != "EXISTS":
            raise TypeError(f"distlock: {command[0]} is not read on a Redlock quorum")
        out = yield ({i: [("", command, ())] for i in range(self.n)}, time.monotonic() + REPLY_CAP, None)
        replies = [got if isinstance(got, BaseException) else got[0] for got in out.values()]
        answered = [r for r in replies if not isinstance(r, BaseException)]
        if len(answered) < self.required:
            raise self._quorum_error(len(answered))
        return int(sum(1 for r in answered if int(r) > 0) >= self.required)

    def batch(self) -> QuorumBatch:
        return QuorumBatch(self)

    def renewal_batch(self) -> QuorumBatch:
        return QuorumBatch(self)

    def open_renewal(self) -> bool:
        """Nothing: a master's renewals go through its private twin, made with its client."""
        return False

    def renewal_reset(self, then: Optional[Callable[[], object]] = None) -> bool:
        """Never: a quorum outlives one master's restart (it sits out a lease instead)."""
        return False

    def renewal_sockets(self) -> List[Any]:
        """None to wait on (``renewal_reset``)."""
        return []

    def drop_renewal(self) -> None:
        pass  # the masters' twins serve every kind of traffic: closed with the session

    def close(self) -> None:
        """Close every connection to the masters (the session is retired)."""
        for master in self.masters:
            disconnect_quietly(master.twin)

    def pubsub(self) -> Any:
        raise TypeError("a Redlock quorum has one pub/sub connection per master: see dispatcher()")

    def dispatcher(self, source: Callable[[], Any], tag: str) -> Any:
        return QuorumDispatcher(source, tag, self.masters)


class QuorumBatch(Batch):
    """The watchdog's renewals of Redlock holds: each goes to every master that still has the
    hold, all masters at once (``QuorumExecutor.fanout``); one reply per hold, folded by
    ``_core.quorum.tally_renew``."""

    __slots__ = ("_executor", "_entries")

    def __init__(self, executor: QuorumExecutor) -> None:  # noqa: D107
        # (Batch's one pipeline is one per master here: nothing of Batch.__init__ applies)
        self._executor = executor
        self._entries: List[Entry] = []

    def script(self, name: str, keys: Tuple[str, ...], args: Tuple[Any, ...]) -> None:
        if name != "lock_renew":
            raise TypeError(f"distlock: script {name} does not run on a Redlock quorum")
        self._entries.append((name, tuple(keys), tuple(args)))

    def command(self, *args: Any) -> None:
        raise TypeError("distlock: a Redlock quorum batches renewals only")

    def __len__(self) -> int:
        return len(self._entries)

    def execute(self, raise_on_error: bool = True) -> List[Any]:
        executor = self._executor
        jobs: Dict[int, List[Entry]] = {}
        where: Dict[int, List[int]] = {}
        parts: List[Optional[_Part]] = []
        replies: List[Any] = [0] * len(self._entries)
        for e, (name, keys, args) in enumerate(self._entries):
            owner, token, ms, fence_ms = args
            part = executor._part(keys[0], str(owner), token)
            parts.append(part)
            if part is None:
                continue  # not a hold this executor granted (any more): gone
            for i, tok in part.tokens.items():
                jobs.setdefault(i, []).append((name, keys, (owner, str(tok), ms, fence_ms)))
                where.setdefault(i, []).append(e)
        sent = time.monotonic()
        out = executor.fanout(jobs, sent + min(REPLY_CAP, settings().renew_interval))
        per_hold: Dict[int, List[Any]] = {}
        for i, got in out.items():
            for k, e in enumerate(where[i]):
                reply = got if isinstance(got, BaseException) else got[k]
                per_hold.setdefault(e, []).append(reply)
                part = parts[e]
                if part is not None and not isinstance(reply, BaseException) and int(reply) == 0:
                    part.tokens.pop(i, None)  # gone there: the quorum only shrinks
        for e, got in per_hold.items():
            part = parts[e]
            assert part is not None
            outcome = tally_renew(got, executor.n)
            if outcome is None:
                answered = sum(1 for r in got if not isinstance(r, BaseException))
                replies[e] = executor._quorum_error(answered)
                continue
            replies[e] = outcome
            ms = int(self._entries[e][2][2])
            if outcome == 1:
                part.until = sent + ms / 1000.0 - executor.margin(ms)
            else:
                executor._drop(self._entries[e][1][0], str(self._entries[e][2][0]), part)
        if raise_on_error:
            for reply in replies:
                if isinstance(reply, Exception):
                    raise reply
        return replies
