"""The job contract: what a backend service sends (`SynthesisRequest`) and gets back.

`validate_request` is the one gate: the producer runs it before enqueueing and the worker runs it
again on the payload it pops (anyone who can write to Redis can bypass the producer). Its errors
name the field and the rule, e.g. "text: 2,314 characters, limit 2,000".
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    JsonValue,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from shared.errors import InvalidRequestError
from shared.job_text import TextMarkup, check_markup, check_text_like, rule
from shared.keys import Priority
from shared.prompt_uris import check_prompt_uri
from shared.request_limits import RequestLimits
from shared.results import AUDIO_FORMATS, AudioFormat, SampleFormat, SynthesisResult
from shared.text_markup import (
    MarkupError,
    parse_markup,
    refuse_special_tokens,
    text_file_lines,
)
from shared.validation_messages import describe_errors, unknown_fields
from shared.webhooks import WebhookTarget, check_webhook_url

__all__ = [
    "NATIVE_SAMPLE_RATE",
    "SUPPORTED_SAMPLE_RATES",
    "RequestLimits",
    "SynthesisRequest",
    "SynthesisResult",
    "check_output_key",
    "check_prompt_uri",
    "describe_errors",
    "validate_request",
    "wire_request",
]

Mode = Literal["zero_shot", "cross_lingual", "instruct2"]
DEFAULT_VOICE = "default"  # the model directory's prompt.wav/prompt.txt: never stored in Redis
# Of the text, for normalisation (auto: detected); ko and yue (Cantonese) as `normalizer.READ_AS`.
Language = Literal["auto", "en", "zh", "ja", "ko", "yue"]
END_OF_PROMPT = "<|endofprompt|>"  # instruct2's separator: the worker adds it

NATIVE_SAMPLE_RATE = 24000  # CosyVoice 2's HiFT output rate
SUPPORTED_SAMPLE_RATES = (8000, 16000, 22050, 24000, 44100, 48000)
OPUS_SAMPLE_RATES = (8000, 16000, 24000, 48000)  # of ours, those Opus encodes (it has no 22.05k)
MIN_SPEED, MAX_SPEED = 0.5, 2.0
MAX_SEED = 2**32 - 1  # numpy's and every backend's generators accept this range
OnSuspect = Literal["retry", "fail", "accept"]
ON_SUSPECT: tuple[str, ...] = ("retry", "fail", "accept")
# Loudness targets: -50 LUFS is already barely audible; above -5 LUFS nothing fits under a
# true-peak ceiling without heavy limiting. Ceilings: 0 dBTP is full scale, -20 is far below
# any delivery spec (EBU R128: -1, podcasts -1 to -2).
MIN_LOUDNESS_LUFS, MAX_LOUDNESS_LUFS = -50.0, -5.0
MIN_TRUE_PEAK_DBTP, MAX_TRUE_PEAK_DBTP = -20.0, 0.0
DEFAULT_TRUE_PEAK_DBTP = -1.0
MAX_IDEMPOTENCY_KEY_CHARS = 255
VOICE_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
OUTPUT_KEY_CHARS_RE = re.compile(r"[A-Za-z0-9._\-=+@,/]+")
NUMERIC_FIELDS = (  # never a boolean
    "schema_version",
    "speed",
    "seed",
    "sample_rate",
    "loudness_lufs",
    "true_peak_dbtp",
)


# The contract's examples (published in the HTTP front's OpenAPI schema, and sent to a real
# front by its test): the least, and most fields a service sets, webhook included.
SYNTHESIS_EXAMPLES: list[JsonValue] = [
    {"text": "Your order has shipped."},
    {
        "text": '<speak>Hello <break time="300ms"/> there.</speak>',
        "voice": "alice",
        "language": "en",
        "format": "mp3",
        "sample_rate": 48000,
        "seed": 7,
        "priority": "high",
        "idempotency_key": "order-1234-shipped",
        "output_key": "orders/1234/shipped.mp3",
        "metadata": {"order": 1234},
        "webhook": {"url": "https://hooks.example.com/cosyq"},
        "loudness_lufs": -16.0,
        "on_suspect": "retry",
    },
    {
        "text": "Read this slowly.",
        "mode": "instruct2",
        "instruction": "Speak slowly and calmly.",
        "stream": True,
        "format": "wav",
    },
    {"text": "Call size() on a List<String>.", "markup": "plain"},
]


def _limits(info: ValidationInfo) -> RequestLimits:
    context = info.context or {}
    limits = context.get("limits")
    return limits if isinstance(limits, RequestLimits) else RequestLimits()


def check_output_key(key: str, limit: int) -> str:
    """Reject any key that could escape the storage prefix; returns the key unchanged.

    Raises ValueError naming the rule (used for requests and again by `Storage.put`).
    """
    if not key:
        raise ValueError("must not be empty")
    if len(key) > limit:
        raise ValueError(f"{len(key):,} characters, limit {limit:,}")
    if "\\" in key:
        raise ValueError("backslashes are not allowed")
    if key.startswith("/") or key.startswith("~") or re.match(r"[A-Za-z]:", key):
        raise ValueError("must be a relative key, not an absolute path")
    segments = key.split("/")
    if any(segment in ("..", ".") for segment in segments):
        raise ValueError("'..' and '.' segments are not allowed")
    if any(segment == "" for segment in segments):
        raise ValueError("empty segments ('//' or a trailing '/') are not allowed")
    if not OUTPUT_KEY_CHARS_RE.fullmatch(key):
        raise ValueError("only letters, digits and . _ - = + @ , / are allowed")
    return key


class SynthesisRequest(BaseModel):
    """One text to synthesize and how. Version 1 of the contract; unknown fields are refused."""

    model_config = ConfigDict(
        extra="forbid", frozen=True, json_schema_extra={"examples": SYNTHESIS_EXAMPLES}
    )

    schema_version: Literal[1] = 1
    # how `text` is read (before it, so its check knows): auto, markup as described; plain,
    # every angle bracket as written ("List<String>", "<|user|>": words, never tags or tokens)
    markup: TextMarkup = "auto"
    text: str
    voice: str | None = None  # a registered voice; None with no prompt_audio: voice "default"
    prompt_audio: str | None = None  # file:// or s3:// URI, read by the worker
    prompt_text: str | None = None  # the transcript of prompt_audio
    mode: Mode = "zero_shot"
    language: Language = "auto"  # auto: the text's script, else the voice transcript's, else en
    instruction: str | None = None  # instruct2 only, e.g. "speak slowly and calmly"
    speed: float = Field(1.0, strict=True)  # an int is still taken: 1 is 1.0
    seed: int | None = Field(None, strict=True)
    format: AudioFormat = "wav"
    sample_format: SampleFormat = "pcm16"  # wav only: pcm16 or float32
    sample_rate: int = Field(NATIVE_SAMPLE_RATE, strict=True)
    output_key: str | None = None
    idempotency_key: str | None = None
    priority: Priority = "default"
    stream: bool = Field(False, strict=True)  # append audio chunks to cosyq:audio:<job id>
    metadata: dict[str, JsonValue] = Field(default_factory=dict)
    webhook: WebhookTarget | None = None  # told when the job ends (shared/webhooks.py)
    on_suspect: OnSuspect | None = None  # suspect audio: retry, fail, accept (None: setting)
    loudness_lufs: float | None = None  # normalise to this integrated loudness before encoding
    true_peak_dbtp: float | None = None  # the ceiling with loudness_lufs (None: -1 dBTP)
    trim_silence: bool = Field(False, strict=True)  # cut leading/trailing silence (a margin kept)

    @field_validator("loudness_lufs", "true_peak_dbtp")
    @classmethod
    def _check_level(cls, value: float | None, info: ValidationInfo) -> float | None:
        if value is None:
            return None
        low, high = (
            (MIN_LOUDNESS_LUFS, MAX_LOUDNESS_LUFS)
            if info.field_name == "loudness_lufs"
            else (MIN_TRUE_PEAK_DBTP, MAX_TRUE_PEAK_DBTP)
        )
        if not low <= value <= high:  # also false for NaN
            unit = "LUFS" if info.field_name == "loudness_lufs" else "dBTP"
            raise rule(f"{value} is outside {low:g} to {high:g} {unit}")
        return value

    @field_validator(*NUMERIC_FIELDS, mode="before")
    @classmethod
    def _refuse_booleans(cls, value: object) -> object:
        """JSON's true is not 1: pydantic takes it for a number (and a Literal[1]) otherwise."""
        if isinstance(value, bool):
            raise rule(f"must be a number, not {str(value).lower()}")
        return value

    @field_validator("text")
    @classmethod
    def _check_text(cls, value: str, info: ValidationInfo) -> str:
        limits = _limits(info)
        value = check_text_like(text_file_lines(value), limits.max_text_chars, required=True)
        markup = info.data.get("markup")
        if markup is None:  # refused itself (its own error says why): nothing to read as
            return value
        return check_markup(value, markup, limits)

    @field_validator("prompt_text", "instruction")
    @classmethod
    def _check_optional_text(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is None:
            return None
        value = check_text_like(value, _limits(info).max_text_chars, required=True)
        try:
            if info.field_name == "instruction":  # may end with the separator; we add it anyway
                refuse_special_tokens(value.removesuffix(END_OF_PROMPT))
            else:  # a transcript: control tags only, no pauses
                parse_markup(value, allow_breaks=False)
        except MarkupError as e:
            raise rule(str(e)) from e
        return value

    @field_validator("voice")
    @classmethod
    def _check_voice(cls, value: str | None) -> str | None:
        if value is not None and not VOICE_NAME_RE.fullmatch(value):
            raise rule("1-64 letters, digits, '_', '.' or '-', starting with a letter or digit")
        return value

    @field_validator("prompt_audio")
    @classmethod
    def _check_prompt_audio(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is None:
            return None
        try:
            return check_prompt_uri(value, _limits(info).max_output_key_chars)
        except ValueError as e:
            raise rule(str(e)) from e

    @field_validator("speed")
    @classmethod
    def _check_speed(cls, value: float) -> float:
        if not MIN_SPEED <= value <= MAX_SPEED:  # also false for NaN
            raise rule(f"{value} is outside {MIN_SPEED}-{MAX_SPEED}")
        return value

    @field_validator("seed")
    @classmethod
    def _check_seed(cls, value: int | None) -> int | None:
        if value is not None and not 0 <= value <= MAX_SEED:
            raise rule(f"{value} is outside 0-{MAX_SEED:,}")
        return value

    @field_validator("sample_rate")
    @classmethod
    def _check_sample_rate(cls, value: int) -> int:
        if value not in SUPPORTED_SAMPLE_RATES:
            rates = ", ".join(str(rate) for rate in SUPPORTED_SAMPLE_RATES)
            raise rule(f"{value} Hz is not supported; use one of {rates}")
        return value

    @field_validator("output_key")
    @classmethod
    def _check_output_key(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is None:
            return None
        try:
            return check_output_key(value, _limits(info).max_output_key_chars)
        except ValueError as e:
            raise rule(str(e)) from e

    @field_validator("idempotency_key")
    @classmethod
    def _check_idempotency_key(cls, value: str | None) -> str | None:
        if value is None:
            return None
        if not value or len(value) > MAX_IDEMPOTENCY_KEY_CHARS:
            raise rule(f"{len(value)} characters, must be 1-{MAX_IDEMPOTENCY_KEY_CHARS}")
        if not value.isprintable():
            raise rule("must be printable characters only")
        return value

    @field_validator("metadata", mode="before")
    @classmethod
    def _check_metadata_depth(cls, value: object, info: ValidationInfo) -> object:
        """Before pydantic walks it: a deep tree would give a message naming every level, or
        exhaust the stack."""
        limit = _limits(info).max_metadata_depth
        if nested_deeper(value, limit):
            raise rule(f"nested more than {limit} levels deep (COSYQ_MAX_METADATA_DEPTH)")
        return value

    @field_validator("metadata")
    @classmethod
    def _check_metadata(cls, value: dict[str, Any], info: ValidationInfo) -> dict[str, Any]:
        try:
            text = json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
            size = len(text.encode("utf-8"))
        except UnicodeEncodeError:
            raise rule("not valid UTF-8 (an unpaired surrogate)") from None
        except (ValueError, RecursionError):  # NaN/Infinity, an int too long to print
            raise rule("not representable as JSON (NaN, Infinity or a huge number)") from None
        limit = _limits(info).max_metadata_bytes
        if size > limit:
            raise rule(f"{size:,} bytes as JSON, limit {limit:,}")
        return value

    @field_validator("webhook")
    @classmethod
    def _check_webhook(
        cls, value: WebhookTarget | None, info: ValidationInfo
    ) -> WebhookTarget | None:
        if value is None:
            return None
        limits = _limits(info)
        try:
            check_webhook_url(
                value.url,
                limits.webhook_allowed_urls,
                allow_private=limits.webhook_allow_private,
                resolve_names=limits.webhook_resolve_names,
            )
        except ValueError as e:
            raise rule(str(e)) from e
        return value

    @model_validator(mode="after")
    def _check_combinations(self) -> SynthesisRequest:
        problems = _combination_problems(self)
        if problems:
            raise rule("; ".join(problems))
        return self


def instruction_problem(mode: str, instruction: str | None) -> str | None:
    """The mode/instruction rule (the engine applies the same one): "field: rule" or None."""
    if mode == "instruct2" and (instruction is None or not instruction.strip()):
        return "instruction: required by mode instruct2"
    if mode != "instruct2" and instruction is not None:
        return f"instruction: only used by mode instruct2 (mode is {mode})"
    return None


def voice_label(request: SynthesisRequest) -> str:
    """How logs and status displays name a request's voice (never its audio or text)."""
    if request.voice is not None:
        return request.voice
    return "inline prompt" if request.prompt_audio is not None else DEFAULT_VOICE


def retry_intervals(max_retries: int, base_s: float) -> list[int]:
    """Seconds before retry k (1-based): base * 2**(k-1), whole seconds as RQ stores them."""
    return [max(0, round(base_s * 2**k)) for k in range(max_retries)]


def _processing_problems(request: SynthesisRequest) -> list[str]:
    """Loudness, trimming and suspect retries work on the whole utterance: a stream's chunks
    leave before it exists."""
    problems = []
    if request.true_peak_dbtp is not None and request.loudness_lufs is None:
        problems.append("true_peak_dbtp: only used with loudness_lufs")
    if request.stream:
        for name in ("loudness_lufs", "trim_silence"):
            if getattr(request, name) not in (None, False):
                problems.append(f"{name}: not with stream (chunks leave before the whole exists)")
        if request.on_suspect == "retry":
            problems.append("on_suspect: retry needs stream false (the chunks are already out)")
    return problems


def _combination_problems(request: SynthesisRequest) -> list[str]:
    """Rules across fields, each phrased "field: rule"."""
    problems = []
    if request.voice is not None and request.prompt_audio is not None:
        problems.append("voice: give either voice or prompt_audio, not both")
    if request.prompt_text is not None and request.prompt_audio is None:
        problems.append("prompt_text: only used with prompt_audio (a voice has its transcript)")
    if request.mode == "zero_shot" and request.prompt_audio and request.prompt_text is None:
        problems.append("prompt_text: required by mode zero_shot with prompt_audio")
    if (problem := instruction_problem(request.mode, request.instruction)) is not None:
        problems.append(problem)
    problems.extend(_processing_problems(request))
    if request.sample_format == "float32" and request.format != "wav":
        problems.append(f"sample_format: float32 needs format wav (format is {request.format})")
    if request.format == "opus" and request.sample_rate not in OPUS_SAMPLE_RATES:
        rates = ", ".join(str(rate) for rate in OPUS_SAMPLE_RATES)
        problems.append(f"sample_rate: format opus takes {rates} Hz (got {request.sample_rate})")
    if request.stream and request.speed != 1.0:
        problems.append(f"speed: streaming needs speed 1.0 (got {request.speed:g})")
    if request.output_key is not None:
        suffix = request.output_key.rsplit("/", 1)[-1].rpartition(".")[2]
        if suffix in AUDIO_FORMATS and suffix != request.format:
            problems.append(f"output_key: ends in .{suffix} but format is {request.format}")
    return problems


def nested_deeper(value: object, limit: int) -> bool:
    """True if `value` has lists or objects over `limit` levels deep (itself: 1), no recursion."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, Mapping | list | tuple):
            if depth > limit:
                return True
            children = item.values() if isinstance(item, Mapping) else item
            stack.extend((child, depth + 1) for child in children)
    return False


def wire_request(request: SynthesisRequest) -> dict[str, Any]:
    """The request as its job carries it: the contract's version, then only the fields set to
    other than their defaults. A worker of an earlier release refuses a field it does not know
    (extra="forbid"), so a field added since (`markup` after 5e9718f) fails only the jobs that
    ask for it, loudly, never every job a front of the later release queues (README
    "Upgrading"); the worker's `validate_request` puts the defaults back."""
    fields = request.model_dump(mode="json", exclude_defaults=True)
    return {"schema_version": request.schema_version, **fields}


def validate_request(
    data: Mapping[str, Any] | SynthesisRequest, limits: RequestLimits
) -> SynthesisRequest:
    """Check a request payload against the contract and the limits; the producer and the worker
    both call this. Raises InvalidRequestError naming each field and rule that failed."""
    if isinstance(data, SynthesisRequest):
        data = data.model_dump()
    if not isinstance(data, Mapping):
        raise InvalidRequestError(f"request: must be a JSON object (got {type(data).__name__})")
    if (unknown := unknown_fields(data, SynthesisRequest)) is not None:
        raise InvalidRequestError(unknown)
    try:
        return SynthesisRequest.model_validate(dict(data), context={"limits": limits})
    except ValidationError as e:
        raise InvalidRequestError(describe_errors(e.errors())) from e
