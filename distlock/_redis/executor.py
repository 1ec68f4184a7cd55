"""The executor: the one interface through which the primitives reach Redis.

Three kinds of traffic, three methods, and the retry policy of each is decided here:

- ``run(name, keys, args)``: one script, a state change. **Never sent twice**: a script whose
  reply was lost may have run, and running it again could take a second hold, release twice,
  or report a release as a lost lease; the caller learns the outcome by reading state (docs/design.rst,
  principle 13). Scripts go out on the direct path below, which has no retries, for every
  client on a redis-py connection pool: a plain client, a Sentinel client (its pool hands out
  the master's connections), a single-connection client, and a subclass that overrides
  ``execute_command`` (its override sees distlock's reads, not its scripts: an override that
  retries would send a state change twice). Only fakeredis, which has no network and so no
  lost replies, is driven through its ``execute_command``. NOSCRIPT (a restarted server, SCRIPT
  FLUSH) means the script did not run: it is loaded and sent again, and the last try sends the
  script's body (EVAL), which cannot answer NOSCRIPT. A Redis error names the
  script's file and line (see ``_redis.scripts.locate``).
- ``read(*command)``: one command that is safe to repeat (EXISTS, HGET, HMGET, ZSCORE,
  ZREM of our own entry, TIME); it goes through the client, retries and all.
- ``batch()``: a pipeline of scripts and commands in one round trip (a reader's look at its
  hold) on the executor's connections; ``renewal_batch()``: the same on the watchdog's own
  connection (``_redis.clients.renewer``: not from the user's pool, bounded by the renew interval,
  no hidden retries). Renewals are safe to repeat.
- ``pubsub()``: a new pub/sub connection, for the session's dispatcher.

``run(..., acks=(k, ms))`` sends ``WAIT k ms`` behind the script, packed with it in one write on
the same connection, and returns ``(reply, replicas that acknowledged)``: the grant of a
primitive made with ``min_replicas`` (see ``_core.replicas``). redis-py's ``client.wait()`` could
take another pooled connection, whose WAIT would say nothing of this script's writes.
``Batch.wait(k, ms)`` does the same at the end of a batch (the watchdog's renewals).

This is the standalone executor, and ``executor_for`` is the one place that picks an executor
for a client, behind the same methods: a ``redis.RedisCluster`` gets the Cluster executor
(``_redis.executor_cluster``: routed by the keys' slot, MOVED, ASK and TRYAGAIN followed, one batch
pipeline per node, one dispatcher per node), a list of independent masters (a ``_core.quorum.Quorum``)
the Redlock executor (``_redis.executor_quorum``: every script to every master at once, the replies
folded into one), every other client this one. A topology's executor
overrides ``_send`` (how one script goes out) and ``dispatcher`` (how waiters wait).
"""

from __future__ import annotations

import threading
import weakref
from typing import Any, Callable, Dict, List, Optional, Set, Tuple

import redis
from redis.commands.core import Script

from .._core.settings import settings
from .clients import DEFAULT_IO_TIMEOUT, listener, renewer
from .direct import (
    HotLender,
    closed_idle,
    disconnect_quietly,
    idle_sockets,
    lender,
    pair_sender,
    sender,
    taker,
    unbounded,
)
from .failpoints import FailPoints
from .scripts import locate, script_names, script_source

__all__ = ["Executor", "Batch", "SCRIPT_CONCURRENCY", "NOSCRIPT_TRIES", "located", "demoted",
           "Unauthenticated"]

#: How many scripts one executor has in flight at once (its connections stay at most this many,
#: plus the pub/sub and watchdog ones).
SCRIPT_CONCURRENCY = 4

#: How many times ``run`` loads a script again after NOSCRIPT before it gives up.
NOSCRIPT_TRIES = 3


