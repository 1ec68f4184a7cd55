"""The asyncio shell's port on a Redlock quorum (``distlock.asyncio.DistLock(name, client=[...])``
with ``redis.asyncio.Redis`` masters).

The same port as on one server (``aport.AsyncPort``), with the Redlock executor's rules
(``executor_quorum``):

- ``session`` is the blocking Redlock session of a quorum of blocking twins of the masters: its
  executor keeps what is known of each master (since when it is up, its scripts, whether it
  could be reached) and each hold's per-master tokens, and its watchdog thread renews the
  holds on the masters, as for the blocking classes.
- A script runs the executor's *plan* (``QuorumExecutor.plan``), driven here with an asyncio
  fan-out: every master's connection (from that master's own asyncio pool) is written first,
  then every reply is read, concurrently, against one deadline, and a master that did not
  answer gets the undo written behind the try on the same connection. What to write, what a
  reply teaches and what to send again are the executor's steps (``prepare``, ``absorb``,
  ``reloads``, from ``fanout_quorum.FanOut``): one copy of the rules for both shells.
- Waiters wait in an ``AsyncQuorumDispatcher``: one ``AsyncDispatcher`` (a pub/sub connection
  and a reader task) per master, a waiter in each, all sharing one event: a hint from any
  master wakes it (what it shares with the blocking one: ``pubsub_quorum.Boards``).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Dict, List, Optional, Tuple

import redis

from .._core.quorum import REPLY_CAP, made
from .aport import AsyncPort, blocking_twin
from .apubsub import AsyncDispatcher
from .direct import packer, taker
from .executor import NOSCRIPT_TRIES, located
from .executor_quorum import QuorumExecutor
from .failpoints import BEFORE, LATE, injected
from .fanout_quorum import Entry, Plan, T, late, merge, unsent
from .pubsub import Waiter
from .pubsub_quorum import Boards

__all__ = ["AsyncQuorumPort", "AsyncQuorumDispatcher"]

#: ``asyncio.timeout`` (Python 3.11+)
_timeout: Any = getattr(asyncio, "timeout", None)


class AsyncQuorumPort(AsyncPort):
    """``AsyncPort`` for a quorum of ``redis.asyncio.Redis`` masters (see the module's
    docstring)."""

    def _make_twin(self, client: Any) -> Any:
        return made([blocking_twin(master) for master in client.masters])

    def _connection_kwargs(self, client: Any) -> Dict[str, Any]:
        return client.masters[0].connection_pool.connection_kwargs  # type: ignore[no-any-return]

    def _attach(self, client: Any) -> None:
        #: per master: how to take and give back a connection of its pool, and the packer
        self._pools = [(taker(m.connection_pool), m.connection_pool.release,
                        packer(m.connection_pool.get_encoder())) for m in client.masters]
        proxy = self._client  # never a bound method of the client: that would keep it alive
        self.dispatcher = AsyncQuorumDispatcher(  # type: ignore[assignment]
            [_opener(proxy, i) for i in range(len(client.masters))])

    @property
    def quorum(self) -> QuorumExecutor:
        executor: QuorumExecutor = self.session.executor
        return executor

    # --- the ops ----------------------------------------------------------------------------

    async def run(self, name: str, keys: Tuple[str, ...], args: Tuple[Any, ...],
                  acks: Optional[Tuple[int, int]] = None) -> Any:
        """The executor's plan of script ``name``, driven with the asyncio fan-out (at most
        ``SCRIPT_CONCURRENCY`` at once, as on one server). ``acks`` (min_replicas' WAIT) has
        no meaning on independent masters: a TypeError, as the blocking executor's."""
        if acks is not None:
            raise TypeError("min_replicas does not apply to a Redlock quorum (a list of masters)")
        if self._free > 0:
            self._free -= 1
        else:
            await self._gate_wait()
        try:
            return await self._drive(self.quorum.plan(name, keys, args))
        except redis.exceptions.ResponseError as exc:
            raise located(name, exc) from None
        finally:
            self._free += 1
            if self._gate_waiters:
                self._wake_next()

    async def read(self, *command: Any) -> Any:
        return await self._drive(self.quorum.read_plan(*command))

    async def _drive(self, plan: Plan[T]) -> T:
        try:
            request = next(plan)
            while True:
                try:
                    out = await self.fanout(*request)
                except BaseException as exc:  # noqa: BLE001 - a cancellation included: the plan undoes
                    request = plan.throw(exc)
                else:
                    request = plan.send(out)
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]

    async def fanout(self, jobs: Dict[int, List[Entry]], deadline: float,
                     undo: Optional[Entry] = None) -> Dict[int, Any]:
        """``QuorumExecutor.fanout`` on the masters' asyncio connections (a test's failpoints
        apply per master, as there)."""
        failpoints = self.failpoints
        faults = failpoints.fanout(jobs)[1] if failpoints is not None else None
        out = await self._round(jobs, deadline, undo, faults)
        for _ in range(NOSCRIPT_TRIES):
            again, where = self.quorum.reloads(jobs, out)
            if not again:
                break
            merge(out, where, await self._round(again, deadline, undo))
        return out

    async def _round(self, jobs: Dict[int, List[Entry]], deadline: float,
                     undo: Optional[Entry], faults: Optional[Dict[int, str]] = None) -> Dict[int, Any]:
        executor = self.quorum
        out: Dict[int, Any] = {}
        sent: List[Tuple[Any, Any, List[Tuple[str, str]], int]] = []
        tasks: List[asyncio.Future[List[Any]]] = []
        try:
            for i, entries in jobs.items():
                master = executor.masters[i]
                skip = executor.skipped(master)
                if not entries or skip is not None:
                    out[i] = skip if skip is not None else []
                    continue
                if faults and faults.get(i) == BEFORE:
                    out[i] = unsent(injected(BEFORE))
                    continue
                take, give, _ = self._pools[i]
                try:
                    conn = await self._connect(take, give, deadline)
                except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, OSError) as exc:
                    out[i] = executor.unreached(master, exc)
                    continue
                fresh = getattr(conn, "_distlock_writer", None) is not conn._writer
                prefix, packed = executor.prepare(master, entries, fresh)
                try:
                    await conn.send_packed_command([packed], check_health=False)
                except BaseException as exc:
                    await conn.disconnect(nowait=True)
                    await give(conn)
                    if not isinstance(exc, Exception):
                        raise
                    exc.unsent = True  # type: ignore[attr-defined]  # the last command is incomplete
                    out[i] = exc
                    continue
                sent.append((master, conn, prefix, len(entries)))
            # Every reply is read by a task of its own, which is never cancelled before the
            # undo is written behind its try: redis-py closes a connection whose read is
            # cancelled, and the undo must go on that very connection (see ``fanout``).
            tasks = [asyncio.ensure_future(self._read(conn, len(prefix) + count))
                     for _, conn, prefix, count in sent]
            if tasks:
                await asyncio.wait(tasks, timeout=max(0.0, deadline - time.monotonic()))
        except BaseException:
            # cancelled with replies unread: the undo behind each try, then give every
            # connection up (a reply may still be on its way)
            for k, (master, conn, _, _) in enumerate(sent):
                if k < len(tasks) and not tasks[k].done() and undo is not None:
                    await self._send_behind(master, conn, undo)
                if k < len(tasks):
                    tasks[k].cancel()
                await conn.disconnect(nowait=True)
                await self._pools[master.index][1](conn)
            raise
        for (master, conn, prefix, _), task in zip(sent, tasks):
            give = self._pools[master.index][1]
            got: Any
            if not task.done():
                got = redis.exceptions.TimeoutError("no reply in time")
                if undo is not None:
                    got.undone = await self._send_behind(master, conn, undo)
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
            else:
                got = task.exception() if not task.cancelled() else asyncio.CancelledError()
                if got is None:
                    got = task.result()
            if isinstance(got, BaseException):
                await conn.disconnect(nowait=True)
                await give(conn)
                if not isinstance(got, Exception):
                    raise got
                out[master.index] = got
                continue
            fault = faults.get(master.index) if faults else None
            undone = False
            if fault == LATE and undo is not None:  # as a real late reply leaves it (``fanout``)
                undone = await self._undo_now(master, conn, undo)
            await give(conn)
            out[master.index], known = executor.absorb(master, prefix, got)
            if known:
                conn._distlock_writer = conn._writer
            if fault is not None:  # it ran; its reply is dropped (see ``_redis.failpoints``)
                out[master.index] = late(injected(fault), undone)
        return out

    async def _undo_now(self, master: Any, conn: Any, entry: Entry) -> bool:
        """A failpoint's late reply: the undo written behind the try, and its reply read."""
        if not await self._send_behind(master, conn, entry):
            return False
        try:
            await self._bounded(self._read(conn, 1), REPLY_CAP)
        except Exception:  # noqa: BLE001 - written behind the try: the server runs it anyway
            await conn.disconnect(nowait=True)
        return True

    async def _connect(self, take: Any, give: Any, deadline: float) -> Any:
        """A connection of one master's pool, connected (at most ``REPLY_CAP``)."""
        bound = max(0.05, min(REPLY_CAP, deadline - time.monotonic()))
        conn = await self._bounded(take(), bound)
        try:
            reader = getattr(conn, "_reader", None)
            if reader is None or reader.at_eof():
                await conn.disconnect(nowait=True)
                await self._bounded(conn.connect(), bound)
        except BaseException:
            await give(conn)
            raise
        return conn

    @staticmethod
    async def _read(conn: Any, count: int) -> List[Any]:
        got: List[Any] = []
        for _ in range(count):
            try:
                got.append(await conn.read_response())
            except redis.exceptions.ResponseError as exc:
                got.append(exc)  # the whole reply was read: the connection is clean
        return got

    async def _send_behind(self, master: Any, conn: Any, entry: Entry) -> bool:
        try:
            await conn.send_packed_command(self.quorum.behind(master, entry), check_health=False)
        except Exception:  # noqa: BLE001 - the connection broke: the server has what it got
            return False
        return True


