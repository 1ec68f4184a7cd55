"""The no-I/O layer: key names, deadlines, the shipped scripts."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from distlock._core.deadlines import Backoff, Deadline, lease_ms
from distlock._core.keys import Keys, escape_name, unescape_name
from distlock._redis.scripts import script_names, script_source

SUFFIXES = ["", ":fence", ":wake"]


def test_no_suffix_ends_another() -> None:
    """Keys of two different names never collide: no '}'+suffix ends another '}'+suffix."""
    keys = Keys("distlock:", "n")
    suffixes = [keys.lock, keys.fence, keys.channel]
    tails = [s[len(keys.tag) - 1:] for s in suffixes]  # each starts with '}'
    for a, b in itertools.permutations(tails, 2):
        assert not a.endswith(b) and not b.endswith(a)


@given(st.text(min_size=1), st.text(min_size=1))
def test_distinct_names_distinct_keys(a: str, b: str) -> None:
    ka, kb = Keys("distlock:", a), Keys("distlock:", b)
    names_a = {ka.lock, ka.fence, ka.channel}
    names_b = {kb.lock, kb.fence, kb.channel}
    if a != b:
        assert not names_a & names_b


@given(st.text(min_size=1))
def test_all_keys_share_one_hash_tag(name: str) -> None:
    keys = Keys("distlock:", name)

    def tag(key: str) -> str:  # Redis Cluster's rule
        start = key.index("{")
        end = key.find("}", start + 1)
        assert end > start + 1, "empty hash tag"
        return key[start + 1:end]

    assert tag(keys.lock) == tag(keys.fence) == tag(keys.channel) == tag(keys.sub("x"))


@given(st.text())
def test_escape_round_trips(name: str) -> None:
    escaped = escape_name(name)
    assert unescape_name(escaped) == name
    assert "{" not in escaped and "}" not in escaped


def test_plain_names_are_unchanged() -> None:
    assert Keys("distlock:", "orders:42").lock == "distlock:{orders:42}"
    assert Keys("distlock:", "a}b").lock == "distlock:{a%7Db}"


def test_deadline_bounds() -> None:
    forever = Deadline(None)
    assert forever.remaining() is None and not forever.expired()
    assert forever.sleep_bound(0.5, 2.0) == 0.5
    assert forever.sleep_bound(0, 2.0) == 2.0  # unknown lease: the cap
    assert forever.sleep_bound(None, 2.0) == 2.0
    soon = Deadline(0.0)
    assert soon.expired() and soon.sleep_bound(10.0, 2.0) == 0.0


def test_lease_ms_rounds_up() -> None:
    assert lease_ms(0.0001) == 1
    assert lease_ms(1.0) == 1000
    assert lease_ms(0.0015) == 2


def test_scripts_ship_with_the_package() -> None:
    names = script_names()
    assert {"lock_acquire", "lock_release", "lock_renew"} <= set(names)
    for name in names:
        source = script_source(name)
        body = source.split("\n", 1)[1] if source.startswith("#!") else source
        assert "KEYS[1]" in body and "return" in body, name


@pytest.mark.parametrize("name", script_names())
def test_every_script_compiles_on_the_server(client: Any, name: str) -> None:
    sha = client.script_load(script_source(name))
    assert client.script_exists(sha) == [True]


def test_backoff_doubles_up_to_its_cap_with_jitter() -> None:
    backoff = Backoff(first=0.002, most=0.1)
    steps = [0.002, 0.004, 0.008, 0.016, 0.032, 0.064, 0.1, 0.1, 0.1]
    for step in steps:
        value = backoff.lost()
        assert step / 2 <= value <= step
