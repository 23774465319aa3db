"""Job functions standing in for workers.tasks.synthesize in the producer's tests.

They speak the real contract (request dict in, SynthesisResult dict out, failure reason in
job.meta["cosyq_error"]) and use the real storage and audio code; only the model is replaced by a
tone whose length follows the text (10 ms per character, at least 0.1 s). Settings come from the
environment, as in a real worker. A request whose metadata holds "fail_with" fails with that
reason.
"""

from __future__ import annotations

import os
import socket
import time
from typing import Any

import numpy as np
from rq import get_current_job

from shared.audio import encode_audio
from shared.errors import InvalidRequestError
from shared.jobs import NATIVE_SAMPLE_RATE, RequestLimits, validate_request
from shared.keys import ERROR_META_KEY
from shared.results import JobFailure, ModelInfo, StageTimings, SynthesisResult
from shared.settings import load_settings
from shared.storage import audio_metadata, object_key, open_storage

SECONDS_PER_CHAR = 0.01


def tone_for(text: str) -> np.ndarray:
    seconds = max(0.1, SECONDS_PER_CHAR * len(text))
    t = np.arange(int(seconds * NATIVE_SAMPLE_RATE)) / NATIVE_SAMPLE_RATE
    return (0.3 * np.sin(2 * np.pi * 220 * t)).astype(np.float32)


def synthesize(request: dict[str, Any]) -> dict[str, Any]:
    """Validate, 'synthesize' a tone, encode, store; return the result dict."""
    started = time.monotonic()
    job = get_current_job()
    assert job is not None
    settings = load_settings(env_file=None)
    try:
        checked = validate_request(request, RequestLimits.from_settings(settings))
    except InvalidRequestError as e:
        job.meta[ERROR_META_KEY] = JobFailure("invalid_request", str(e)).as_meta()
        job.save_meta()
        raise
    if "fail_with" in checked.metadata:  # lets a test make one job of a batch fail
        message = str(checked.metadata["fail_with"])
        job.meta[ERROR_META_KEY] = JobFailure("internal", message).as_meta()
        job.save_meta()
        raise RuntimeError(message)
    samples = tone_for(checked.text)
    encoded = encode_audio(
        samples, NATIVE_SAMPLE_RATE, checked.format, checked.sample_rate, checked.sample_format
    )
    key = object_key(job.id, encoded.extension, checked.output_key, now=job.enqueued_at)
    meta = audio_metadata(job_id=job.id, sha256=encoded.sha256, duration_s=encoded.duration_s)
    stored = open_storage(settings).put(key, encoded.data, encoded.content_type, meta)
    total = time.monotonic() - started
    return SynthesisResult(
        job_id=job.id,
        uri=stored.uri,
        bytes=stored.bytes,
        sha256=encoded.sha256,
        format=checked.format,
        sample_rate=encoded.sample_rate,
        duration_s=encoded.duration_s,
        timings=StageTimings(total_s=total),
        rtf=total / encoded.duration_s,
        model=ModelInfo(name="fake-tone", checkpoint_hash="none"),
        backend="fake",
        device="cpu",
        worker_name=socket.gethostname(),
        worker_pid=os.getpid(),
        attempt=1,
        idempotency_key=checked.idempotency_key,
        metadata=checked.metadata,
    ).model_dump(mode="json")


def crash(request: dict[str, Any]) -> dict[str, Any]:
    """Fails without a cosyq reason, as an unexpected bug would."""
    raise RuntimeError("boom in the engine")
