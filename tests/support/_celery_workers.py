"""A Celery app for tests/contrib/test_celery.py, and its producer run in a process of its own
(spawn: importable, top-level)."""

from __future__ import annotations

from typing import Any, Dict

from celery import Celery
from celery_once import AlreadyQueued, QueueOnce
from celery_singleton import Singleton

ONCE = "tests.once_add"
SINGLE = "tests.single_add"


_apps: Dict[str, Any] = {}


def make_app(url: str) -> Any:
    """A Celery app on an in-memory broker (no worker: what is queued stays queued) whose
    celery-once and celery-singleton locks are distlock's, on the server at ``url``; one per
    process and URL (Celery warns of a task name registered twice)."""
    if url in _apps:
        return _apps[url]
    app = _apps[url] = Celery("distlock-tests", broker="memory://", set_as_current=False)
    app.conf.ONCE = {"backend": "distlock.contrib.celery.OnceBackend",
                     "settings": {"url": url, "default_timeout": 60}}
    app.conf.singleton_backend_class = "distlock.contrib.celery.SingletonBackend"
    app.conf.singleton_backend_url = url

    @app.task(base=QueueOnce, name=ONCE)
    def once_add(a: int, b: int) -> int:
        return a + b

    @app.task(base=Singleton, name=SINGLE, lock_expiry=60)
    def single_add(a: int, b: int) -> int:
        return a + b

    return app


def produce(url: str, conn: Any) -> None:
    """Queue each task once, try to queue it again, report, and exit: the locks stay taken
    after this process is gone, for the worker (another process) to clear."""
    import celery_singleton.backends

    celery_singleton.backends._backend = None
    app = make_app(url)
    once, single = app.tasks[ONCE], app.tasks[SINGLE]
    once.apply_async(args=(1, 2))
    try:
        once.apply_async(args=(1, 2))
        countdown = None
    except AlreadyQueued as queued:
        countdown = queued.countdown
    first = single.apply_async(args=(1, 2))
    again = single.apply_async(args=(1, 2))
    conn.send({"once_key": once.get_key(args=(1, 2)), "countdown": countdown,
               "single_lock": single.generate_lock(SINGLE, [1, 2]), "first": first.id,
               "again": again.id})


def lock_for_the_worker(url: str, key: str, conn: Any) -> None:
    """As a producer would: take celery-once's lock through the backend, send its handle and
    token to the worker (another process), and exit."""
    import distlock
    from distlock.contrib.celery import OnceBackend

    handle = OnceBackend({"url": url}).raise_or_lock(key, timeout=60)
    lock = distlock.DistLock(key, client=url)
    conn.send((handle, lock.holder()))
