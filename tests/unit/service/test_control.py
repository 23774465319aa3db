"""The pool <-> worker channel: events up, the retirement grant down, over one socket pair."""

from __future__ import annotations

import os
import socket

from workers.service import control


def pair() -> tuple[int, control.ControlChannel]:
    """(the pool's end as a raw descriptor, the worker's ControlChannel)."""
    ours, theirs = socket.socketpair()
    pool_fd = ours.detach()
    os.set_blocking(pool_fd, False)
    return pool_fd, control.ControlChannel(theirs.detach())


def test_the_grant_reaches_the_worker_and_events_reach_the_pool() -> None:
    pool_fd, channel = pair()
    try:
        assert channel.receive() == []  # nothing yet, and it did not block
        channel.send(control.RETIRING, "max_jobs")
        reader = control.LineReader()
        assert reader.feed(os.read(pool_fd, 4096)) == [
            control.ControlMessage(control.RETIRING, "max_jobs")
        ]
        os.write(pool_fd, control.encode(control.RETIRE))
        assert channel.receive() == [control.ControlMessage(control.RETIRE)]
        assert channel.receive() == []
    finally:
        channel.close()
        os.close(pool_fd)


def test_each_side_reads_only_the_other_sides_events() -> None:
    pool_fd, channel = pair()
    try:
        os.write(pool_fd, control.encode(control.READY) + control.encode(control.RETIRE))
        assert channel.receive() == [control.ControlMessage(control.RETIRE)]
        assert control.LineReader().feed(control.encode(control.RETIRE)) == []
    finally:
        channel.close()
        os.close(pool_fd)


def test_a_vanished_pool_closes_the_channel_so_the_worker_decides_alone() -> None:
    pool_fd, channel = pair()
    os.close(pool_fd)
    assert channel.receive() == []
    assert channel.open is False
    channel.send(control.RETIRING, "max_jobs")  # best effort: no error
    channel.close()
    channel.close()  # twice is harmless (the descriptor is closed once)


def test_pool_gone_reads_the_pools_end_without_taking_a_message() -> None:
    pool_fd, channel = pair()
    try:
        assert channel.pool_gone() is False  # open, nothing waiting
        os.write(pool_fd, control.encode(control.RETIRE))
        assert channel.pool_gone() is False  # a message waiting is not an end
        os.close(pool_fd)
        assert channel.pool_gone() is True  # the pool died: its message is still there
        assert channel.receive() == [control.ControlMessage(control.RETIRE)]
        assert channel.receive() == [] and channel.open is False
        assert channel.pool_gone() is True
    finally:
        channel.close()
    assert channel.pool_gone() is False  # closed by the worker itself: not the pool's doing


def test_pool_gone_on_a_descriptor_that_is_no_socket_is_never_true() -> None:
    read_fd, write_fd = os.pipe()
    channel = control.ControlChannel(write_fd)
    try:
        os.close(read_fd)
        assert channel.pool_gone() is False  # nothing to peek through: the parent check only
    finally:
        channel.close()
