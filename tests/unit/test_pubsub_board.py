"""The pub/sub bookkeeping (``_redis.pubsub.Board``) without a connection: SUBSCRIBE and
UNSUBSCRIBE of one channel are decided in order, and what the board believes follows what the
server confirms (tests/topologies/test_subscriptions.py shows the same on real servers)."""

from __future__ import annotations

import time
from typing import List, Optional

from distlock._redis.pubsub import Board, Waiter

CONNECTION = object()  # stands for the pub/sub connection: only compared


def _board() -> Board:
    board = Board()
    board._pubsub = CONNECTION
    return board


def _join(board: Board, name: str) -> tuple[Waiter, bool]:
    """A waiter on ``name``, and whether the board asked for a SUBSCRIBE."""
    with board.mutex:
        waiter, pubsub = board._enqueue(name, None)
    return waiter, pubsub is CONNECTION


def _confirm(board: Board, kind: str, name: str) -> None:
    board._handle({"type": kind, "channel": name.encode(), "data": 1})


def _subscribed(board: Board, name: str) -> Waiter:
    """A waiter on ``name``, subscribed and confirmed."""
    waiter, send = _join(board, name)
    assert send
    _confirm(board, "subscribe", name)
    assert name in board.subscribed()
    return waiter


def _idle(board: Board, waiter: Waiter, name: str) -> None:
    """``waiter`` leaves; the channel is idle long enough to be given up."""
    board.leave(waiter, False)
    board.channels[name].idle_since = time.monotonic() - 60


def _given_up(board: Board, name: str, keep: Optional[str] = "keep") -> List[str]:
    if keep is not None and keep not in board.channels:
        _subscribed(board, keep)  # another channel in use: the reader unsubscribes, not exits
    names, done = board._drop_idle()
    assert not done
    return names


def test_a_join_while_the_unsubscribe_is_on_its_way_sends_no_subscribe() -> None:
    board = _board()
    first = _subscribed(board, "ch")
    _idle(board, first, "ch")
    assert _given_up(board, "ch") == ["ch"]
    assert "ch" not in board.subscribed()
    again, send = _join(board, "ch")
    assert not send  # it would reach the server before the UNSUBSCRIBE
    assert "ch" not in board._to_resubscribe()
    _confirm(board, "unsubscribe", "ch")  # the server dropped it: now subscribe it again
    assert board._to_resubscribe() == ["ch"]
    _confirm(board, "subscribe", "ch")
    assert "ch" in board.subscribed() and again.channel.confirmed.is_set()
    assert not again.hinted  # it subscribed before its first try: nothing to catch up on


def test_an_unused_channel_goes_when_its_unsubscribe_is_confirmed() -> None:
    board = _board()
    first = _subscribed(board, "ch")
    _idle(board, first, "ch")
    assert _given_up(board, "ch") == ["ch"]
    assert "ch" in board.channels and board._drop_idle() == ([], False)  # not sent twice
    _confirm(board, "unsubscribe", "ch")
    assert "ch" not in board.channels


def test_a_channel_never_subscribed_is_forgotten_at_once() -> None:
    board = _board()
    waiter, _ = _join(board, "ch")  # its SUBSCRIBE failed: the connection will be replaced
    with board.mutex:
        board._reset_channels()
    _idle(board, waiter, "ch")
    assert _given_up(board, "ch") == [] and "ch" not in board.channels


def test_the_reader_exits_when_every_channel_is_idle_or_leaving() -> None:
    board = _board()
    a = _subscribed(board, "a")
    _idle(board, a, "a")
    assert _given_up(board, "a", keep="b") == ["a"]
    b = board.channels["b"].waiters[0]
    _idle(board, b, "b")
    assert board._drop_idle() == ([], True)  # closing the connection unsubscribes both
    assert not board.channels and board._pubsub is None


def test_a_reconnect_inside_redis_py_ends_leaving_either_way() -> None:
    """redis-py, reconnecting by itself, subscribes again what it knows, the channel leaving
    included, and may then send the UNSUBSCRIBE again: the board follows both confirmations."""
    board = _board()
    first = _subscribed(board, "ch")
    _idle(board, first, "ch")
    assert _given_up(board, "ch") == ["ch"]
    waiter, _ = _join(board, "ch")
    _confirm(board, "subscribe", "ch")  # redis-py's re-subscription: subscribed after all
    assert "ch" in board.subscribed() and not board.channels["ch"].leaving
    _confirm(board, "unsubscribe", "ch")  # and the UNSUBSCRIBE it sent again after it
    assert "ch" not in board.subscribed() and board._to_resubscribe() == ["ch"]
    _confirm(board, "subscribe", "ch")
    assert waiter.hinted  # hints may have gone by while it was not subscribed: try again


def test_a_new_connection_ends_leaving() -> None:
    board = _board()
    first = _subscribed(board, "ch")
    _idle(board, first, "ch")
    assert _given_up(board, "ch") == ["ch"]
    _join(board, "ch")
    with board.mutex:
        board._reset_channels()  # a fresh connection: nothing subscribed on it yet
    assert sorted(board._to_resubscribe()) == ["ch", "keep"]
