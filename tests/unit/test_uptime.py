"""The watchdog's connection reads its server's uptime as it opens (``_redis.executor._uptime``):
a hold sent before the server started is read back (docs/safety.rst)."""

from __future__ import annotations

from distlock._redis.executor import _uptime


def test_the_uptime_is_read_from_info_server() -> None:
    info = b"# Server\r\nredis_version:7.0.15\r\nuptime_in_seconds:42\r\nuptime_in_days:0\r\n"
    assert _uptime(info) == 42.0
    assert _uptime(info.decode()) == 42.0


def test_an_uptime_that_cannot_be_read_is_zero_so_every_earlier_hold_is_checked() -> None:
    assert _uptime(b"") == 0.0  # INFO refused (an ACL)
    assert _uptime(b"uptime_in_seconds:soon\r\n") == 0.0
    assert _uptime(None) == 0.0
