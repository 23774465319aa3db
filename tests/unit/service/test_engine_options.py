"""The worker's settings reach the engine's options (`default_engine.engine_options`)."""

from __future__ import annotations

from shared.settings import Settings
from workers.service.default_engine import engine_options


def test_the_batch_flow_and_prompt_alignment_settings_reach_the_engine() -> None:
    default = engine_options(Settings())
    assert not default.join_reduced_precision_flow and not default.stream.align_prompt
    chosen = engine_options(Settings(batch_flow="joined", stream_align_prompt=True))
    assert chosen.join_reduced_precision_flow and chosen.stream.align_prompt


def test_the_gpu_decode_settings_reach_the_engine() -> None:
    default = engine_options(Settings()).decode
    assert default.cuda_graphs and not default.compile_step
    chosen = engine_options(Settings(cuda_graphs=False, compile_decode=True)).decode
    assert not chosen.cuda_graphs and chosen.compile_step
