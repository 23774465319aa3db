"""The product's engine factory: Settings -> backend and device choice -> a loaded engine.

The one place the worker's settings reach the engine: `select_backend` picks torch or Core ML
and the device, `engine_options` maps the settings onto the engine's plain options, and the
engine itself never sees a Settings object.
"""

from __future__ import annotations

from shared.errors import ModelLoadError
from shared.logs import get_logger
from shared.settings import Settings
from workers.engine.api import SynthesisEngine
from workers.engine.assembly import JoinConfig
from workers.engine.pipeline import EngineOptions, build_engine
from workers.engine.streaming import StreamSchedule
from workers.engine.text_split import SplitConfig
from workers.model.heap import HeapPolicy
from workers.model.llm.decoder_choice import DecodeChoice
from workers.service.backend import select_backend
from workers.service.cache_folders import check_writable

log = get_logger(__name__)


def dtype_for(settings: Settings, torch_device: str) -> str:
    """`COSYQ_DTYPE`, with `auto` resolved for the device the torch stages run on; logged."""
    from workers.engine.auto_dtype import resolve_dtype_setting  # noqa: PLC0415
    from workers.engine.devices import resolve_device  # noqa: PLC0415

    device = resolve_device(torch_device)  # "auto": mps, cuda, cpu as the engine picks
    choice = resolve_dtype_setting(settings.dtype, device)
    log.info("dtype_chosen", setting=settings.dtype, dtype=choice.name, reason=choice.reason)
    return choice.name


def llm_precision_for(settings: Settings, device: str, backend: str) -> str:
    """`COSYQ_LLM_PRECISION`, with `auto` resolved for this host; logged with its reason."""
    from workers.engine.devices import resolve_device  # noqa: PLC0415
    from workers.engine.llm_precision import choose_llm_precision  # noqa: PLC0415

    choice = choose_llm_precision(
        settings.llm_precision, device=resolve_device(device), backend=backend
    )
    log.info(
        "llm_precision_chosen",
        setting=settings.llm_precision,
        precision=choice.name,
        reason=choice.reason,
    )
    return choice.name


def engine_options(settings: Settings, *, llm_precision: str = "native") -> EngineOptions:
    """The engine's per-engine choices, from the worker's settings."""
    return EngineOptions(
        llm_precision=llm_precision,
        ort_cache_dir=settings.ort_cache_dir,
        normalize_text=settings.normalize_text,
        split=SplitConfig(max_piece_tokens=settings.max_piece_tokens),
        join=JoinConfig(gap_s=settings.piece_gap_ms / 1000),
        max_prompt_seconds=settings.max_prompt_seconds,
        max_prompt_text_tokens=settings.max_prompt_text_tokens,
        max_speech_seconds=settings.max_speech_seconds,
        max_batch=settings.batch_size,
        batch_max_positions=settings.batch_max_positions,
        join_reduced_precision_flow=settings.batch_flow == "joined",
        stream=StreamSchedule(
            first_hop=settings.stream_first_hop_tokens,
            max_hop=max(settings.stream_max_hop_tokens, settings.stream_first_hop_tokens),
            flow_cache_max_mb=settings.stream_flow_cache_max_mb,
            voice_cache_max_mb=settings.stream_voice_cache_max_mb,
            align_prompt=settings.stream_align_prompt,
        ),
        heap=HeapPolicy(
            mmap_threshold_mb=settings.malloc_mmap_threshold_mb,
            trim_threshold_mb=settings.malloc_trim_threshold_mb,
            build_mmap_threshold_kb=settings.malloc_build_mmap_threshold_kb,
        ),
        decode=DecodeChoice(cuda_graphs=settings.cuda_graphs, compile_step=settings.compile_decode),
    )


def engine_from_settings(settings: Settings) -> SynthesisEngine:
    """The default `COSYQ_ENGINE`: torch or Core ML, as `select_backend` decides."""
    if settings.model_dir is None:
        raise ModelLoadError(
            "COSYQ_MODEL_DIR is not set: point it at a CosyVoice2-0.5B folder "
            "(or write a test model with `cosyq-worker model init-tiny DIR`)"
        )
    choice = select_backend(settings, settings.model_dir)  # Linux + coreml: the one-line refusal
    if settings.compile_decode:  # before anything compiles: a recycled worker reads the cache
        from workers.model.compile_cache import use_compile_cache  # noqa: PLC0415

        use_compile_cache(settings.compile_cache_dir)
    options = engine_options(settings)
    if choice.backend == "coreml":  # macOS with a valid conversion; coremltools loads only here
        from workers.coreml.engine import CoreMLPlacement, load_coreml_engine  # noqa: PLC0415

        llm_precision_for(settings, choice.torch_device, "coreml")  # int8 refused, auto logged
        if choice.coreml_dir is None or choice.compute_units is None:
            raise ModelLoadError(f"Core ML was chosen without a conversion: {choice.reason}")
        placement = CoreMLPlacement(
            torch_device=choice.torch_device,
            reported_device=choice.device,
            compute_units=choice.compute_units,
            coreml_dir=choice.coreml_dir,
        )
        return load_coreml_engine(
            settings.model_dir,
            placement,
            cache_dir=settings.coreml_cache_dir,
            compile_timeout_s=settings.coreml_compile_timeout_s,
            batch_size=settings.batch_size,  # > 1: the LLM decodes batched on torch (MPS)
            dtype=dtype_for(settings, choice.torch_device),
            options=options,
            hash_cache_dir=settings.hash_cache_dir,
        )
    precision = llm_precision_for(settings, choice.device, choice.backend)
    if precision == "int8":  # `auto` chose it: its graphs' folder, probed before the model loads
        check_writable("ort_cache_dir", settings.ort_cache_dir)
    return build_engine(
        settings.model_dir,
        device=choice.device,
        dtype=dtype_for(settings, choice.device),
        options=engine_options(settings, llm_precision=precision),
        hash_cache_dir=settings.hash_cache_dir,
    )
