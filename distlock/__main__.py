"""``python -m distlock``: the same command line as the ``distlock`` console script."""

from __future__ import annotations

import sys

from ._cli.main import main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main())
