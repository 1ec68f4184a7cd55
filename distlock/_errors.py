"""Where the exceptions lived before the layered layout (now ``distlock._core.errors``).

Kept because pickles made by earlier versions name ``distlock._errors._rebuild``: they load
through this module, and what they load is the same class as ``distlock.LockLostError`` and
its siblings. New code imports from ``distlock`` (public) or ``distlock._core.errors``."""

from ._core.errors import (  # noqa: F401 - re-exported for old pickles and old imports
    DistLockError,
    LockLostError,
    LockNotOwnedError,
    NotEnoughReplicasError,
    QuorumError,
    _rebuild,
    _rebuild_quorum,
    _rebuild_replicas,
)