def _opener(proxy: Any, i: int) -> Any:
    def opener() -> Any:
        return proxy.masters[i].pubsub()
    return opener


class AsyncQuorumDispatcher(Boards):
    """``pubsub_quorum.QuorumDispatcher`` for one event loop: an ``AsyncDispatcher`` per
    master, a waiter in each, sharing the first one's event."""

    def __init__(self, openers: List[Any]) -> None:
        super().__init__([AsyncDispatcher(opener) for opener in openers])

    async def join(self, channel_name: str, bound: Optional[float], ident: Optional[str] = None) -> Any:
        inner: List[Waiter] = []
        try:
            for board in self._boards:
                inner.append(await board.join(channel_name, 0, ident))
            fan = self._share_event(inner)
            deadline = self._wait_bound(bound)
            if deadline is not None:
                confirmed = 0
                for waiter in inner:
                    await waiter.channel.confirmed.wait(max(0.0, deadline - time.monotonic()))
                    if waiter.channel.confirmed.is_set():
                        confirmed += 1
                        if confirmed >= self._required:
                            break
        except BaseException:
            self._leave_partial(inner)
            raise
        return fan

    async def sleep(self, fan: Any, head_bound: float, limit: Optional[float] = None) -> bool:
        started = time.monotonic()
        while (left := self._left(fan, started, head_bound, limit)) > 0:
            await fan.inner[0].event.wait(left)
            fan.inner[0].event.clear()
        return self._take_hint(fan)

    def close(self) -> None:
        self.closed = True
        for board in self._boards:
            board.close()
