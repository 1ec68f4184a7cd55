"""The Lua scripts, shipped as package data and read once per process.

Each ``lua/<name>.lua`` holds one operation and starts with its KEYS/ARGV/return contract.
Helpers shared by many scripts live in ``lua/_prelude.lua`` (every family) and in
``lua/_<family>.lua`` (``_sem.lua`` for the ``sem_*`` scripts, say). A script's source is the
helpers it uses, then the operation, so that each operation is still exactly one EVALSHA.

Only the helpers a script uses go in: Redis runs a script's whole text at every call, so every
helper it carries is a closure built (and garbage collected) per call, and a top-level statement
such as ``redis.call('time')`` is a command per call. redis-py's ``Script`` objects fall back to
SCRIPT LOAD + EVALSHA when the server answers NOSCRIPT (after a restart or SCRIPT FLUSH).
"""

from __future__ import annotations

import functools
import re
from importlib import resources
from typing import Dict, List, NamedTuple, Tuple

__all__ = ["script_names", "script_source", "helper_names"]


@functools.cache
def _read(filename: str) -> str:
    return resources.files("distlock").joinpath("lua", filename).read_text(encoding="utf-8")


def script_names() -> list[str]:
    """Names of every operation script shipped with the package (without ``.lua``)."""
    folder = resources.files("distlock").joinpath("lua")
    return sorted(
        entry.name[: -len(".lua")]
        for entry in folder.iterdir()
        if entry.name.endswith(".lua") and not entry.name.startswith("_")
    )


class _Helper(NamedTuple):
    names: Tuple[str, ...]  # the locals it defines
    text: str  # its comment lines and its code
    code: str  # its code without comments, to look for what it uses


#: what a helper block defines: ``local function name`` or ``local a, b =`` (on one line)
_DEFINES = re.compile(r"local\s+function\s+(\w+)|local[ \t]+([\w \t,]+?)[ \t]*=")
_COMMENT = re.compile(r"--.*")


def _code(text: str) -> str:
    return _COMMENT.sub("", text)


def _uses(code: str, name: str) -> bool:
    return re.search(r"(?<![\w.:])" + re.escape(name) + r"\b", code) is not None


@functools.cache
def _helpers(filename: str) -> Tuple[_Helper, ...]:
    """Split a helpers file into its top-level definitions: each starts at a line that begins
    with ``local`` (its comment lines above go with it) and runs up to the next one. The
    helper files keep to what this can split: ``--`` line comments only, and no ``--`` inside
    a string (the search for what a helper uses skips comments)."""
    blocks: List[List[str]] = []
    pending: List[str] = []  # comment or blank lines not yet given to a block
    for line in _read(filename).splitlines():
        if line.startswith("local"):
            blocks.append(pending + [line])
            pending = []
        elif blocks and line and not line.startswith("--"):
            blocks[-1].extend(pending + [line])  # a definition's body, or its final `end`
            pending = []
        else:
            pending.append(line)
    helpers = []
    for lines in blocks:
        text = "\n".join(lines)
        code = _code(text)
        first = _DEFINES.match(code.lstrip())
        if first is None or "--[[" in text or re.search(r"^function\b", code, re.M):
            # (a forward declaration, a block comment or a global function would be split or
            # attributed wrongly: the helper files keep to what this reads)
            raise ValueError(f"{filename}: not a helper this loader can split out:\n{text}")
        names = first.group(1) or first.group(2)
        helpers.append(_Helper(tuple(n.strip() for n in names.split(",")), text, code))
    return tuple(helpers)


def _family_file(name: str) -> str:
    family = "_" + name.split("_", 1)[0] + ".lua"
    return family if resources.files("distlock").joinpath("lua", family).is_file() else ""


def _available(name: str) -> Tuple[_Helper, ...]:
    family = _family_file(name)
    return _helpers("_prelude.lua") + (_helpers(family) if family else ())


def helper_names(name: str) -> Tuple[str, ...]:
    """Every helper name script ``name`` could use (the prelude's and its family's)."""
    return tuple(n for helper in _available(name) for n in helper.names)


@functools.cache
def script_source(name: str) -> str:
    """Full text of script ``name``: the helpers it uses, directly or through another helper,
    in the order their files define them, then the operation."""
    body = _read(name + ".lua")
    available = _available(name)
    needed = _code(body)
    chosen = [False] * len(available)
    changed = True
    while changed:  # helpers use earlier helpers: go until nothing new is needed
        changed = False
        for i, helper in enumerate(available):
            if not chosen[i] and any(_uses(needed, n) for n in helper.names):
                chosen[i] = True
                needed += "\n" + helper.code
                changed = True
    parts = [helper.text for i, helper in enumerate(available) if chosen[i]]
    return "\n".join(parts + [body])


def all_sources() -> Dict[str, str]:
    return {name: script_source(name) for name in script_names()}
