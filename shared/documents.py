"""The document contract: one long text and the usual voice and audio options, as segments.

A document is a `SynthesisRequest` whose text may be up to COSYQ_MAX_DOCUMENT_CHARS long and may
be plain text, Markdown or SSML (`markup`). `validate_document` is its gate, run by the
producer: the options are checked by the job contract's own validators, the text is split
(`shared.document_split`) and every segment is checked again as the ordinary job it becomes
(`validate_request`), so a document's errors read like a job's ("text: ...", "voice: ...",
"segments[3]: text: ..."). The worker checks each segment's job as it checks any job.

Each segment is synthesized losslessly (WAV float32 at the document's sample rate) under
`documents/<id>/segments/`, and seeded from the document's seed by `segment_seed`, so the same
document and seed give the same audio whatever order the segments ran in and wherever.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import ConfigDict, JsonValue, ValidationError, ValidationInfo, field_validator

from shared.document_split import (
    DocumentSegment,
    Markup,
    Pauses,
    SplitLimits,
    detect_markup,
    split_document,
)
from shared.errors import InvalidRequestError
from shared.job_text import PLAIN_HINT, check_text_like, rule
from shared.jobs import RequestLimits, SynthesisRequest, validate_request
from shared.settings import Settings
from shared.text_markup import MarkupError, text_file_lines
from shared.validation_messages import describe_errors, unknown_fields

SEGMENT_FORMAT = "wav"  # lossless between synthesis and assembly
SEGMENT_SAMPLE_FORMAT = "float32"
DOCUMENT_PREFIX = "documents"  # storage keys: documents/<id>/...
DOCUMENT_EXAMPLES: list[JsonValue] = [
    {
        "text": "# Chapter one\n\nIt was a bright cold day in April.\n\nThe clocks struck.",
        "markup": "markdown",
        "voice": "alice",
        "format": "mp3",
        "seed": 42,
        "metadata": {"book": "example"},
    }
]


@dataclass(frozen=True)
class DocumentLimits:
    """A document's bounds (from Settings, like RequestLimits)."""

    request: RequestLimits = field(default_factory=RequestLimits)
    max_document_chars: int = 1_000_000
    max_segments: int = 5000
    split: SplitLimits = field(default_factory=SplitLimits)
    pauses: Pauses = field(default_factory=Pauses)

    @classmethod
    def from_settings(cls, settings: Settings) -> DocumentLimits:
        request = RequestLimits.from_settings(settings)
        split = SplitLimits(
            max_chars=min(settings.document_segment_chars, settings.max_text_chars),
            max_speech_s=min(settings.document_segment_speech_s, settings.max_speech_seconds),
            max_break_s=settings.max_break_seconds,
            max_breaks=settings.max_breaks,
        )
        pauses = Pauses(
            sentence=settings.document_sentence_pause_ms / 1000,
            paragraph=settings.document_paragraph_pause_ms / 1000,
            heading=settings.document_heading_pause_ms / 1000,
        )
        return cls(
            request=request,
            max_document_chars=settings.max_document_chars,
            max_segments=settings.max_document_segments,
            split=split,
            pauses=pauses,
        )


class DocumentRequest(SynthesisRequest):
    """A long text plus a job's options (every field of `SynthesisRequest` but `stream`)."""

    model_config = ConfigDict(json_schema_extra={"examples": DOCUMENT_EXAMPLES})
    # auto: SSML when the text starts with <speak>, else plain text; a document reads two more
    # kinds than a job (markdown, ssml), so the field is wider than the job's
    markup: Markup = "auto"  # type: ignore[assignment]

    @field_validator("text")
    @classmethod
    def _check_text(cls, value: str, info: ValidationInfo) -> str:
        context = info.context or {}
        limit = context.get("max_document_chars", 1_000_000)
        return check_text_like(text_file_lines(value), limit, required=True)

    @field_validator("stream")
    @classmethod
    def _check_stream(cls, value: bool) -> bool:
        if value:
            raise rule("a document is not streamed (its segments are assembled into one file)")
        return value


