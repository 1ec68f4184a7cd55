"""Election candidates that run in child processes (spawn: importable, top-level)."""

from __future__ import annotations

import os
import time
from typing import Any, List, Tuple

import distlock
from distlock._redis.urls import client_from_url


def lead_in_turns(url: str, name: str, rounds: int, conn: Any) -> None:
    """Campaign ``rounds`` times; each time lead for a moment and resign. Send back, per
    leadership, (epoch, monotonic time after the win, monotonic time before the resign):
    CLOCK_MONOTONIC is one clock for every process of the host."""
    election = distlock.DistElection(name, client=client_from_url(url))
    terms: List[Tuple[int, float, float]] = []
    conn.send("ready")
    conn.recv()  # everyone starts at once
    for _ in range(rounds):
        leadership = election.campaign(f"pid-{os.getpid()}", timeout=60)
        began = time.monotonic()
        assert election.is_leader() and leadership.valid_for() > 0
        time.sleep(0.02)
        ended = time.monotonic()
        terms.append((leadership.epoch, began, ended))
        leadership.resign()
    conn.send(terms)