class Executor:
    """Runs scripts and commands on one standalone server (or Sentinel's current master)."""

    #: a release may hand a default lock to a waiter of its own process (``lock_release``)
    hands_off = True

    def __init__(self, client: Any, real: Any = None, own_pool: bool = False) -> None:
        """``client``: what to talk through (perhaps a weak proxy of the user's client);
        ``real``: the client itself, when ``client`` is a proxy of it; ``own_pool``: the
        session made ``client``'s pool itself (see ``direct.lender``)."""
        self.client = client
        # Script objects bound to ``client`` itself: ``client.register_script`` would bind them
        # to the object behind a weak proxy, and keep the user's client alive for ever.
        self.scripts = {name: Script(client, script_source(name)) for name in script_names()}
        #: where the direct path takes its connections (``direct.lender``): used ones are kept
        #: out of redis-py's pool between scripts, and given back on ``close``
        actual = client if real is None else real
        self._lent = lender(actual, own_pool)
        self._execute = sender(self._lent, client)
        self._execute_pair = pair_sender(self._lent, client)
        #: its connections would wait for ever for a reply (``socket_timeout=None``)
        self._unbounded = unbounded(actual)
        #: Free run slots (see ``run``): a list used as a GIL-atomic token pool, with a
        #: condition only for the rare caller that finds it empty.
        self._gate: List[None] = [None] * SCRIPT_CONCURRENCY
        self._gate_cond = threading.Condition(threading.Lock())
        self._gate_waiting = 0
        self._renewer: Any = None  # (renew interval, client), made on the first renewal
        self._bounded: Any = None  # what ``batch`` sends through, made on its first use
        #: sockets of the watchdog's connection already reported closed (``renewal_reset``)
        self._reset_seen: weakref.WeakSet[Any] = weakref.WeakSet()
        #: scripts loaded before their first run with ``acks`` (see ``run``)
        self._preloaded: Set[str] = set()
        #: the tests' seam (``_redis.failpoints``): None unless a test installs one
        self.failpoints: Optional[FailPoints] = None

    def run(self, name: str, keys: Tuple[str, ...], args: Tuple[Any, ...],
            acks: Optional[Tuple[int, int]] = None) -> Any:
        """Run script ``name`` as one EVALSHA and return its reply (see the module's docstring).

        With ``acks`` (k, ms): send ``WAIT k ms`` behind it, in the same write on the same
        connection, and return ``(reply, how many replicas acknowledged)``.

        At most ``SCRIPT_CONCURRENCY`` runs are in flight at once, so a hundred threads
        arriving together do not open a hundred connections.
        """
        script = self.scripts[name]
        gate = self._gate
        try:
            gate.pop()  # atomic under the GIL: the uncontended path never blocks here
        except IndexError:
            self._gate_wait()
        try:
            failpoints = self.failpoints
            if failpoints is not None:
                return self._failing(failpoints, name, script, keys, args, acks)
            if acks is None:
                return self._send(name, script, keys, args)
            if name not in self._preloaded:
                # A WAIT blocks while a replica lags even when nothing was written before it
                # (Redis 7), so a NOSCRIPT answer would cost a whole timeout before the real
                # run: load the script first (safe to repeat; on a cluster, on every master).
                self.client.script_load(script.script)
                self._preloaded.add(name)
            return self._send(name, script, keys, args, ("WAIT", *acks))
        except redis.exceptions.ResponseError as exc:
            raise located(name, exc) from None
        finally:
            gate.append(None)
            if self._gate_waiting:
                with self._gate_cond:
                    self._gate_cond.notify()

    def _failing(self, failpoints: FailPoints, name: str, script: Any, keys: Tuple[str, ...],
                 args: Tuple[Any, ...], acks: Optional[Tuple[int, int]]) -> Any:
        """``run``'s send, through a test's failpoints (``_redis.failpoints``)."""
        def send() -> Any:
            if acks is None:
                return self._send(name, script, keys, args)
            if name not in self._preloaded:
                self.client.script_load(script.script)
                self._preloaded.add(name)
            return self._send(name, script, keys, args, ("WAIT", *acks))
        return failpoints.around(name, keys, args, send)

    def _send(self, name: str, script: Any, keys: Tuple[str, ...], args: Tuple[Any, ...],
              then: Optional[Tuple[Any, ...]] = None) -> Any:
        """Send one script once (see the module's docstring); a topology's executor routes it.
        ``then``: a command sent behind it in the same write (``run``'s WAIT); the reply is
        then both replies.

        A Sentinel client's connection to a master that was demoted meanwhile answers READONLY
        (``demoted``): nothing was written, and the connection is dropped, so the script goes
        once more, on a connection that looks the master up afresh."""
        followed = False
        for _ in range(NOSCRIPT_TRIES):
            try:
                if then is None:
                    return self._execute("EVALSHA", script.sha, len(keys), *keys, *args)
                return self._execute_pair(("EVALSHA", script.sha, len(keys), *keys, *args), then)
            except redis.exceptions.NoScriptError:
                # Another SCRIPT FLUSH may land between the load and the run: try again.
                script.sha = self.client.script_load(script.script)
            except redis.exceptions.ConnectionError as exc:
                if followed or not demoted(exc):
                    raise
                followed = True
                # ask the sentinels now: a new master drops the pool's idle connections,
                # which all talk to the demoted one
                self.client.connection_pool.get_master_address()
        # A SCRIPT FLUSH came between every load and its run (NOSCRIPT: nothing ran): send the
        # body itself, which cannot answer NOSCRIPT. An EVALSHA once more could, and did, under
        # a flush every 10 ms on a loaded machine.
        if then is None:
            return self._execute("EVAL", script.script, len(keys), *keys, *args)
        return self._execute_pair(("EVAL", script.script, len(keys), *keys, *args), then)

    def _gate_wait(self) -> None:
        """Block until a run slot is free (all ``SCRIPT_CONCURRENCY`` are in flight).

        A returning run appends its slot before it reads ``_gate_waiting``, and a waiter counts
        itself before it tries to take a slot, so no wake-up is lost between the two; the short
        wait bound is only a second line of defence."""
        with self._gate_cond:
            self._gate_waiting += 1
            try:
                while True:
                    try:
                        self._gate.pop()
                        return
                    except IndexError:
                        self._gate_cond.wait(0.05)
            finally:
                self._gate_waiting -= 1

    def read(self, *command: Any) -> Any:
        """One command that is safe to repeat (see the module's docstring). A client whose
        connections have no socket timeout reads on the direct path, bounded (``read_bounded``)."""
        if self._unbounded:
            return self._execute(*command)
        return self.client.execute_command(*command)

    def batch(self) -> Batch:
        """A pipeline on the executor's own connections; where those have no socket timeout,
        on a twin of them whose every command gives up after ``DEFAULT_IO_TIMEOUT`` (every
        round trip distlock makes is bounded, docs/safety.rst)."""
        return Batch(self.scripts, self._bounded_client())

    def _bounded_client(self) -> Any:
        made = self._bounded
        if made is None:
            with self._gate_cond:
                made = self._bounded
                if made is None:
                    twin = renewer(self.client, DEFAULT_IO_TIMEOUT) if self._unbounded else None
                    made = self._bounded = self.client if twin is None else twin
        return made

    def renewal_batch(self) -> Batch:
        """A pipeline on the watchdog's own connection (see the module's docstring); it is
        remade when configure() changed the renew interval. Called from one thread only (the
        watchdog's renewal worker)."""
        return Batch(self.scripts, self._renewal_client())

    def _renewal_client(self) -> Any:
        interval = settings().renew_interval
        current = self._renewer
        if current is None or current[0] != interval:
            twin = renewer(self.client, interval)
            self._renewer = (interval, self.client if twin is None else twin)
            if current is not None and current[1] is not self.client:
                disconnect_quietly(current[1])
        return self._renewer[1]

    def open_renewal(self) -> bool:
        """Connect the watchdog's own connection now (on the renewal worker, when a session
        gets its first hold), so that a reset of it can be seen before the first renewal
        (``renewal_reset``); True when it did. A client that renews through its own pool is
        left alone (False)."""
        client = self._renewal_client()
        pool = getattr(client, "connection_pool", None)
        if client is self.client or not isinstance(pool, redis.ConnectionPool):
            return False
        conn = taker(pool)()
        pool.release(conn)
        current = self._renewer
        if current is None or current[1] is not client:
            disconnect_quietly(client)  # dropped while it connected: it must not stay open
        return True

    def renewal_reset(self, then: Optional[Callable[[], object]] = None) -> bool:
        """True when the server closed an idle connection of the watchdog's own since this was
        last asked (a restart, a failover, a dropped link), each such connection once; ``then``
        runs before they are marked as seen, so that no thread that looks meanwhile is told
        "no reset" before it has been acted on. No I/O: a non-blocking peek at each idle
        socket, from any thread."""
        found: List[Any] = []
        for pool in self._renewal_pools():
            found += closed_idle(pool, self._reset_seen)
        if found and then is not None:
            then()
        for sock in found:
            self._reset_seen.add(sock)
        return bool(found)

    def renewal_sockets(self) -> List[Any]:
        """The sockets ``renewal_reset`` would look at: the watchdog thread's wait ends when
        one turns readable, so that a server that closes it is seen at once, not at the
        thread's next look. No I/O."""
        found: List[Any] = []
        for pool in self._renewal_pools():
            found += idle_sockets(pool, self._reset_seen)
        return found

    def _renewal_pools(self) -> List[Any]:
        """The pools of the watchdog's own connections (none while it renews through the
        session's client)."""
        current = self._renewer
        if current is None or current[1] is self.client:
            return []
        return [current[1].connection_pool]

    def margin(self, lease_ms: int) -> float:
        """How much sooner than ``lease_ms`` after it was sent a grant or renewal must be taken
        as ended (seconds): 0 here; a Redlock quorum's clock drift (``_redis.executor_quorum``)."""
        return 0.0

    def cool_with(self, wake: Callable[[], object]) -> None:
        """Keep the direct path's used connections out of the pool (``HotLender``), ``wake()``
        making sure that ``cool`` is called from then on."""
        if isinstance(self._lent, HotLender):
            self._lent.cool_with(wake)

    def cool_due(self, force: bool = False) -> bool:
        """Whether ``cool`` has connections to give back (no I/O: the watchdog thread asks)."""
        return isinstance(self._lent, HotLender) and self._lent.due(force)

    def cool(self, force: bool = False) -> None:
        """Give the kept connections that went unused back to the pool (``force``: all)."""
        if isinstance(self._lent, HotLender):
            self._lent.cool(force)

    def close(self) -> None:
        """The session is retired: close what the executor opened itself (the bounded twin
        of ``batch``, if it made one), and give back the connections kept out of the pool."""
        if isinstance(self._lent, HotLender):
            self._lent.close()
        made, self._bounded = self._bounded, None
        if made is not None and made is not self.client:
            disconnect_quietly(made)

    def drop_renewal(self) -> None:
        """Close the watchdog's own connection (it is made again when needed)."""
        current, self._renewer = self._renewer, None
        if current is not None and current[1] is not self.client:
            disconnect_quietly(current[1])

    def pubsub(self) -> Any:
        """A new pub/sub connection (redis-py's PubSub) for the session's dispatcher, through a
        twin of the client that never retries (``clients.listener``): the dispatcher does."""
        twin = listener(self.client)
        return (self.client if twin is None else twin).pubsub()

    def dispatcher(self, source: Callable[[], Any], tag: str) -> Any:
        """The session's dispatcher (``source`` is called for the executor to open pub/sub
        connections through)."""
        from .dispatcher import Dispatcher
        return Dispatcher(source, tag)


