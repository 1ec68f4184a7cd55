"""The script loader: declared helpers, and errors that name the file and line they come from
(issue 12, finding 7). The checks here read the Lua with a small lexer of their own (strings
and comments stripped), not with the loader, which infers nothing from the code."""

from __future__ import annotations

import re
from importlib import resources
from typing import Any, List, Set

import pytest
import redis

from distlock._redis import scripts as _scripts
from distlock._redis.scripts import declared, helper_names, locate, script_names, script_source

_LONG = re.compile(r"\[(=*)\[.*?\]\1\]", re.S)


def _strip(code: str) -> str:
    """Lua code without comments and string literals (short and long), one pass."""
    out: List[str] = []
    i, n = 0, len(code)
    while i < n:
        c = code[i]
        if code.startswith("--", i):
            long = _LONG.match(code, i + 2)
            if long:
                i = long.end()
            else:
                end = code.find("\n", i)
                i = n if end < 0 else end
            continue
        if c in "'\"":
            j = i + 1
            while j < n and code[j] != c:
                j += 2 if code[j] == "\\" else 1
            out.append('""')
            i = j + 1
            continue
        if c == "[":
            long = _LONG.match(code, i)
            if long:
                out.append('""')
                i = long.end()
                continue
        out.append(c)
        i += 1
    return "".join(out)


def _names_used(code: str) -> Set[str]:
    """Every bare identifier in ``code`` (not a field: not after '.' or ':')."""
    return set(re.findall(r"(?<![\w.:])([A-Za-z_]\w*)", _strip(code)))


def _names_defined(code: str, top: bool = False) -> Set[str]:
    """Names a ``local`` defines in ``code`` (``top``: at the top level only, column 0)."""
    start = "^" if top else r"\b"
    found = re.findall(start + r"local\s+function\s+(\w+)|" + start + r"local\s+([\w\s,]+?)\s*=",
                       _strip(code), re.M)
    return {n.strip() for a, b in found for n in (a or b).split(",")}


def _read(filename: str) -> str:
    return resources.files("distlock._redis").joinpath("lua", filename).read_text(encoding="utf-8")


@pytest.mark.parametrize("name", script_names())
def test_each_script_declares_exactly_the_helpers_it_calls(name: str) -> None:
    body = _read(name + ".lua")
    helpers = set(helper_names(name))
    used = (_names_used(body) - _names_defined(body)) & helpers
    assert set(declared(name)) == used


@pytest.mark.parametrize("filename", ["_prelude.lua", "_sem.lua", "_bar.lua"])
def test_each_helper_declares_exactly_the_helpers_it_calls(filename: str) -> None:
    lines = _read(filename).splitlines()
    marks = [i for i, line in enumerate(lines) if line.startswith("--@ helper ")]
    every = set(helper_names("sem_x" if filename == "_sem.lua" else
                             "bar_x" if filename == "_bar.lua" else "lock_x"))
    for k, start in enumerate(marks):
        block = "\n".join(lines[start + 1:marks[k + 1] if k + 1 < len(marks) else len(lines)])
        words = lines[start].split()[2:]
        cut = words.index("uses") if "uses" in words else len(words)
        names, uses = set(words[:cut]), set(words[cut + 1:])
        assert names == _names_defined(block, top=True), (filename, start + 1)
        assert uses == (_names_used(block) & every) - names, (filename, start + 1)


@pytest.mark.parametrize("name", script_names())
def test_each_assembled_script_defines_what_it_calls_and_nothing_more(name: str) -> None:
    source = script_source(name)
    helpers = set(helper_names(name))
    defined = _names_defined(source, top=True) & helpers
    called = _names_used(re.sub(r"\blocal\s+function\s+\w+", "", _strip(source))) & helpers
    assert defined == called, name


