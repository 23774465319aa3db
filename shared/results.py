"""What a finished job returns (`SynthesisResult`) and why a job failed (`JobFailure`).

The worker builds the result and returns `result.model_dump(mode="json")` from the job function;
RQ stores that JSON and the producer parses it back. Unknown fields are ignored when parsing so a
newer worker's result still reads in an older producer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, JsonValue

AudioFormat = Literal["wav", "flac", "ogg", "mp3", "opus"]
AUDIO_FORMATS: tuple[str, ...] = ("wav", "flac", "ogg", "mp3", "opus")
SampleFormat = Literal["pcm16", "float32"]
FailureKind = Literal[
    "invalid_request", "storage", "transient", "worker_died", "internal", "quality"
]
Verdict = Literal["ok", "suspect"]


class StageTimings(BaseModel):
    """Seconds spent in each step of one job; model stages come from the engine.

    One definition for a job run alone and one run in a batch: a model stage (frontend, llm
    with its prefill, flow, hift, join) is the model's seconds spent on this job, a call made
    for n jobs at once counting 1/n to each (alone, n = 1: the stage's wall time). So the
    stages of the jobs in a batch add up to the model's busy time; the wall time a job took
    is `total_s` (and `SynthesisResult.rtf`), which includes its wait for the model.
    """

    model_config = ConfigDict(extra="ignore")

    queue_wait_s: float = Field(0.0, ge=0)  # enqueued -> started
    frontend_s: float = Field(0.0, ge=0)
    llm_s: float = Field(0.0, ge=0)
    flow_s: float = Field(0.0, ge=0)
    hift_s: float = Field(0.0, ge=0)
    join_s: float = Field(0.0, ge=0)  # the pieces' fades and pauses (assembly)
    encode_s: float = Field(0.0, ge=0)
    store_s: float = Field(0.0, ge=0)
    total_s: float = Field(0.0, ge=0)  # started -> result returned
    first_chunk_s: float | None = Field(None, ge=0)  # started -> first streamed chunk (stream)


class ModelInfo(BaseModel):
    """Which weights made the audio."""

    model_config = ConfigDict(extra="ignore")

    name: str
    checkpoint_hash: str
    family: str | None = None  # cosyvoice2 or cosyvoice3; None: a worker from before CosyVoice 3


class PieceQuality(BaseModel):
    """How the LLM ended one piece: a stop token, or the length bound (a runaway). In the
    order of the result's `pieces` (the same piece at the same index)."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    stop: str  # stop_token, length_bound, forced (benchmarks), unknown (engine did not say)
    speech_tokens: int = Field(0, ge=0)
    tail_repeat: float = Field(0.0, ge=0, le=1)  # 1: its last 2 s of tokens are a loop


class QualityAttempt(BaseModel):
    """One synthesis of the job: its seed and what the check said."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    seed: int | None
    verdict: Verdict
    reasons: list[str] = Field(default_factory=list)


class QualityReport(BaseModel):
    """Measures of the audio the model made (before any loudness change or trim), the verdict
    and every attempt; the kept attempt is the one these measures describe."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    verdict: Verdict
    reasons: list[str] = Field(default_factory=list)
    speech_s: float = Field(0.0, ge=0)  # the pieces' audio, inserted pauses excluded
    expected_s: float = Field(0.0, ge=0)  # from the text's tokens (the speech-limit estimate)
    length_ratio: float | None = None  # speech_s / expected_s; None without an estimate
    longest_silence_s: float = Field(0.0, ge=0)  # inside the speech, pauses we insert excluded
    leading_silence_s: float = Field(0.0, ge=0)
    trailing_silence_s: float = Field(0.0, ge=0)
    clipped_share: float = Field(0.0, ge=0, le=1)
    peak_dbfs: float | None = None
    loudness_lufs: float | None = None  # ITU-R BS.1770 integrated loudness
    true_peak_dbtp: float | None = None
    pieces: list[PieceQuality] = Field(default_factory=list)
    attempts: list[QualityAttempt] = Field(default_factory=list)
    action: str = "none"  # none (ok), accepted, retried, failed
    gain_db: float | None = None  # loudness_lufs: the gain applied (limiter aside)
    output_lufs: float | None = None  # loudness_lufs: the stored audio's loudness
    output_true_peak_dbtp: float | None = None
    trimmed_s: float = Field(0.0, ge=0)  # trim_silence: seconds cut
    measure_s: float = Field(0.0, ge=0)  # what the measures cost, all attempts together

    @property
    def retries(self) -> int:
        return max(0, len(self.attempts) - 1)


class PieceTiming(BaseModel):
    """One piece of a job's text and where its speech lies in the audio (seconds): what
    sentence-level captions are made of. The text is as the model read it (normalised)."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    text: str
    start_s: float = Field(ge=0)
    end_s: float = Field(ge=0)


class SynthesisResult(BaseModel):
    """Where the audio went and what it cost; returned by `workers.tasks.synthesize`."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    schema_version: Literal[1] = 1
    job_id: str
    tenant: str | None = "default"  # who submitted it (shared/tenants.py); None: no tenant tag
    uri: str  # file:///... or s3://bucket/key
    bytes: int = Field(ge=0)
    sha256: str
    format: AudioFormat
    sample_rate: int
    duration_s: float = Field(ge=0)
    timings: StageTimings
    # wall seconds from the attempt's start to its samples being ready / audio seconds
    # (alone or batched: the same clock; a batched job's waits are in it)
    rtf: float = Field(ge=0)
    model: ModelInfo
    backend: str
    device: str
    worker_name: str
    worker_pid: int
    attempt: int = Field(ge=1)
    speech_tokens: int = Field(0, ge=0)
    batch_size: int = Field(1, ge=1)  # the most jobs that shared an LLM step with this one
    idempotency_key: str | None = None
    stream: str | None = None  # the Redis Stream key its chunks went to (requests with stream)
    metadata: dict[str, JsonValue] = Field(default_factory=dict)
    pieces: list[PieceTiming] = Field(default_factory=list)  # empty: the engine gave none
    quality: QualityReport | None = None  # None: a worker older than the quality check


@dataclass(frozen=True)
class JobFailure:
    """Why a job has no result: the worker's short reason, or RQ's last exception line."""

    kind: str  # one of FailureKind, or "unknown" when only RQ's exc_info is there
    message: str

    def as_meta(self) -> dict[str, str]:
        """The value the worker stores in job.meta["cosyq_error"]."""
        return {"kind": self.kind, "message": self.message}

    @classmethod
    def from_meta(cls, value: Any) -> JobFailure | None:
        """Parse job.meta["cosyq_error"]; None when absent or malformed."""
        if isinstance(value, dict) and isinstance(value.get("message"), str):
            return cls(kind=str(value.get("kind", "internal")), message=value["message"])
        return None
