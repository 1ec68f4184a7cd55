"""Processes that export, adopt and release holds by handle (spawn: importable, top-level)."""

from __future__ import annotations

from typing import Any

import distlock
from distlock._redis.urls import client_from_url


def export_and_exit(url: str, name: str, lease: float, conn: Any) -> None:
    """Take the lock, export its hold, send the handle and the token, and exit without
    releasing: a detached hold must outlive its process."""
    lock = distlock.DistLock(name, client=client_from_url(url), holder="exporter")
    lock.acquire()
    token = lock.token
    conn.send((lock.export(lease=lease), token))


def adopt_and_report(url: str, handle: str, conn: Any) -> None:
    """Adopt a hold, report what this process believes, wait for the word, then release it."""
    lock = distlock.DistLock.adopt(handle, client=client_from_url(url))
    conn.send((lock.owned(), lock.token))
    conn.recv()
    lock.release()
    conn.send("released")