class Batch:
    """Scripts and commands queued for one round trip; ``execute`` sends them. A script's
    error in the replies names the script's file and line, as ``run``'s do."""

    __slots__ = ("_scripts", "_client", "_pipe", "_names", "_calls", "_wait", "acked")

    def __init__(self, scripts: Dict[str, Any], client: Any) -> None:
        self._scripts = scripts
        self._client = client
        self._pipe = client.pipeline(transaction=False)
        self._names: List[str] = []  # per queued entry: its script's name, or ''
        #: per queued entry: a script's (keys, args), or None for a command
        self._calls: List[Optional[Tuple[Tuple[str, ...], Tuple[Any, ...]]]] = []
        self._wait: Optional[Tuple[int, int]] = None
        #: after ``execute``, with ``wait``: per entry, WAIT's reply on its connection (a
        #: count, or the error it met); None without ``wait``
        self.acked: Optional[List[Any]] = None

    def wait(self, k: int, ms: int) -> None:
        """End the round trip with ``WAIT k ms`` on the same connection (after every entry):
        ``acked`` then says how many replicas acknowledged the entries' writes."""
        self._wait = (k, ms)

    def script(self, name: str, keys: Tuple[str, ...], args: Tuple[Any, ...]) -> None:
        # redis-py's Script on a pipeline loads itself before the pipeline runs (NOSCRIPT-safe)
        self._scripts[name](keys=keys, args=args, client=self._pipe)
        self._names.append(name)
        self._calls.append((tuple(keys), tuple(args)))

    def command(self, *args: Any) -> None:
        self._pipe.execute_command(*args)
        self._names.append("")
        self._calls.append(None)

    def __len__(self) -> int:
        return len(self._names)

    def execute(self, raise_on_error: bool = True) -> List[Any]:
        """The replies, in order; with ``raise_on_error`` false, errors among them."""
        if self._wait is not None:
            self._pipe.execute_command("WAIT", *self._wait)
        raw = self._pipe.execute(raise_on_error=False)
        if self._wait is not None:
            self.acked = [raw.pop()] * len(self._names)
        self._again(raw)
        replies = [located(name, reply) if name and isinstance(reply, redis.exceptions.ResponseError)
                   else reply
                   for name, reply in zip(self._names, raw)]
        if raise_on_error:
            for reply in replies:
                if isinstance(reply, Exception):
                    raise reply
        return replies

    def _again(self, raw: List[Any]) -> None:
        """The scripts that answered NOSCRIPT (a SCRIPT FLUSH came between the pipeline's
        load and its run: they did not run) go once more, each with its body (EVAL, which
        cannot answer NOSCRIPT), in one more round trip; their replies replace the errors."""
        again = [i for i, (name, reply) in enumerate(zip(self._names, raw))
                 if name and isinstance(reply, redis.exceptions.NoScriptError)]
        if not again:
            return
        pipe = self._client.pipeline(transaction=False)
        for i in again:
            call = self._calls[i]
            assert call is not None
            keys, args = call
            pipe.execute_command("EVAL", self._scripts[self._names[i]].script, len(keys),
                                 *keys, *args)
        if self._wait is not None:
            pipe.execute_command("WAIT", *self._wait)
        more = pipe.execute(raise_on_error=False)
        if self._wait is not None:
            acked = more.pop()
            assert self.acked is not None
            for i in again:
                self.acked[i] = acked
        for i, reply in zip(again, more):
            raw[i] = reply


