"""The Lua scripts, shipped as package data and read once per process.

Each ``lua/<name>.lua`` holds one operation and starts with its KEYS/ARGV/return contract.
``lua/_prelude.lua`` (helpers such as ``next_token``) is prepended to every script, so each
operation is still exactly one EVALSHA. redis-py's ``Script`` objects fall back to
SCRIPT LOAD + EVALSHA when the server answers NOSCRIPT (after a restart or SCRIPT FLUSH).
"""

from __future__ import annotations

import functools
from importlib import resources
from typing import Dict

__all__ = ["script_names", "script_source"]


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


@functools.cache
def script_source(name: str) -> str:
    """Full text of script ``name``: the prelude, then the helpers of its family if it has any
    (``lua/_sem.lua`` for ``sem_*`` scripts, say), then the operation."""
    family = "_" + name.split("_", 1)[0] + ".lua"
    helpers = ""
    if resources.files("distlock").joinpath("lua", family).is_file():
        helpers = _read(family) + "\n"
    return _read("_prelude.lua") + "\n" + helpers + _read(name + ".lua")


def all_sources() -> Dict[str, str]:
    return {name: script_source(name) for name in script_names()}
