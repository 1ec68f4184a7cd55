"""Holds that change hands: a DistLock hold exported as a handle (a string), then adopted or
released by another object, process or host, its fencing token kept (docs/guides/handles.rst).

A handle names the hold: its lock's name, its owner id (the hash field that holds it) and its
token. Every use checks both in Redis (``lock_handover``, ``lock_release``), so a stale handle
(the hold ended, was adopted already, or the lock was granted again since) changes nothing and
raises LockLostError. The export renames the hold's owner to the handle's own, and an adoption
renames it to the adopter's, in the same script that sets the lease: a handle is used once, and
a renewal of the exporter's still in flight finds nothing to renew.

An exported hold is *detached*: the exporting process no longer renews it, nor gives it back
when its lock object is collected or at interpreter exit. It lives by the lease the export gave
it, until an adopter's watchdog renews it, or until a release by handle ends it.
"""

from __future__ import annotations

import base64
import binascii
import functools
import json
import os
import time
import uuid
from typing import Any, Optional, Tuple

from .._core.checks import check_lease, check_name
from .._core.deadlines import lease_ms
from .._core.election import Leader, check_value, holder_suffix, leader_of
from .._core.errors import LockLostError, LockNotOwnedError
from .._core.flow import Flow, Run, drive
from .._core.settings import settings

__all__ = ["Handles", "encode_handle", "decode_handle"]

#: what every handle starts with; the digit is the format's version
PREFIX = "distlock-hold:1:"


def encode_handle(name: str, owner: str, token: int) -> str:
    """A handle for the hold ``owner`` has of lock ``name`` under ``token``."""
    raw = json.dumps([name, owner, token], separators=(",", ":")).encode("utf-8")
    return PREFIX + base64.urlsafe_b64encode(raw).decode("ascii").rstrip("=")


def decode_handle(handle: object) -> Tuple[str, str, int]:
    """(name, owner, token) of a handle: TypeError for a non-str, ValueError for a string
    that is no handle."""
    if not isinstance(handle, str):
        raise TypeError(f"a hold's handle is a str, not {type(handle).__name__}")
    if not handle.startswith(PREFIX):
        raise ValueError(f"not a distlock hold's handle: {handle[:40]!r}")
    body = handle[len(PREFIX):]
    try:
        name, owner, token = json.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
        if not (isinstance(owner, str) and owner and isinstance(token, int) and token > 0):
            raise ValueError
        return check_name(name), owner, token
    except (ValueError, TypeError, binascii.Error, UnicodeDecodeError):
        raise ValueError(f"a damaged distlock hold's handle: {handle[:40]!r}") from None


