"""Speed change on the mel and the joins between pieces."""

from __future__ import annotations

import numpy as np
import pytest

from workers.engine.assembly import JoinConfig, change_speed, join_pieces


def test_speed_stretches_the_mel_in_time() -> None:
    mel = np.linspace(0, 1, 80 * 100, dtype=np.float32).reshape(80, 100)
    assert change_speed(mel, 1.0) is mel
    assert change_speed(mel, 2.0).shape == (80, 50)
    slow = change_speed(mel, 0.5)
    assert slow.shape == (80, 200) and slow.dtype == np.float32
    assert slow.min() >= mel.min() and slow.max() <= mel.max()  # interpolation, no overshoot
    assert change_speed(mel[:, :1], 2.0).shape == (80, 1)
    with pytest.raises(ValueError, match="speed must be > 0"):
        change_speed(mel, -1.0)


def test_join_fades_and_pauses() -> None:
    rate = 1000
    config = JoinConfig(gap_s=0.05, fade_s=0.01)
    a, b, c = (np.ones(100, dtype=np.float32) * k for k in (1, 2, 3))
    joined = join_pieces([a, b, c], rate, config)
    assert joined.shape == (300 + 2 * 50,)
    assert np.array_equal(joined[100:150], np.zeros(50))  # the pause
    assert joined[0] == 1 and joined[99] < 0.1  # first piece: untouched start, faded end
    assert joined[150] == 0 and joined[155] == pytest.approx(2 * 0.5)  # fade-in, half way
    assert joined[-1] == 3  # the last piece's end is left alone
    assert np.array_equal(a, np.ones(100))  # inputs are not modified
    assert join_pieces([a], rate, config) is a


def test_join_config_rejects_negative_values() -> None:
    with pytest.raises(ValueError, match="gap_s and fade_s"):
        JoinConfig(gap_s=-1)


def test_breaks_set_the_gaps_and_add_leading_and_trailing_silence() -> None:
    rate = 1000
    config = JoinConfig(gap_s=0.05, fade_s=0.0)
    a, b, c = (np.ones(100, dtype=np.float32) * k for k in (1, 2, 3))
    joined = join_pieces([a, b, c], rate, config, gaps=[0.2, None], lead_s=0.3, tail_s=0.01)
    assert joined.shape == (300 + 300 + 200 + 50 + 10,)
    assert not joined[:300].any() and joined[300] == 1  # lead
    assert not joined[400:600].any() and joined[600] == 2  # the break's 200 ms
    assert not joined[700:750].any() and joined[750] == 3  # the usual gap
    assert not joined[-10:].any()
    single = join_pieces([a], rate, config, tail_s=0.5)
    assert single.shape == (600,) and single[:100].all()
