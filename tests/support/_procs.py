"""Child processes for cross-process tests: started with the spawn method, talked to through
pipes, always joined (and killed if they linger) by the ``children`` fixture in conftest.py."""

from __future__ import annotations

import multiprocessing
import os
import warnings
from typing import Any, Callable, List, Tuple

SPAWN = multiprocessing.get_context("spawn")


class Children:
    """The processes one test started; ``start`` returns the parent's end of a pipe to it."""

    def __init__(self) -> None:
        self.procs: List[Any] = []
        self.conns: List[Any] = []

    def start(self, target: Callable[..., None], *args: Any) -> Any:
        parent, child = SPAWN.Pipe()
        proc = SPAWN.Process(target=target, args=(*args, child), daemon=True)
        proc.start()
        child.close()
        self.procs.append(proc)
        self.conns.append(parent)
        return parent

    def close(self) -> None:
        for conn in self.conns:
            conn.close()
        for proc in self.procs:
            proc.join(10.0)
            if proc.is_alive():
                proc.kill()
                proc.join(10.0)


def recv(conn: Any, timeout: float = 60.0) -> Any:
    """The next message from a child, or a failed assertion after ``timeout`` seconds."""
    assert conn.poll(timeout), f"no message within {timeout} s"
    return conn.recv()


def in_forked_child(body: Callable[[], str]) -> Tuple[int, str]:
    """Run ``body`` in a child made by ``os.fork()`` (this process' threads are not copied:
    what a user's fork does) and return the child's exit status and what ``body`` returned.
    The child never returns into pytest: it leaves with ``os._exit``."""
    read_fd, write_fd = os.pipe()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # fork with threads: what is tested
        pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.write(write_fd, body().encode())
            code = 0
        finally:
            os._exit(code)
    os.close(write_fd)
    try:
        _, status = os.waitpid(pid, 0)
        return status, os.read(read_fd, 4096).decode()
    finally:
        os.close(read_fd)
