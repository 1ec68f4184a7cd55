"""Holds ended by their lock's name, for the adapted protocols that release by key alone
(celery-once's ``clear_lock``, celery-singleton's ``unlock`` and ``clear``) or by key and holder
value (Prefect's ``release_lock`` of a hold another process took).

distlock has no public release by name: a release names its hold (owner and token). These reuse
the flow of ``distlock release --force`` (``_cli.state``): read what holds the name, then break
that hold with ``force_release.lua``, which checks in Redis that the lock still carries the
token just read, so that a hold granted between the read and the break is left alone. A break
wakes every waiter, moves the token counter on, and its old holder's next renewal or release
finds it gone (LockLostError, ``on_lost``). Only the exclusive lock of the name (a DistLock's
hold) is broken; any other primitive of the name is left as it is.
"""

from __future__ import annotations

from typing import Any, List, Optional

from .._cli.inspect import glob_escape
from .._cli.state import _force_release, fetch_states, list_names
from .._core.keys import Keys, escape_name
from .._core.settings import settings
from .._session.config import resolve_client

__all__ = ["break_hold", "names_under"]


def break_hold(client: Any, name: str, token: Optional[int] = None) -> bool:
    """Break the hold of the lock ``name``, as ``distlock release --force`` does: the hold read
    now, or (``token``) only the hold with that fencing token. ``client``: a URL, a client, or
    None for distlock's default. True when this call ended a hold; False when there was none
    (or another one: nothing changes then)."""
    server = resolve_client(client)
    lock_key = Keys(settings().prefix, name).lock
    for state in fetch_states(server, [name]):
        if state.key != lock_key or not state.held or state.token is None \
                or state.kind.startswith("unknown"):
            continue  # another primitive of the name, or a key no lock wrote
        if token is not None and state.token != token:
            return False
        broken, _fence = _force_release(server, state)
        return broken > 0
    return False


def names_under(client: Any, prefix: str) -> List[str]:
    """The names that start with ``prefix`` and have something held, waited on or set (SCAN
    on every server, never KEYS: ``distlock list``'s)."""
    server = resolve_client(client)
    pattern = glob_escape(escape_name(prefix)) + "*"
    return [name for name in list_names(server, pattern) if name.startswith(prefix)]
