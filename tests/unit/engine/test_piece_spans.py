"""Piece timings: where `piece_spans` says each piece lies is where `join_pieces` put it, and
the stream joiner's piece lengths give the same spans."""

from __future__ import annotations

import numpy as np

from workers.engine.assembly import JoinConfig, join_pieces, piece_spans
from workers.engine.stream_join import StreamJoiner

RATE = 24000


def test_spans_locate_every_piece_in_the_joined_audio() -> None:
    config = JoinConfig(gap_s=0.1, fade_s=0.01)
    pieces = [np.full(n, 0.5, dtype=np.float32) for n in (4800, 100, 9000)]
    gaps = [0.7, None]
    joined = join_pieces(pieces, RATE, config, gaps=gaps, lead_s=0.2, tail_s=0.3)
    spans = piece_spans([p.size for p in pieces], RATE, config, gaps=gaps, lead_s=0.2)
    assert spans[0] == (4800, 9600)  # after 0.2 s of lead
    assert spans[1][0] == spans[0][1] + round(0.7 * RATE)
    assert spans[2][0] == spans[1][1] + round(0.1 * RATE)
    assert joined.size == spans[-1][1] + round(0.3 * RATE)
    inside = np.zeros(joined.size, dtype=bool)
    for start, end in spans:
        assert np.all(joined[start + 240 : end - 240] == 0.5) or end - start < 480
        inside[start:end] = True
    assert np.all(joined[~inside] == 0.0)  # outside the spans: only pauses


def test_the_stream_joiner_reports_the_lengths_the_spans_need() -> None:
    config = JoinConfig()
    pieces = [np.ones(n, dtype=np.float32) for n in (3000, 50, 7000)]
    joiner = StreamJoiner(len(pieces), RATE, config, lambda _: None, gaps=[None, 0.4])
    for piece in pieces:
        joiner.start_piece()
        for chunk in np.array_split(piece, 3):
            joiner.feed(chunk)
        joiner.end_piece()
    joiner.finish()
    assert joiner.lengths == [p.size for p in pieces]