class Handles:
    """Mixed into DistLock: ``export``, ``adopt``, ``release_handle``, and the holder value."""

    _name: str
    _keys: Any
    _lease: Optional[float]
    _fair: bool
    _quorum: bool
    _holder: str
    _hold: Any

    def export(self, lease: Optional[float] = None) -> str:
        """Detach this object's hold and return its handle (a str) for another object, process
        or host to ``adopt`` or ``release_handle``. The hold is given ``lease`` seconds from now
        (default: the lock's own lease, or ``configure()``'s 30 s) in the same round trip, and
        this process no longer renews it nor gives it back. LockNotOwnedError (RuntimeError)
        when this object holds nothing; LockLostError when its hold is lost; TypeError on a
        fair lock or a Redlock quorum, which cannot be handed on this way."""
        return self._drive(self._export(lease))  # type: ignore[attr-defined,no-any-return]

    @classmethod
    def _from_handle(cls, name: str, client: Any, lease: Optional[float]) -> Any:
        """The lock object an adoption or a release by handle uses (a subclass with other
        constructor arguments says how to make it)."""
        return cls(name, client=client, lease=lease)  # type: ignore[call-arg]

    @classmethod
    def adopt(cls, handle: str, *, client: Any = None, lease: Optional[float] = None) -> Any:
        """A new lock object of the handle's name that holds the handle's hold (same owner,
        same token): its ``release()``, ``owned()``, ``token`` and ``on_lost`` work as after an
        acquire. ``lease`` None: this process' watchdog renews it from now on; else it lives
        that many seconds. LockLostError when the hold is gone or someone else's (a stale
        handle); TypeError / ValueError for what is no handle."""
        name, owner, token = decode_handle(handle)
        lock: Any = cls._from_handle(name, client, lease)
        lock._drive(lock._adopt(owner, token))
        return lock

    @classmethod
    def release_handle(cls, handle: str, *, client: Any = None) -> None:
        """Release the hold a handle names, token-checked, from anywhere: LockLostError when
        it is gone or someone else's (nothing changes then)."""
        name, owner, token = decode_handle(handle)
        lock: Any = cls._from_handle(name, client, None)
        lock._drive(lock._release_handle(owner, token))

    def holder(self) -> Optional[str]:
        """The holder value of whoever holds the lock now (``DistLock(holder=...)``; "" for a
        hold that carries none), or None when nobody does. One round trip."""
        return self._drive(self._read_holder())  # type: ignore[attr-defined,no-any-return]

    # --- the flows, for both shells -------------------------------------------------------------

    def _refuse_handles(self) -> None:
        if self._fair or self._quorum:
            raise TypeError("a hold of a fair lock or of a Redlock quorum cannot be exported")

    def _export(self, lease: Optional[float]) -> Flow[str]:
        seconds = check_lease(lease)
        self._refuse_handles()
        session = self._session()  # type: ignore[attr-defined]
        hold = self._current(session)  # type: ignore[attr-defined]
        if hold is None:
            raise LockNotOwnedError("export of an unlocked lock", name=self._name)
        # detached first: no renewal starts after this, and neither exit nor collection gives
        # it back (one in flight finds the owner renamed)
        self._forget(hold)  # type: ignore[attr-defined]
        session.drop_hold(hold)
        if session.ran_out(hold):
            raise LockLostError(f"lease on {self._name!r} was lost before export",
                                name=self._name, token=hold.token, cause=hold.cause)
        ms = lease_ms(seconds or self._lease or settings().lease)
        owner = handle_owner()
        # should its reply be lost, nobody holds the handle: given back under either name
        if not (yield from self._hand_over(session, hold.owner, hold.token, owner, ms,
                                           (hold.owner, owner))):
            session.mark_lost(hold)
            raise LockLostError(f"lease on {self._name!r} was lost before export",
                                name=self._name, token=hold.token, cause=hold.cause)
        return encode_handle(self._name, owner, hold.token)

    def _adopt(self, owner: str, token: int) -> Flow[None]:
        self._refuse_handles()
        session = self._session()  # type: ignore[attr-defined]
        watchdog = self._lease is None
        ms = lease_ms(settings().lease if self._lease is None else self._lease)
        mine = self._owner_for(session)  # type: ignore[attr-defined]
        sent_at = time.monotonic()
        # should its reply be lost, the hold is given back if it became ours; the handle
        # still names it if it did not
        if not (yield from self._hand_over(session, owner, token, mine, ms, (mine,))):
            raise LockLostError(f"the handle's hold of {self._name!r} is gone, adopted "
                                f"already, or someone else's", name=self._name, token=token,
                                cause="a stale handle")
        self._grant(session, mine, token, 1, watchdog, ms, sent_at)  # type: ignore[attr-defined]

    def _hand_over(self, session: Any, owner: str, token: int, new: str, ms: int,
                   undo: Tuple[str, ...]) -> Flow[bool]:
        """``lock_handover``: True when the hold is ``new``'s now, with ``ms`` of lease. When
        the script may have run but its reply is unknown (an error, a cancellation), the hold
        is given back under the names ``undo``, token-checked, off the caller's path: nobody
        would believe it."""
        keys = self._keys
        try:
            return int((yield Run("lock_handover", (keys.lock, keys.fence),
                                  (owner, token, new, ms, ms + settings().fence_retention_ms)))) == 1
        except BaseException:
            session.defer(functools.partial(_give_back, session, keys, undo, token))
            raise

    def _release_handle(self, owner: str, token: int) -> Flow[None]:
        self._refuse_handles()
        if int((yield from _release_flow(self._keys, owner, token))) < 0:
            raise LockLostError(f"the handle's hold of {self._name!r} is gone or someone else's",
                                name=self._name, token=token, cause="a stale handle")

    def _read_holder(self) -> Flow[Optional[str]]:
        found = yield from self._read_leader()
        return None if found is None else found.value

    @property
    def _look_keys(self) -> Tuple[str, str]:
        """``elect_look``'s keys: the lock hash and the name's election channel."""
        return self._keys.lock, self._keys.sub("lead")

    def _read_leader(self, publish: bool = False) -> Flow[Optional[Leader]]:
        """Who holds the name now, with its holder value (``elect_look``); ``publish``: and
        hint the name's election observers to look."""
        return leader_of((yield Run("elect_look", self._look_keys, ("1" if publish else "0",))))

    def _set_holder(self, holder: Optional[str]) -> None:
        if holder is not None:
            self._holder = holder_suffix(check_value(holder))


def handle_owner() -> str:
    """The owner id of an exported hold: of no live session (a fresh uuid4, as a session id)."""
    hold_id = os.urandom(6).hex()
    return f"{uuid.uuid4().hex}:{'f' + hold_id[1:] if hold_id.isdigit() else hold_id}"


def _release_flow(keys: Any, owner: str, token: int) -> Flow[Any]:
    return (yield Run("lock_release", (keys.lock, keys.queue), (owner, token, 0)))


def _give_back(session: Any, keys: Any, owners: Tuple[str, ...], token: int) -> None:
    """A chore: release a hold whose hand-over may or may not have run, under each owner it
    may have (token-checked: at most one matches)."""
    for owner in owners:
        try:
            drive(_release_flow(keys, owner, token), session)
        except Exception:  # noqa: BLE001 - what cannot be given back ends with its lease
            pass
