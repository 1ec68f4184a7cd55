"""A thread that runs queued jobs in order: started on demand, gone when it has been idle for
``IDLE_EXIT`` seconds. The watchdog hands its I/O to two of these (the renewal rounds, and the
clean-up round trips that releases leave behind), so that the thread that keeps the holds'
deadlines never waits on a socket (docs/design.rst, principle 14)."""

from __future__ import annotations

import collections
import logging
import threading
import time
from typing import Callable, Deque, Optional

__all__ = ["Worker", "IDLE_EXIT"]

log = logging.getLogger("distlock")

#: How long a worker with nothing to do stays before its thread exits (seconds).
IDLE_EXIT = 0.2


class Worker:
    """Runs the jobs given to ``submit`` one after another in a thread of its own. A job must
    catch its own errors; one that raises is logged and the next one runs."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._jobs: Deque[Callable[[], object]] = collections.deque()
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self.closed = False

    def submit(self, job: Callable[[], object]) -> None:
        with self._lock:
            if self.closed:
                return
            self._jobs.append(job)
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name=self.name, daemon=True)
                self._thread.start()
        self._wake.set()

    @property
    def busy(self) -> bool:
        """True while a job is queued or running (the thread may still be waiting to exit)."""
        return bool(self._jobs) or self._running

    _running = False

    def _loop(self) -> None:
        while True:
            try:
                job = self._jobs.popleft()
            except IndexError:
                self._wake.clear()
                if self._jobs:
                    continue
                if not self._wake.wait(IDLE_EXIT) and not self._jobs:
                    with self._lock:
                        if not self._jobs:
                            self._thread = None
                            return
                continue
            self._running = True
            try:
                job()
            except BaseException:  # noqa: BLE001 - one job's failure does not stop the others
                log.exception("distlock: %s: a job failed", self.name)
            finally:
                self._running = False

    def flush(self, timeout: float) -> None:
        """Wait (at most ``timeout`` seconds) until the jobs queued so far have run."""
        deadline = time.monotonic() + timeout
        while self.busy and time.monotonic() < deadline:
            time.sleep(0.002)

    def close(self, join: bool, timeout: float = 3.0) -> None:
        """No more jobs; ``join``: wait (at most ``timeout``) for the one running to end."""
        with self._lock:
            self.closed = True
            self._jobs.clear()
            thread = self._thread
        self._wake.set()
        if join and thread is not None and thread is not threading.current_thread():
            thread.join(timeout)
