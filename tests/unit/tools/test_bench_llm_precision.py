"""The benches that share `bench_engine_and_request` (stream, cancel) build the engine with
the LLM precision asked for (`--llm-precision int8` was once silently ignored there)."""

from __future__ import annotations

from pathlib import Path

from workers.engine.stages import ModuleSpeechTokens
from workers.model.llm.model import Qwen2LM
from workers.model.llm.ort_decoder import OrtSpeechLM
from workers.tools.bench.engine_bench import BenchOptions, bench_engine_and_request


def test_the_shared_bench_engine_takes_the_llm_precision(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    for precision, kind in (("int8", OrtSpeechLM), ("native", Qwen2LM)):
        options = BenchOptions(
            model_dir=tiny_model_dir, llm_precision=precision, cache_dir=tmp_path / "cache"
        )
        _, engine, _ = bench_engine_and_request(options, tmp_path / precision)
        assert isinstance(engine.llm, ModuleSpeechTokens)
        assert isinstance(engine.llm.model, kind)
