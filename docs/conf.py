"""Sphinx configuration for the distlock documentation (``tox -e docs``, warnings as errors)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, List

from docutils import nodes
from docutils.parsers.rst import Directive

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import distlock  # noqa: E402

project = "distlock"
author = "distlock developers"
copyright = "distlock developers"  # noqa: A001 - Sphinx's name for it
release = distlock.__version__
version = ".".join(release.split(".")[:2])

extensions = ["sphinx.ext.autodoc"]
autodoc_member_order = "bysource"
autodoc_typehints = "signature"
autodoc_preserve_defaults = True
exclude_patterns = ["_build"]
html_theme = "alabaster"
html_static_path: List[str] = []
pygments_style = "sphinx"
nitpicky = False


class LuaContracts(Directive):
    """``.. distlock-scripts::`` - the contract comment at the top of every shipped Lua script.

    Reads ``distlock/_redis/lua/*.lua`` at build time, so a new script appears here without anyone
    editing the page. The shared ``_prelude.lua`` is shown whole: it is all helpers.
    """

    has_content = False

    def run(self) -> List[Any]:
        env = self.state.document.settings.env
        folder = ROOT / "distlock" / "_redis" / "lua"
        out: List[Any] = []
        for path in sorted(folder.glob("*.lua"), key=lambda p: (not p.name.startswith("_"), p.name)):
            env.note_dependency(str(path))
            text = path.read_text(encoding="utf-8")
            if path.name.startswith("_"):
                shown = text.rstrip()
            else:
                lines = []
                for line in text.splitlines():
                    if not line.startswith("--"):
                        break
                    lines.append(line)
                shown = "\n".join(lines)
            out.append(nodes.rubric(text=f"distlock/_redis/lua/{path.name}"))
            block = nodes.literal_block(shown, shown)
            block["language"] = "lua"
            out.append(block)
        return out


def setup(app: Any) -> None:
    app.add_directive("distlock-scripts", LuaContracts)


