"""docs/examples/cache_refresh.py: several processes ask a dogpile.cache region on the
``distlock.redis`` backend for a value that expires; one creator at a time makes it."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any, List

import pytest

pytest.importorskip("dogpile.cache")

pytestmark = pytest.mark.real_redis

EXAMPLE = Path(__file__).resolve().parent.parent.parent / "docs" / "examples" / "cache_refresh.py"


def run_example(url: str, *options: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(EXAMPLE), "--url", url, "--seconds", "2",
                           "--processes", "3", *options],
                          capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)


def totals(stdout: str) -> List[int]:
    """[gets, creations] from the example's ``total:`` line."""
    found = re.search(r"^total: (\d+) gets, (\d+) creations", stdout, re.MULTILINE)
    assert found, stdout
    return [int(found.group(1)), int(found.group(2))]


def test_one_creator_at_a_time(url: str, client: Any) -> None:
    done = run_example(url)
    assert done.returncode == 0, done.stdout + done.stderr
    gets, creations = totals(done.stdout)
    assert 0 < creations < gets
    assert "no two creations overlapped" in done.stdout
    assert client.keys("example:*") == []


def test_unlocked_runs(url: str, client: Any) -> None:
    """Without the distributed lock creations may overlap (likely, not certain): exit 0 or 1."""
    done = run_example(url, "--unlocked")
    assert done.returncode in (0, 1), done.stdout + done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    gets, creations = totals(done.stdout)
    assert 0 < creations < gets
    assert client.keys("example:*") == []
