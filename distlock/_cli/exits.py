"""How a ``distlock`` command ends: its exit statuses, and the one-line error it prints.

Exit statuses follow sysexits(3) where one fits:

- 0 success; a ``run`` passes its command's status through (128 + N for a signal N);
- 1 a refused or failed admin action (``release`` without ``--force``);
- 2 bad arguments (argparse's one-line usage error);
- 65 (EX_DATAERR) the name is in use as another kind of primitive (``WrongKindError``: a name
  is one lock);
- 69 (EX_UNAVAILABLE) the Redis server cannot be reached;
- 70 (EX_SOFTWARE) any other Redis error;
- 75 (EX_TEMPFAIL, ``--conflict-exit-code``) ``run`` could not take the lock in time (``run
  --leader``: was not elected in time);
- 76 ``run`` lost its lease (``run --leader``: its leadership) while the command ran.
"""

from __future__ import annotations

import sys

__all__ = ["EXIT_REFUSED", "EXIT_USAGE", "EXIT_WRONG_KIND", "EXIT_UNAVAILABLE", "EXIT_SOFTWARE",
           "EXIT_CONFLICT", "EXIT_LOST", "Fail", "err", "one_line"]

EXIT_REFUSED = 1
EXIT_USAGE = 2
EXIT_WRONG_KIND = 65
EXIT_UNAVAILABLE = 69
EXIT_SOFTWARE = 70
EXIT_CONFLICT = 75
EXIT_LOST = 76


class Fail(Exception):
    """A one-line error for the user, with an exit status."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


def err(message: str) -> None:
    print(f"distlock: {message}", file=sys.stderr, flush=True)


def one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text or type(exc).__name__
