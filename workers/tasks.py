"""The job functions RQ calls by dotted path: the one place queue, engine and storage meet.

`synthesize(request)` validates the payload again (anyone who can write to Redis can skip the
producer), resolves the voice, synthesizes, encodes, stores, and returns the SynthesisResult as
JSON. Errors are raised as they are; the worker classifies them (permanent, transient, internal).
One canonical `synthesis_finished` log line per job: lengths and timings, never the text.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
import structlog
from rq import get_current_job

from shared import keys
from shared.audio import EncodedAudio
from shared.connection import REDIS_OUTAGE
from shared.document_state import start_segment
from shared.errors import InvalidRequestError
from shared.job_index import Outcome, record_outcome
from shared.job_text import model_text
from shared.jobs import (
    NATIVE_SAMPLE_RATE,
    SUPPORTED_SAMPLE_RATES,
    SynthesisRequest,
    validate_request,
    voice_label,
)
from shared.logs import get_logger, job_context, log_synthesis_finished
from shared.output_keys import check_tenant_key
from shared.prompt_uris import check_prompt_uri
from shared.results import ModelInfo, PieceTiming, QualityReport, StageTimings, SynthesisResult
from shared.storage import StoredObject, audio_metadata, object_key, stored_key
from shared.storage_retry import Backoff, put_with_retries
from shared.tenants import DEFAULT_TENANT
from shared.voice_uploads import VoiceUpload, settle_upload
from workers.documents.job import record_finished_segment
from workers.engine.api import (
    StopCheck,
    StreamingEngine,
    SynthesisEngine,
    SynthesisInput,
    SynthesisOutput,
    VoicePrompt,
    stop_if_asked,
)
from workers.service import levels, metrics, quality
from workers.service.audio_expiry import remember_audio
from workers.service.audio_stream import AudioStreamWriter
from workers.service.failures import classify
from workers.service.job_context import JobContext
from workers.service.job_runtime import WorkerRuntime, current_runtime
from workers.service.quality import quality_log_fields
from workers.voices import profiles as voice_profiles

log = get_logger(__name__)


def synthesize(request: dict[str, Any]) -> dict[str, Any]:
    """RQ entry point: one request dict in, one SynthesisResult dict out."""
    job = get_current_job()
    if job is None:
        raise RuntimeError("workers.tasks.synthesize runs only as an RQ job")
    runtime = current_runtime()
    context = JobContext.from_job(job, cancel_check_s=runtime.settings.cancel_check_ms / 1000)
    result = run_synthesis(runtime, request, context)
    metrics.record_stages(result.timings.model_dump(), result.duration_s)
    return result.model_dump(mode="json")


def add_voice(
    name: str, prompt_audio: str, transcript: str = "", owner: str = DEFAULT_TENANT
) -> dict[str, Any]:
    """RQ entry point of `cosyq voices add`: prompt URI in, the stored profile's summary out.
    `owner` is the job's own tenant, or keys.SHARED_VOICES (an operator's or the CLI's shared
    voice); any other tenant is refused (a job stores voices for its own tenant only)."""
    job = get_current_job()
    if job is None:
        raise RuntimeError("workers.tasks.add_voice runs only as an RQ job")
    runtime = current_runtime()
    context = JobContext.from_job(job)
    with job_context(
        job_id=context.job_id,
        queue=context.queue,
        worker=runtime.worker_name,
        attempt=context.attempt,
        voice=name,
    ):
        check_readable_prompt(runtime, prompt_audio)
        voice_profiles.check_job_owner(owner, context.scope_tenant)
        upload = VoiceUpload(owner, name, prompt_audio, context.job_id)
        try:
            summary = voice_profiles.add_voice(
                runtime.engine,
                runtime.storage,
                runtime.voices.registered_voices.registry_of(owner),
                name=name,
                prompt_audio=prompt_audio,
                transcript=transcript,
                max_transcript_chars=runtime.limits.max_text_chars,
                max_prompt_seconds=runtime.settings.max_prompt_seconds,
                max_voices=None
                if owner == keys.SHARED_VOICES
                else runtime.settings.max_voices(owner),
            )
        except InvalidRequestError:
            settle_upload(context.connection, upload)  # refused for good: add_voice deleted it
            raise
        settle_upload(context.connection, upload)  # the voice names it now
        log.info("voice_added", speech_tokens=summary.get("speech_tokens"))
        return summary


@dataclass(frozen=True)
class PreparedSynthesis:
    """A validated request with its voice resolved: what the engine needs, plus the books."""

    request: SynthesisRequest
    context: JobContext
    engine_input: SynthesisInput
    started: float  # perf_counter() when the job function began
    voice_s: float  # validation + voice lookup


def run_synthesis(
    runtime: WorkerRuntime,
    payload: Mapping[str, Any],
    context: JobContext,
    *,
    owned: Callable[[], bool] = lambda: True,
) -> SynthesisResult:
    """Validate, resolve the voice, synthesize, encode, store; log one synthesis_finished.

    A request with `stream: true` (never batched into rows) also appends its chunks to its
    audio stream; a failed attempt ends that stream with its error before the error
    propagates, unless the attempt is no longer `owned` (a batch window timed it out: the
    retry owns the stream now).
    """
    writer = _open_stream(runtime, payload, context)
    try:
        prepared = prepare_synthesis(runtime, payload, context)
        with _logged(runtime, prepared.context, prepared.request):
            output = _synthesize(runtime.engine, prepared.engine_input, writer)
        return finish_synthesis(
            runtime,
            prepared,
            output,
            synthesized_at=time.perf_counter(),
            stream=writer,
            resynthesize=runtime.engine.synthesize if writer is None else None,
        )
    except Exception as e:
        if writer is not None and owned():
            failure = classify(e, timeout_s=runtime.settings.job_timeout_s)
            writer.fail(failure.kind, failure.message)
        raise


def _open_stream(
    runtime: WorkerRuntime, payload: Mapping[str, Any], context: JobContext
) -> AudioStreamWriter | None:
    """A writer when the payload asks for a stream (checked before validation, so an invalid
    request's stream still ends with its error)."""
    if not isinstance(payload, Mapping) or payload.get("stream") is not True:
        return None
    if context.connection is None:
        raise RuntimeError("a streamed job needs its Redis connection (run it as an RQ job)")
    rate = payload.get("sample_rate", NATIVE_SAMPLE_RATE)
    if not isinstance(rate, int) or rate not in SUPPORTED_SAMPLE_RATES:
        rate = NATIVE_SAMPLE_RATE  # the request is refused below; its error entry needs a rate
    return AudioStreamWriter(
        context.connection,
        keys.audio_stream_key(context.job_id),
        source_rate=runtime.engine.sample_rate,
        target_rate=rate,
        attempt=context.attempt,
        maxlen=runtime.settings.stream_maxlen,
        ttl_s=runtime.settings.result_ttl_s,
    )


def _synthesize(
    engine: SynthesisEngine, data: SynthesisInput, writer: AudioStreamWriter | None
) -> SynthesisOutput:
    """The engine's output; streamed, each chunk goes to the writer as it is made."""
    if writer is None:
        return engine.synthesize(data)
    if isinstance(engine, StreamingEngine):
        return engine.synthesize_streaming(data, writer.write)
    output = engine.synthesize(data)  # an engine that cannot stream: one chunk
    writer.write(output.samples)
    return output


def prepare_synthesis(
    runtime: WorkerRuntime, payload: Mapping[str, Any], context: JobContext
) -> PreparedSynthesis:
    """Validate the payload and resolve its voice (the batch runner calls this beside the model)."""
    with _logged(runtime, context):
        started = time.perf_counter()
        request = validate_request(payload, runtime.limits)
        check_tenant_key(context.scope_tenant, request.output_key, context.document)
        _start_segment(runtime, context)
        if request.prompt_audio is not None:
            check_readable_prompt(runtime, request.prompt_audio)
        structlog.contextvars.bind_contextvars(voice=voice_label(request))
        prompt = runtime.voices.resolve(request, context.scope_tenant)
        return PreparedSynthesis(
            request=request,
            context=context,
            engine_input=_engine_input(
                request, prompt, context.should_stop, segment=context.document is not None
            ),
            started=started,
            voice_s=time.perf_counter() - started,
        )


def _start_segment(runtime: WorkerRuntime, context: JobContext) -> None:
    """A document's segment renews its document's TTL as it starts, and fails when the
    document expired before it ran (its audio would never be assembled)."""
    if context.document is not None and context.connection is not None:
        document_id, index = context.document
        ttl = runtime.settings.result_ttl_s
        start_segment(context.connection, document_id, index, context.job_id, ttl_s=ttl)


def finish_synthesis(
    runtime: WorkerRuntime,
    prepared: PreparedSynthesis,
    output: SynthesisOutput,
    *,
    synthesized_at: float,
    stream: AudioStreamWriter | None = None,
    resynthesize: quality.Resynthesize | None = None,
) -> SynthesisResult:
    """Check quality (retrying suspect audio through `resynthesize`, the same engine API),
    trim and normalise on request, encode, store, build the result and log the job's one
    synthesis_finished line.

    A streamed job's file is encoded from exactly the samples its stream carries (resampled
    chunk by chunk to the request's rate), and its final entry goes out once it is stored."""
    request, context = prepared.request, prepared.context
    with _logged(runtime, context, request):
        output, report = _checked(runtime, prepared, output, resynthesize)
        # the kept samples' readiness: a retry's samples are ready once the check returns
        synthesized = synthesized_at if not report.retries else time.perf_counter()
        samples: np.ndarray = output.samples
        rate = output.sample_rate
        if stream is not None:
            samples, rate = stream.flush(), stream.target_rate
        else:
            output, report = quality.process_audio(output, request, runtime.settings, report)
            samples, rate = output.samples, output.sample_rate  # the delivered rate with levels
        encoded, report = levels.encode_delivered(samples, rate, request, report)
        encoded_at = time.perf_counter()
        stop_if_asked(context.should_stop)  # canceled at the last step: nothing is stored
        stored = _store(runtime, request, context, encoded)
        if stream is not None:
            stream.finish(stored.uri)
        finished = time.perf_counter()
        timings = StageTimings(
            queue_wait_s=context.queue_wait_s,
            frontend_s=prepared.voice_s + output.stage_seconds.get("frontend", 0.0),
            llm_s=output.stage_seconds.get("llm", 0.0),
            flow_s=output.stage_seconds.get("flow", 0.0),
            hift_s=output.stage_seconds.get("hift", 0.0),
            join_s=output.stage_seconds.get("join", 0.0),
            encode_s=encoded_at - synthesized,
            store_s=finished - encoded_at,
            total_s=finished - prepared.started,
            first_chunk_s=_first_chunk_s(stream, prepared.started),
        )
        result = _result(
            runtime,
            request,
            context,
            uri=stored.uri,
            encoded=encoded,
            output=output,
            timings=timings,
            synthesis_s=max(0.0, synthesized - prepared.started),
            stream=None if stream is None else stream.key,
        ).model_copy(update={"quality": report})
        _log_finished(request, result, synthesis_s=synthesized - prepared.started)
        metrics.record_quality(report.verdict, report.action, report.retries)
        _record_outcome(runtime, context, result)
        _remember_audio(runtime, context, stored, named=request.output_key is not None)
        if context.document is not None and context.connection is not None:
            record_finished_segment(context.connection, runtime.settings, context.document, result)
        return result


def _checked(
    runtime: WorkerRuntime,
    prepared: PreparedSynthesis,
    output: SynthesisOutput,
    resynthesize: quality.Resynthesize | None,
) -> tuple[SynthesisOutput, QualityReport]:
    """The output to keep and its quality report (QualityError when the request fails)."""
    settings = runtime.settings
    timeout = prepared.context.timeout_s or float(settings.job_timeout_s)
    return quality.checked_output(
        output,
        prepared.engine_input,
        quality.QualityPolicy.from_settings(settings),
        on_suspect=prepared.request.on_suspect or settings.quality_on_suspect,
        resynthesize=resynthesize,
        deadline=prepared.started + timeout,
    )


def _first_chunk_s(writer: AudioStreamWriter | None, started: float) -> float | None:
    if writer is None or writer.first_chunk_at is None:
        return None
    return max(0.0, writer.first_chunk_at - started)


@contextmanager
def _logged(
    runtime: WorkerRuntime, context: JobContext, request: SynthesisRequest | None = None
) -> Iterator[None]:
    """Bind the job's log context in whichever thread runs this phase."""
    with job_context(
        job_id=context.job_id,
        queue=context.queue,
        tenant=context.tenant,
        worker=runtime.worker_name,
        attempt=context.attempt,
    ):
        if request is not None:
            structlog.contextvars.bind_contextvars(voice=voice_label(request))
        yield


def check_readable_prompt(runtime: WorkerRuntime, uri: object) -> None:
    """The worker's own gate for prompt audio: a well-formed URI under COSYQ_PROMPT_ROOTS."""
    if not isinstance(uri, str):
        raise InvalidRequestError("prompt_audio: must be a file:// or s3:// URI string")
    try:
        check_prompt_uri(uri, runtime.limits.max_output_key_chars)
    except ValueError as e:
        raise InvalidRequestError(f"prompt_audio: {e}") from None
    runtime.prompt_roots.check(uri)


def _store(
    runtime: WorkerRuntime, request: SynthesisRequest, context: JobContext, encoded: EncodedAudio
) -> StoredObject:
    """Deterministic key (a retry overwrites the same object), content type and metadata.

    A transient failure is retried here, a few times, so the audio is not synthesized again.
    """
    key = object_key(
        context.job_id,
        encoded.extension,
        request.output_key,
        context.enqueued_at,
        tenant=context.scope_tenant,
        document=context.document,
    )
    metadata = audio_metadata(
        job_id=context.job_id, sha256=encoded.sha256, duration_s=encoded.duration_s
    )
    return put_with_retries(
        runtime.storage,
        key,
        encoded.data,
        encoded.content_type,
        metadata,
        attempts=runtime.settings.storage_write_attempts,
        backoff=Backoff.from_settings(runtime.settings),
    )


def _remember_audio(
    runtime: WorkerRuntime, context: JobContext, stored: StoredObject, *, named: bool
) -> None:
    """Where the audio is, for its deletion once the job expires (workers/service/audio_expiry;
    a document's segments are its document's to delete). A Redis blip costs the record: the
    audio then stays, as it did before records, never the job its result."""
    key = stored_key(runtime.storage.base_uri, stored.uri)
    if context.connection is None or context.document is not None or key is None:
        return
    try:
        remember_audio(
            context.connection, runtime.settings, context.job_id, key, context.tenant, named=named
        )
    except REDIS_OUTAGE as e:
        log.warning("job_audio_unrecorded", job_id=context.job_id, error=str(e))


def _record_outcome(runtime: WorkerRuntime, context: JobContext, result: SynthesisResult) -> None:
    """The operator page's summary and throughput (shared/job_index.py); a Redis blip here
    costs the page a row, never the job its result."""
    if context.connection is None:
        return
    verdict = result.quality.verdict if result.quality is not None else None
    keep_s = runtime.settings.result_ttl_s
    outcome = Outcome(result.job_id, context.tenant, result.duration_s, verdict, keep_s)
    try:
        record_outcome(context.connection, outcome)
    except REDIS_OUTAGE as e:
        log.warning("job_outcome_not_indexed", job_id=result.job_id, error=str(e))


def _log_finished(
    request: SynthesisRequest, result: SynthesisResult, *, synthesis_s: float
) -> None:
    """The canonical per-job line: sizes and timings only, never the text."""
    extra: dict[str, Any] = {"synthesis_s": round(synthesis_s, 4), "batch_size": result.batch_size}
    if result.quality is not None:
        extra.update(quality_log_fields(result.quality))
    log_synthesis_finished(log, result, text_chars=len(request.text), extra=extra)


def _engine_input(
    request: SynthesisRequest,
    prompt: VoicePrompt,
    should_stop: StopCheck | None,
    *,
    segment: bool = False,
) -> SynthesisInput:
    """The engine's request; a document's `segment` is spoken piece by piece past the speech
    bound rather than refused (the producer sized it by an estimate, not the model's count)."""
    return SynthesisInput(
        text=model_text(request.text, request.markup),  # plain: its "<"s made characters
        prompt=prompt,
        mode=request.mode,
        language=request.language,
        instruction=request.instruction,
        speed=request.speed,
        seed=request.seed,
        should_stop=should_stop,
        split_past_limit=segment,
    )


def _result(
    runtime: WorkerRuntime,
    request: SynthesisRequest,
    context: JobContext,
    *,
    uri: str,
    encoded: EncodedAudio,
    output: SynthesisOutput,
    timings: StageTimings,
    synthesis_s: float,
    stream: str | None = None,
) -> SynthesisResult:
    """`rtf` is the attempt's wall seconds from its start to its samples being ready, over the
    audio's seconds: what the job took, alone or batched (a batched job's wait for its slot
    and for its neighbours' stages included), never its share of the model's time."""
    identity = runtime.engine.identity
    return SynthesisResult(
        job_id=context.job_id,
        tenant=context.tenant,
        uri=uri,
        bytes=len(encoded.data),
        sha256=encoded.sha256,
        format=request.format,
        sample_rate=encoded.sample_rate,
        duration_s=encoded.duration_s,
        timings=timings,
        rtf=synthesis_s / encoded.duration_s if encoded.duration_s > 0 else 0.0,
        model=ModelInfo(
            name=identity.name, checkpoint_hash=identity.checkpoint_hash, family=identity.family
        ),
        backend=identity.backend,
        device=identity.device,
        worker_name=runtime.worker_name,
        worker_pid=runtime.worker_pid,
        attempt=context.attempt,
        speech_tokens=output.speech_tokens,
        batch_size=max(1, output.batch_size),
        idempotency_key=request.idempotency_key,
        stream=stream,
        metadata=dict(request.metadata),
        pieces=_piece_timings(output),
    )


def _piece_timings(output: SynthesisOutput) -> list[PieceTiming]:
    """The engine's piece spans in seconds (the same at any output sample rate)."""
    rate = output.sample_rate
    return [
        PieceTiming(text=piece.text, start_s=piece.start / rate, end_s=piece.end / rate)
        for piece in output.pieces
    ]
