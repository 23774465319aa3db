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