def test_an_unknown_helper_is_refused_at_load(monkeypatch: pytest.MonkeyPatch) -> None:
    real = _scripts._read

    def read(filename: str) -> str:
        text = real(filename)
        return text.replace("--@ uses next_token", "--@ uses next_tokne", 1) \
            if filename == "lock_acquire.lua" else text

    monkeypatch.setattr(_scripts, "_read", read)
    _scripts._assemble.cache_clear()
    try:
        with pytest.raises(ValueError, match="next_tokne"):
            script_source("lock_acquire")
    finally:
        monkeypatch.undo()
        _scripts._assemble.cache_clear()


def _line_of(filename: str, text: str, last: bool = False) -> int:
    lines = [i + 1 for i, line in enumerate(_read(filename).splitlines()) if text in line]
    assert lines, text
    return lines[-1] if last else lines[0]


def test_locate_maps_joined_lines_to_files() -> None:
    source = script_source("lock_acquire").splitlines()
    at = source.index("local mode = ARGV[5] or ''") + 1
    message = locate("lock_acquire", f"ERR x script: abc, on @user_script:{at}.")
    assert f"@lock_acquire.lua:{_line_of('lock_acquire.lua', 'local mode = ARGV[5]')}." in message


@pytest.mark.real_redis
def test_an_error_in_a_script_names_its_file_and_line(url: str, client: Any) -> None:
    """A grant whose lease is not a number fails at the script's own PEXPIRE line, and the
    error says so in lock_acquire.lua's own numbering."""
    from distlock._session.session import session_for

    session = session_for(client)
    keys = ("distlock:{loc}", "distlock:{loc}:fence", "distlock:{loc}:q")
    with pytest.raises(redis.exceptions.ResponseError) as info:
        session.run("lock_acquire", keys, ("me:1", "not-a-number", 30000, "h:1"))
    line = _line_of("lock_acquire.lua", "redis.call('pexpire', KEYS[1], ARGV[2])", last=True)
    assert f"lock_acquire.lua:{line}" in str(info.value), str(info.value)
    assert "user_script" not in str(info.value)


@pytest.mark.real_redis
def test_an_error_in_a_helper_names_the_helper_file(url: str, client: Any) -> None:
    """A fence TTL that is not a number fails inside next_token, in _prelude.lua."""
    from distlock._session.session import session_for

    session = session_for(client)
    keys = ("distlock:{loc2}", "distlock:{loc2}:fence", "distlock:{loc2}:q")
    with pytest.raises(redis.exceptions.ResponseError) as info:
        session.run("lock_acquire", keys, ("me:1", 30000, "not-a-number", "h:1"))
    line = _line_of("_prelude.lua", "redis.call('set', fence_key, fmt(token), 'px', ttl, 'get')")
    assert f"_prelude.lua:{line}" in str(info.value), str(info.value)


@pytest.mark.real_redis
def test_an_error_in_a_batched_script_names_its_file_and_line(url: str, client: Any) -> None:
    """The watchdog's renewals go out in a batch (a pipeline); an error among its replies is
    mapped like a single run's, and the other replies are untouched."""
    from distlock._session.session import session_for

    session = session_for(client)
    client.hset("distlock:{loc3}", mapping={"me:1": 1, ":t": 1})  # a hold to renew
    batch = session.executor.batch()
    batch.command("PING")
    batch.script("lock_renew", ("distlock:{loc3}", "distlock:{loc3}:fence"),
                 ("me:1", 1, "not-a-number", 30000))
    ping, error = batch.execute(raise_on_error=False)
    assert ping in (True, b"PONG", "PONG")
    assert isinstance(error, redis.exceptions.ResponseError)
    assert "lock_renew.lua:" in str(error) and "user_script" not in str(error), str(error)
    batch = session.executor.batch()
    batch.script("lock_renew", ("distlock:{loc3}", "distlock:{loc3}:fence"),
                 ("me:1", 1, "not-a-number", 30000))
    with pytest.raises(redis.exceptions.ResponseError, match="lock_renew.lua:"):
        batch.execute()
    client.delete("distlock:{loc3}")
