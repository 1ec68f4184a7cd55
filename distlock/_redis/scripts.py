"""The Lua scripts, shipped as package data and read once per process.

Each ``lua/<name>.lua`` holds one operation and starts with its KEYS/ARGV/return contract.
Helpers shared by many scripts live in ``lua/_prelude.lua`` (every family) and in
``lua/_<family>.lua`` (``_sem.lua`` for the ``sem_*`` scripts, say). A script's source is the
helpers it uses, then the operation, so that each operation is still exactly one EVALSHA.

Nothing is inferred from the code: a script declares the helpers it calls on one line,
``--@ uses a b``, and each helper starts with a marker line, ``--@ helper name [name...] [uses
a b]``, that names what it defines and the helpers it calls in turn; it runs up to the next
marker. Lines of a helper file above its first marker are that file's preamble, never shipped.
A declared name that no helper defines is an error at load.

Only the helpers a script uses go in: Redis runs a script's whole text at every call, so every
helper it carries is a closure built per call, and a top-level statement such as
``redis.call('time')`` is a command per call. The loader keeps, for each script, which lines
of which file each part came from, so that ``locate`` turns a Redis error's line number in the
joined text (``user_script:N``) into ``<file>.lua:<line>`` of the file that line is in.
"""

from __future__ import annotations

import functools
import re
from importlib import resources
from typing import Dict, List, NamedTuple, Tuple

__all__ = ["script_names", "script_source", "helper_names", "declared", "locate", "all_sources"]

_HELPER = "--@ helper "
_USES = "--@ uses "


@functools.cache
def _read(filename: str) -> str:
    return resources.files("distlock._redis").joinpath("lua", filename).read_text(encoding="utf-8")


def script_names() -> list[str]:
    """Names of every operation script shipped with the package (without ``.lua``)."""
    folder = resources.files("distlock._redis").joinpath("lua")
    return sorted(
        entry.name[: -len(".lua")]
        for entry in folder.iterdir()
        if entry.name.endswith(".lua") and not entry.name.startswith("_")
    )


class _Helper(NamedTuple):
    file: str
    names: Tuple[str, ...]  # the locals it defines
    uses: Tuple[str, ...]  # the helpers it calls
    first: int  # the line (1-based) of its marker in its file
    lines: Tuple[str, ...]


def _marker_words(line: str, file: str) -> Tuple[Tuple[str, ...], Tuple[str, ...]]:
    words = line[len(_HELPER):].split()
    cut = words.index("uses") if "uses" in words else len(words)
    names, uses = tuple(words[:cut]), tuple(words[cut + 1:])
    if not names:
        raise ValueError(f"{file}: a helper marker that names nothing: {line!r}")
    return names, uses


@functools.cache
def _helpers(filename: str) -> Tuple[_Helper, ...]:
    """The helpers of one helper file, in file order, each from its marker to the next."""
    lines = _read(filename).splitlines()
    starts = [i for i, line in enumerate(lines) if line.startswith(_HELPER)]
    helpers = []
    for k, start in enumerate(starts):
        end = starts[k + 1] if k + 1 < len(starts) else len(lines)
        while end > start + 1 and not lines[end - 1].strip():
            end -= 1
        names, uses = _marker_words(lines[start], filename)
        helpers.append(_Helper(filename, names, uses, start + 1, tuple(lines[start:end])))
    return tuple(helpers)


def _family_file(name: str) -> str:
    family = "_" + name.split("_", 1)[0] + ".lua"
    return family if resources.files("distlock._redis").joinpath("lua", family).is_file() else ""


def _available(name: str) -> Tuple[_Helper, ...]:
    family = _family_file(name)
    return _helpers("_prelude.lua") + (_helpers(family) if family else ())


def helper_names(name: str) -> Tuple[str, ...]:
    """Every helper name script ``name`` could use (the prelude's and its family's)."""
    return tuple(n for helper in _available(name) for n in helper.names)


def declared(name: str) -> Tuple[str, ...]:
    """The helpers script ``name`` declares it calls (its ``--@ uses`` line)."""
    lines = [line for line in _read(name + ".lua").splitlines() if line.startswith(_USES)]
    if len(lines) > 1:
        raise ValueError(f"{name}.lua: more than one '{_USES.strip()}' line")
    return tuple(lines[0][len(_USES):].split()) if lines else ()


class _Assembled(NamedTuple):
    source: str
    #: (first line in the joined text, file, first line in that file), in order
    parts: Tuple[Tuple[int, str, int], ...]


@functools.cache
def _assemble(name: str) -> _Assembled:
    available = _available(name)
    by_name: Dict[str, _Helper] = {}
    for helper in available:
        for n in helper.names:
            if n in by_name:
                raise ValueError(f"helper {n!r} is defined twice ({by_name[n].file}, {helper.file})")
            by_name[n] = helper
    needed: Dict[str, str] = {}  # helper name -> who asked for it first
    todo = [(n, f"{name}.lua") for n in declared(name)]
    while todo:
        wanted, by = todo.pop()
        if wanted in needed:
            continue
        found = by_name.get(wanted)
        if found is None:
            raise ValueError(f"{by} uses {wanted!r}, which no helper of "
                             f"{', '.join(sorted({h.file for h in available}))} defines")
        needed[wanted] = by
        todo.extend((n, f"{found.file}:{found.first}") for n in found.uses)
    lines: List[str] = []
    parts: List[Tuple[int, str, int]] = []
    for helper in available:
        if any(n in needed for n in helper.names):
            parts.append((len(lines) + 1, helper.file, helper.first))
            lines.extend(helper.lines)
    parts.append((len(lines) + 1, f"{name}.lua", 1))
    lines.extend(_read(name + ".lua").splitlines())
    return _Assembled("\n".join(lines), tuple(parts))


def script_source(name: str) -> str:
    """Full text of script ``name``: the helpers it declares, and theirs, in the order their
    files define them, then the operation."""
    return _assemble(name).source


_SCRIPT_LINE = re.compile(r"user_script:(\d+)")


def locate(name: str, message: str) -> str:
    """``message`` (a Redis error from script ``name``) with every ``user_script:N`` (a line of
    the joined text) turned into ``<file>.lua:<line>`` of the file that line comes from."""
    parts = _assemble(name).parts

    def where(match: re.Match[str]) -> str:
        line = int(match.group(1))
        for start, file, first in reversed(parts):
            if line >= start:
                return f"{file}:{first + line - start}"
        return match.group(0)

    return _SCRIPT_LINE.sub(where, message)


def all_sources() -> Dict[str, str]:
    return {name: script_source(name) for name in script_names()}