@dataclass(frozen=True)
class DocumentPlan:
    """A validated document: its options and its segments, each with the job it becomes."""

    request: DocumentRequest
    segments: list[DocumentSegment]
    jobs: list[SynthesisRequest]  # per segment: seed and output key still to be set


def segment_seed(document_seed: int, index: int) -> int:
    """Segment `index`'s seed: a hash of the document's seed and the index (0..2**32-1)."""
    digest = hashlib.sha256(f"cosyq-document:{document_seed}:{index}".encode()).digest()
    return int.from_bytes(digest[:4], "little")


def segment_key(document_id: str, index: int) -> str:
    """Where segment `index`'s audio is stored (relative to the storage prefix)."""
    return f"{document_folder(document_id)}segments/{index:05d}.{SEGMENT_FORMAT}"


def document_key(document_id: str, request: DocumentRequest) -> str:
    """The assembled file's key without extension: the output key's, else documents/<id>/."""
    if request.output_key is not None:
        key = request.output_key
        suffix = "." + request.format
        return key[: -len(suffix)] if key.endswith(suffix) else key
    return document_folder(document_id) + document_id


def document_folder(document_id: str) -> str:
    """The folder of a document's own files (segments, and its file unless it names a key)."""
    return f"{DOCUMENT_PREFIX}/{document_id}/"


def validate_document(
    data: Mapping[str, Any] | DocumentRequest, limits: DocumentLimits
) -> DocumentPlan:
    """Check a document payload and split it; InvalidRequestError naming each field and rule."""
    if isinstance(data, DocumentRequest):
        data = data.model_dump()
    if not isinstance(data, Mapping):
        raise InvalidRequestError(f"document: must be a JSON object (got {type(data).__name__})")
    context = {"limits": limits.request, "max_document_chars": limits.max_document_chars}
    if (unknown := unknown_fields(data, DocumentRequest)) is not None:
        raise InvalidRequestError(unknown)
    try:
        request = DocumentRequest.model_validate(dict(data), context=context)
    except ValidationError as e:  # the first few, as a job's: every one made 690 KB of answer
        raise InvalidRequestError(describe_errors(e.errors())) from e
    try:
        segments = split_document(request.text, request.markup, limits.split, limits.pauses)
    except MarkupError as e:
        raise InvalidRequestError(f"text: {e}{_plain_hint(request)}") from e
    if not segments:
        raise InvalidRequestError("text: nothing to speak (only markup, spaces or punctuation)")
    if len(segments) > limits.max_segments:
        raise InvalidRequestError(
            f"text: {len(segments):,} segments, limit {limits.max_segments:,} "
            "(COSYQ_MAX_DOCUMENT_SEGMENTS)"
        )
    return DocumentPlan(request, segments, [_job(request, s, limits) for s in segments])


def _plain_hint(request: DocumentRequest) -> str:
    """For markup refused in a text read as `auto`, what to send if that text reads as `plain`
    (its angle brackets as characters: "List<String>", "<b>")."""
    if request.markup != "auto" or detect_markup(request.text, "auto") != "plain":
        return ""
    try:
        split_document(request.text, "plain", SplitLimits(), Pauses())
    except MarkupError:
        return ""
    return PLAIN_HINT


def _job(
    request: DocumentRequest, segment: DocumentSegment, limits: DocumentLimits
) -> SynthesisRequest:
    fields = request.model_dump(exclude={"markup", "idempotency_key", "output_key", "metadata"})
    fields.update(
        text=segment.text,
        format=SEGMENT_FORMAT,
        sample_format=SEGMENT_SAMPLE_FORMAT,
    )
    try:
        return validate_request(fields, limits.request)
    except InvalidRequestError as e:
        raise InvalidRequestError(f"segments[{segment.index}]: {e}") from e
