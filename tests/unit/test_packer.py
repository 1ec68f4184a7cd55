"""``_redis.direct.packer`` writes the RESP redis-py itself writes, for every argument type the
scripts pass, whether a str argument's packing is kept from an earlier command or not, and
across the point where its cache starts afresh."""

from __future__ import annotations

from typing import Any, Tuple

import pytest
import redis
from hypothesis import given, settings
from hypothesis import strategies as st

from distlock._redis import direct


def _redis_pys(args: Tuple[Any, ...]) -> bytes:
    conn = redis.Connection()
    return b"".join(conn.pack_command(*args))


_ARG = st.one_of(st.text(max_size=300), st.integers(-(2**63), 2**63 - 1), st.binary(max_size=40))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(_ARG, min_size=1, max_size=12), min_size=1, max_size=6))
def test_each_command_packs_as_redis_py_packs_it(commands: Any) -> None:
    pack = direct.packer(redis.Connection().encoder)
    for rest in commands + commands:  # each str a second time: from the cache
        args = ("EVALSHA", *rest)  # (redis-py splits a command name that has a space)
        assert b"".join(pack(args)) == _redis_pys(args)


def test_a_full_cache_starts_afresh_and_packs_the_same(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(direct, "PACK_CACHE", 4)
    pack = direct.packer(redis.Connection().encoder)
    names = [f"distlock:{{name:{i}}}" for i in range(10)]
    for _ in range(3):
        for i in range(len(names) - 2):
            args = ("EVALSHA", "ab" * 20, 3, *names[i:i + 3], 30000, b"\x00\xff")
            assert b"".join(pack(args)) == _redis_pys(args)


def test_what_the_encoder_refuses_is_refused_as_redis_py_refuses_it() -> None:
    pack = direct.packer(redis.Connection().encoder)
    with pytest.raises(redis.DataError):
        pack(("SET", "k", None))
