"""The documentation: the Sphinx build (warnings as errors, as ``tox -e docs`` and CI run it), and
every Python example of README.rst and the guides, run as it is against the test server."""

from __future__ import annotations

import ast
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any, List, Tuple

import pytest
import redis

ROOT = Path(__file__).resolve().parent.parent.parent
DOCS = ROOT / "docs"

_BLOCK = re.compile(r"^\.\. code-block:: python\n((?:\n|   .*\n)+)", re.MULTILINE)


def python_examples() -> List[Tuple[str, str]]:
    """(id, source) of every ``.. code-block:: python`` in README.rst and docs/guides/."""
    files = [ROOT / "README.rst", *sorted((DOCS / "guides").glob("*.rst"))]
    found = []
    for path in files:
        text = path.read_text(encoding="utf-8")
        for i, match in enumerate(_BLOCK.finditer(text)):
            lines = match.group(1).splitlines()
            code = "\n".join(line[3:] for line in lines).strip() + "\n"
            found.append((f"{path.relative_to(ROOT)}#{i + 1}", code))
    return found


EXAMPLES = python_examples()


@pytest.mark.slow
def test_sphinx_build_has_no_warnings(tmp_path: Path) -> None:
    if importlib.util.find_spec("sphinx") is None:
        pytest.skip("sphinx is not installed (it is in the test extra: pip install -e '.[test]')")
    result = subprocess.run(
        [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-b", "html", "-q",
         str(DOCS), str(tmp_path / "html")],
        capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert result.returncode == 0, result.stdout + result.stderr


def test_examples_were_found() -> None:
    names = {name.split("#")[0] for name, _ in EXAMPLES}
    assert "README.rst" in names and len(EXAMPLES) >= 10
    for name, code in EXAMPLES:
        # Examples use the default client ($DISTLOCK_URL): none may name a server itself.
        assert "6379" not in code and "localhost" not in code, name


@pytest.mark.real_redis
@pytest.mark.parametrize("name,code", EXAMPLES, ids=[n for n, _ in EXAMPLES])
def test_example_runs(name: str, code: str, url: str, client: redis.Redis[Any],
                      tmp_path: Path) -> None:
    missing = _missing_libraries(code)
    if missing:  # an adapter's guide: its library comes with the adapter's extra (CI has them all)
        pytest.skip(f"{name} needs {', '.join(missing)}, not installed (pip install -e '.[<extra>]')")
    script = tmp_path / "example.py"
    script.write_text(code, encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if not k.startswith("DISTLOCK_")}
    env["DISTLOCK_URL"] = url
    result = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True,
                            timeout=120, cwd=tmp_path, stdin=subprocess.DEVNULL)
    assert result.returncode == 0, f"{name}:\n{result.stdout}\n{result.stderr}"
    assert "Traceback" not in result.stderr, result.stderr
    # An example that released everything it took leaves nothing but token counters, and the
    # record of a barrier's last trip, until the leases of the parties it released run out.
    left = [k.decode() for k in client.scan_iter(count=1000)]
    assert all(k.endswith(":fence") or _trip_record(client, k) for k in left), (name, left)


def _missing_libraries(code: str) -> List[str]:
    """The top-level packages an example imports that this environment does not have."""
    names = set()
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module.split(".")[0])
    return sorted(n for n in names if importlib.util.find_spec(n) is None)


def _trip_record(client: redis.Redis[Any], key: str) -> bool:
    return (key.endswith(":bar") and set(client.hkeys(key)) <= {b"g", b"o", b"k"}
            and 0 < client.pttl(key) <= 30_000)