def demoted(exc: BaseException) -> bool:
    """Whether ``exc`` is redis-py's Sentinel connection telling that the master it talked to
    answered READONLY (it was demoted to a replica): a ConnectionError raised while handling a
    ReadOnlyError. A replica refuses every write, so the script wrote nothing: like a
    redirection, it may be sent again (docs/design.rst, principle 13), on a new connection."""
    return isinstance(exc, redis.exceptions.ConnectionError) and \
        isinstance(exc.__context__, redis.exceptions.ReadOnlyError)


class Unauthenticated(redis.exceptions.AuthenticationError, redis.exceptions.ResponseError):
    """A script the server refused for want of a password: an AuthenticationError to the
    caller, and an error reply to a flow (the script did not run: nothing to undo)."""


def located(name: str, exc: redis.exceptions.ResponseError) -> redis.exceptions.RedisError:
    """``exc`` with its line numbers in the script's own files (see ``_redis.scripts.locate``);
    AuthenticationError for a server that refused the script for want of a password (Redis 7
    answers a long command of an unauthenticated client with a protocol error, not NOAUTH,
    and closes the connection; redis-py before 8 does not fail at connect)."""
    if str(exc).startswith("Protocol error: unauthenticated"):
        return Unauthenticated(
            f"the server asks for a password, and this client gave none that it took ({exc})")
    message = locate(name, str(exc))
    if message == str(exc):
        return exc
    try:
        return type(exc)(message)
    except Exception:  # noqa: BLE001 - an error class that wants more: keep the original
        return exc


# --- the direct path --------------------------------------------------------------------------


