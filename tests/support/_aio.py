"""Blocking views of asyncio primitives, so that a contract suite written for threads also runs
against ``distlock.asyncio``.

``AioRunner`` runs one event loop in a thread. Each thread that calls through it gets an
*actor*: one task of that loop that runs the thread's calls one after another. So a test thread
stands for one task throughout (a task-owned ``DistRLock`` re-enters from the same test
thread, and is another owner from another test thread), and a blocking call blocks only its
own thread, while the loop serves the others.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import itertools
import threading
from typing import Any, Callable, Dict, List, Optional

import redis
import redis.asyncio as aredis

from distlock._redis.urls import async_client_from_url
from distlock.testing.sentinel import aclose_sentinel

BOUND = 60.0
_names = itertools.count(1)


class AioRunner:
    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name="test-aio-loop", daemon=True)
        self._thread.start()
        self._actors: Dict[int, asyncio.Queue[Any]] = {}
        self._tasks: list = []
        self._mutex = threading.Lock()
        self.clients: list = []

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def run(self, coro: Any, bound: float = BOUND) -> Any:
        """Run ``coro`` in a task of its own; wait for its result."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(bound)

    def call(self, fn: Callable[[], Any], bound: Optional[float] = BOUND) -> Any:
        """Call ``fn()`` in the calling thread's actor task; await its result if awaitable."""
        queue = self._actor()
        done: concurrent.futures.Future = concurrent.futures.Future()
        self.loop.call_soon_threadsafe(queue.put_nowait, (fn, done))
        return done.result(bound)

    def _actor(self) -> asyncio.Queue[Any]:
        ident = threading.get_ident()
        with self._mutex:
            queue = self._actors.get(ident)
            if queue is None:
                queue = self._actors[ident] = self.run(_make_queue())
                self._tasks.append(asyncio.run_coroutine_threadsafe(_serve(queue), self.loop))
        return queue

    def client(self, url: str, **kwargs: Any) -> aredis.Redis:
        """A new asyncio client of ``url``, made in the loop's thread: on Python 3.9 an asyncio
        lock binds to the loop current where it is made (not where it is first used), and a
        client made here, in the test's thread, would hand its pool's lock to another loop."""
        kwargs.setdefault("client_name", f"aio-test-{next(_names)}")

        async def make() -> Any:
            return async_client_from_url(url, **kwargs)
        made = self.run(make())
        self.clients.append(made)
        return made

    def close(self) -> None:
        for task in self._tasks:
            task.cancel()

        async def finish() -> None:
            await asyncio.sleep(0)
            # the loop's own tasks (pub/sub readers): let them end, then cancel what is left
            for _ in range(150):
                rest = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
                if not rest:
                    break
                await asyncio.sleep(0.02)
            for task in asyncio.all_tasks():
                if task is not asyncio.current_task():
                    task.cancel()
            await asyncio.sleep(0)
            for made in self.clients:
                close = getattr(made, "aclose", None) or made.close
                await close()
                # a Sentinel master client (a redis+sentinel:// URL's) leaves its Sentinel's
                # own connections to the sentinels open
                manager = getattr(getattr(made, "connection_pool", None), "sentinel_manager", None)
                if manager is not None:
                    await aclose_sentinel(manager)

        try:
            self.run(finish(), 10)
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(10)
            self.loop.close()


async def _make_queue() -> asyncio.Queue[Any]:
    return asyncio.Queue()


async def _serve(queue: asyncio.Queue[Any]) -> None:
    while True:
        fn, done = await queue.get()
        try:
            result = fn()
            if inspect.isawaitable(result):
                result = await result
        except BaseException as exc:  # noqa: BLE001 - handed back to the calling thread
            done.set_exception(exc)
            if isinstance(exc, asyncio.CancelledError):
                raise
        else:
            done.set_result(result)


class SyncView:
    """A blocking view of an asyncio primitive: every attribute is read, and every method
    called, in the calling thread's actor task; awaitables are awaited there."""

    def __init__(self, prim: Any, runner: AioRunner) -> None:
        object.__setattr__(self, "_prim", prim)
        object.__setattr__(self, "_runner", runner)

    @property
    def prim(self) -> Any:
        return self._prim

    def __getattr__(self, name: str) -> Any:
        prim, runner = self._prim, self._runner
        value = runner.call(lambda: getattr(prim, name))
        if callable(value) and not isinstance(value, type):
            def method(*args: Any, **kwargs: Any) -> Any:
                return runner.call(lambda: value(*args, **kwargs))
            return method
        return value

    def __enter__(self) -> Any:
        return self._runner.call(lambda: self._prim.__aenter__())

    def __exit__(self, *exc_info: Any) -> Any:
        return self._runner.call(lambda: self._prim.__aexit__(*exc_info))

    def __repr__(self) -> str:
        return str(self._runner.call(lambda: repr(self._prim)))


def async_twin_client(runner: AioRunner, client: Any, url: Optional[str]) -> Any:
    """The asyncio client of the server ``client`` talks to (a new one)."""
    if url is None or not isinstance(client, redis.Redis):
        raise RuntimeError("the asyncio shell needs a real server")
    return runner.client(url)


def run_in_loop(url: str, body: Callable[[Any], Any], bound: float = 20.0,
                client_name: Optional[str] = None) -> Any:
    """Run ``body(aclient)`` in a fresh loop, at most ``bound`` seconds, with an asyncio
    client of ``url`` (named ``client_name``); let distlock's reader tasks end, then close the
    client, before the loop closes."""
    async def main() -> Any:
        kwargs = {} if client_name is None else {"client_name": client_name}
        aclient = async_client_from_url(url, **kwargs)
        try:
            return await asyncio.wait_for(body(aclient), bound)
        finally:
            for _ in range(150):
                if len(asyncio.all_tasks()) <= 1:
                    break
                await asyncio.sleep(0.02)
            await aclient.aclose()
    return asyncio.run(main())


def keys(client: redis.Redis, name: str) -> List[str]:
    """The keys of primitive ``name``, sorted."""
    return sorted(k.decode() for k in client.keys(f"distlock:{{{name}}}*"))

