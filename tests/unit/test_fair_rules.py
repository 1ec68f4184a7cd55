"""Fair locks without Redis: the argument check, keys, hand-off messages and how the
dispatcher's bookkeeping (``_redis.pubsub.Board``) routes a hand-off to exactly one wait."""

from __future__ import annotations

import time
from typing import Any

import pytest

from distlock._core.deadlines import Tries
from distlock._core.keys import FairKeys, Keys
from distlock._core.replies import handoff, handoff_grant, yielded_grant
from distlock._primitives.fair import check_fair, entry_lease_ms, new_nonce
from distlock._redis.pubsub import Board


@pytest.mark.parametrize("good", [True, False])
def test_fair_accepts_a_bool(good: bool) -> None:
    assert check_fair(good) is good


@pytest.mark.parametrize("bad,kind", [(1, "int"), ("yes", "str"), (None, "NoneType")])
def test_fair_refuses_anything_else(bad: Any, kind: str) -> None:
    with pytest.raises(TypeError, match=f"^fair must be a bool, not {kind}$"):
        check_fair(bad)


def test_keys_share_the_lock_hash_tag_in_script_order() -> None:
    keys = Keys("distlock:", "orders:{42}")
    fair = FairKeys(keys)
    assert fair.all == (keys.lock, keys.fence, keys.tag + ":fq", keys.tag + ":fd",
                        keys.tag + ":fe", keys.queue)
    assert all(key.startswith(keys.tag) for key in fair.all)


def test_nonces_are_fresh_and_name_their_session() -> None:
    a, b = new_nonce("s1"), new_nonce("s1")
    assert a != b and a.startswith("s1:") and " " not in a


def test_hand_off_messages() -> None:
    assert handoff("+s1:ab 1795 4000") == ("s1:ab", "1795 4000")
    assert handoff_grant("1795 4000") == (1795, 4000, None)
    # a message that names the try whose entry (or record) it read: '<nonce>/<try>'
    assert handoff("+s1:ab/7 1795 4000") == ("s1:ab", "1795 4000 7")
    assert handoff_grant("1795 4000 7") == (1795, 4000, 7)
    assert handoff("+s1:ab/3 1795 4000 2") == ("s1:ab", "1795 4000 2 3")
    assert yielded_grant("1795 4000 2 3") == (1795, 4000, 2, 3)
    assert yielded_grant("1795 4000 0") == (1795, 4000, 1, None)
    for other in ("1", "*", "=a,b", None, 3):
        assert handoff(other) is None


def test_entry_lease_outlives_two_wait_caps() -> None:
    assert entry_lease_ms(3.0) == 7000 and entry_lease_ms(0.5) == 2000


def test_a_hand_off_wakes_exactly_the_wait_it_names() -> None:
    board = Board()
    with board.mutex:
        first, _ = board._enqueue("chan", "n1")
        second, _ = board._enqueue("chan", "n2")
        plain, _ = board._enqueue("chan", None)
    board._handle({"type": "message", "channel": b"chan", "data": b"+n2 77 5000"})
    assert (second.named, second.hinted, second.payload) == (True, True, "77 5000")
    assert second.event.is_set()
    for waiter in (first, plain):
        assert not waiter.named and not waiter.hinted and waiter.payload is None
    # a late hand-off, for a wait that has ended: nobody wakes
    board._handle({"type": "message", "channel": b"chan", "data": b"+n9 78 5000"})
    assert not first.hinted and not plain.hinted


def test_status_names_a_fair_hold() -> None:
    from distlock._cli.inspect import exclusive_state

    fields = {b"s1:4ff8f224d003": b"1", b":t": b"7", b":i": b"h:1", b":n": b"s1:ab"}
    state = exclusive_state("x", "distlock:{x}", b"hash", fields, 1000, b"7")
    assert state is not None and state.kind == "DistLock (fair)" and ":n" not in state.extra


def test_fair_locks_take_no_min_replicas() -> None:
    import distlock

    for cls in (distlock.DistLock, distlock.DistRLock):
        with pytest.raises(TypeError, match="^min_replicas does not apply to a fair lock"):
            cls("x", fair=True, min_replicas=1)
        cls("x", fair=True, min_replicas=0)  # nothing to wait for: fine


def test_fair_locks_are_no_redlock_quorum() -> None:
    import redis

    import distlock
    import distlock.asyncio as adistlock

    masters = [redis.Redis(port=1), redis.Redis(port=2), redis.Redis(port=3)]
    for cls in (distlock.DistLock, distlock.DistRLock):
        with pytest.raises(TypeError, match="^fair does not apply to a Redlock quorum"):
            cls("x", client=masters, fair=True)
    import redis.asyncio as aredis

    amasters = [aredis.Redis(port=1), aredis.Redis(port=2), aredis.Redis(port=3)]
    for acls in (adistlock.DistLock, adistlock.DistRLock):
        with pytest.raises(TypeError, match="^fair does not apply to a Redlock quorum"):
            acls("x", client=amasters, fair=True)


def test_tries_remember_when_the_refused_ones_were_sent() -> None:
    tries = Tries()
    assert tries.sent(None) is None and tries.sent(1) is None
    assert tries.next() == 1
    tries.refused(10.0)
    assert tries.next() == 2  # granted: not kept
    assert tries.sent(1) == 10.0 and tries.sent(2) is None
    for n in range(3, 3 + Tries.KEEP):
        assert tries.next() == n
        tries.refused(float(n))
    assert tries.sent(1) is None  # older than the latest KEEP: believed from nothing
    assert tries.sent(2 + Tries.KEEP) == float(2 + Tries.KEEP)
    assert tries.sent(3) == 3.0
    assert tries.believed_from(3, 2000) == 3.0
    before = time.monotonic()
    for number in (1, None):  # not kept, or not named: believed for nothing
        assert tries.believed_from(number, 2000) + 2.0 <= time.monotonic()
        assert tries.believed_from(number, 2000) + 2.0 >= before
