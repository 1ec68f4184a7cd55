"""The scripts' kind check (``wrong_kind``, lua/_prelude.lua) and ``distlock._core.keys``
agree on which keys give a name its kind, how many per kind, and which kinds each kind may
not share a name with (docs/guides/kinds.rst)."""

from __future__ import annotations

import re

from distlock._core.keys import (
    KIND_KEYS,
    OTHER_KINDS,
    BarrierKeys,
    EventKeys,
    Keys,
    RWKeys,
    SemKeys,
    other_kinds,
)
from distlock._redis.scripts import script_names, script_source

#: the scripts that give a name its kind, and the kind
CHECKED = {"lock_acquire": "L", "fair_acquire": "L", "rw_read_acquire": "W", "rw_write_acquire": "W",
           "sem_acquire": "S", "sem_release": "S", "ev_set": "E", "ev_wait": "E", "bar_wait": "B",
           "bar_reset": "B"}


def test_the_lua_counts_are_the_python_keys() -> None:
    source = script_source("lock_acquire")
    table = re.search(r"local COUNT = \{([^}]*)\}", source)
    assert table is not None
    counts = {k: int(v) for k, v in re.findall(r"(\w) = (\d+)", table.group(1))}
    assert counts == {kind: len(suffixes) for kind, suffixes in KIND_KEYS.items()}


def test_every_script_that_gives_a_kind_checks_the_others() -> None:
    for name in script_names():
        calls = re.findall(r"wrong_kind\('(\w)', '(\w+)', (\d+)\)", script_source(name))
        if name not in CHECKED:
            assert calls == [], name
            continue
        assert len(calls) == 1, name
        this, others, _ = calls[0]
        assert this == CHECKED[name] and others == OTHER_KINDS[this], name


def test_locks_and_read_write_locks_are_the_only_kinds_that_share() -> None:
    for kind, others in OTHER_KINDS.items():
        assert kind not in others
        shared = set(KIND_KEYS) - set(others) - {kind}
        assert shared == ({"W"} if kind == "L" else {"L"} if kind == "W" else set())


def test_each_primitive_sends_the_other_kinds_keys_of_its_own_name() -> None:
    keys = Keys("distlock:", "n}{%")
    assert keys.others == other_kinds(keys.tag, "n}{%", "L")
    assert all(k.startswith(keys.tag) for k in keys.others)
    assert RWKeys.of("distlock:", "n}{%").others == other_kinds(keys.tag, "n}{%", "W")
    assert SemKeys.of("distlock:", "n}{%").others == other_kinds(keys.tag, "n}{%", "S")
    assert EventKeys.of("distlock:", "n}{%").others == other_kinds(keys.tag, "n}{%", "E")
    assert BarrierKeys.of("distlock:", "n}{%").others == other_kinds(keys.tag, "n}{%", "B")
    # a kind's own keys are what the other kinds look for
    assert keys.lock in SemKeys.of("distlock:", "n}{%").others
    assert keys.queue in EventKeys.of("distlock:", "n}{%").others
    assert RWKeys.of("distlock:", "n}{%").writer in BarrierKeys.of("distlock:", "n}{%").others
    assert SemKeys.of("distlock:", "n}{%").sem in keys.others
