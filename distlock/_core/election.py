"""DistElection without I/O: the leader's value as it travels in a hold's info, and what a look
at an election (``elect_look``) returns.

A leader is the exclusive hold of the election's name (a name is one lock: docs/design.rst,
principle 15); its value rides in the hold's info, ``<host>:<pid> <value>``, the value
percent-encoded so that it holds no space and no ``|`` (the separator of a fair queue's
entries, ``lua/_fair.lua``).
"""

from __future__ import annotations

from typing import Any, NamedTuple, Optional, Tuple
from urllib.parse import quote, unquote

__all__ = ["Leader", "MAX_VALUE", "check_value", "holder_suffix", "split_info", "leader_of"]

#: the longest value a leader may carry, in characters: it travels with every grant
MAX_VALUE = 1024


class Leader(NamedTuple):
    """Who leads an election, as read from Redis (``DistElection.leader()``, ``observe()``)."""

    #: what the leader gave ``campaign(value=...)``
    value: str
    #: its leadership's epoch: the fencing token of its hold, strictly greater than every
    #: earlier leader's
    epoch: int
    #: the host and process id of the leader, as it told them
    host: Optional[str]
    pid: Optional[int]
    #: seconds left of its lease on the server when read (the watchdog renews it while the
    #: leader's process lives)
    ttl: float


def check_value(value: object) -> str:
    """A campaign's value: a str of at most ``MAX_VALUE`` characters (TypeError, ValueError)."""
    if not isinstance(value, str):
        raise TypeError(f"an election's value must be a str, not {type(value).__name__}")
    if len(value) > MAX_VALUE:
        raise ValueError(f"an election's value is at most {MAX_VALUE} characters, not {len(value)}")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(f"an election's value must be encodable as UTF-8: {exc.reason}") from None
    return value


def holder_suffix(value: str) -> str:
    """What follows ``host:pid`` in the info of a hold that carries ``value``."""
    return " " + quote(value, safe="")


def split_info(info: Optional[str]) -> Tuple[Optional[str], Optional[int], Optional[str]]:
    """A hold's info -> (host, pid, value); the value is None when the hold carries none."""
    if not info:
        return None, None, None
    info, sep, encoded = info.partition(" ")
    value = unquote(encoded) if sep else None
    host, sep, pid = info.rpartition(":")
    if not sep:
        return info, None, value
    try:
        return host, int(pid), value
    except ValueError:
        return info, None, value


def _text(item: Any) -> str:
    return item.decode("utf-8", "replace") if isinstance(item, bytes) else str(item)


def leader_of(reply: Any) -> Optional[Leader]:
    """``elect_look``'s ``{token, info, pttl}`` -> the leader, or None when nobody leads."""
    token, info, pttl = int(_text(reply[0])), _text(reply[1]), int(reply[2])
    if token <= 0:
        return None
    host, pid, value = split_info(info)
    return Leader(value or "", token, host, pid, max(pttl, 0) / 1000.0)
