"""The client every command talks through: ``connect(url)``, and the checks of ``--url`` the
commands share (a URL redis-py cannot parse is a usage error; a password never reaches a
message: ``redact_url``)."""

from __future__ import annotations

import argparse
import re
from typing import Any, List, Optional, Tuple

import redis
from redis.exceptions import RedisClusterException

from .._redis.urls import client_from_url, cluster_url, sentinel_url
from .exits import one_line

__all__ = ["connect", "check_url", "client_for", "redact_url"]


def connect(url: str, **kwargs: Any) -> Any:
    """The client of ``url``, with ``kwargs`` for redis-py: a ``redis.RedisCluster`` for
    ``redis+cluster://host:port[,host:port...]/`` (or ``rediss+cluster://``), which reads the
    slot map and so connects now; else a ``redis.Redis``, which connects on its first command.

    Raise ValueError for a URL redis-py cannot parse (before connecting), and
    redis.ConnectionError when none of a cluster's nodes can be reached.
    """
    _parsed(url)
    try:
        return client_from_url(url, **kwargs)
    except RedisClusterException as exc:
        if isinstance(exc.__cause__, (redis.ConnectionError, redis.TimeoutError)):
            raise redis.ConnectionError(one_line(exc.__cause__)) from exc
        raise


def _parsed(url: str) -> Optional[Tuple[str, List[Tuple[str, int]]]]:
    """``cluster_url(url)``, once redis-py parsed the URL (without connecting): ValueError when
    it cannot. A sentinel URL (``redis+sentinel://``) is parsed by ``sentinel_url``."""
    if sentinel_url(url) is not None:
        return None
    parsed = cluster_url(url)
    redis.connection.parse_url(url if parsed is None else parsed[0])  # type: ignore[no-untyped-call]
    return parsed


def check_url(url: str, parser: argparse.ArgumentParser) -> None:
    """A URL redis-py cannot parse is a usage error (nothing connects)."""
    try:
        _parsed(url)
    except ValueError as exc:
        parser.error(f"argument --url: {one_line(exc)}")


def client_for(url: str, parser: argparse.ArgumentParser) -> Any:
    """A command's client of ``url``; a URL redis-py cannot parse is a usage error."""
    try:
        return connect(url, socket_connect_timeout=10)
    except ValueError as exc:
        parser.error(f"argument --url: {one_line(exc)}")
        raise  # not reached: parser.error exits


_URL_PASSWORD = re.compile(r"^([a-z0-9+.-]+://)([^:@/]*):([^@/]*)@", re.IGNORECASE)


def redact_url(url: str) -> str:
    """``url`` with any password replaced by ``***``, for messages."""
    return _URL_PASSWORD.sub(lambda m: f"{m.group(1)}{m.group(2)}:***@", url)
