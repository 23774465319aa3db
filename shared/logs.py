"""structlog set up once per process: JSON lines off a TTY, a readable console on one.

Python's own loggers (rq, botocore, ...) go through the same processors via one root handler, so
every line of a process has the same shape. Call `configure_logging` before constructing an rq
worker: rq only installs its own handler when none is in effect. Input text is never logged; a
processor replaces any `text`, `prompt_text` or `instruction` value with its length, in case one
slips into an event by mistake. The console prints plain tracebacks: structlog's rich ones
would print each frame's locals, a request's text among them. The S3 client's loggers stay at
INFO or above even at DEBUG: theirs print request headers, credentials among them. So do RQ's
own lines (its DEBUG prints each job's return value: an add-voice job's transcript, a result's
metadata); ours keep DEBUG. Every URL in a line or its traceback is shown with its password
masked (`redact_urls`). On the console every control character and bidi override in a value
is written as its `\\uXXXX` escape (`escape_for_terminal`): a URL path, a receiver's answer
or an error message a tenant chose never drives the operator's terminal or forges a line.
JSON lines need nothing: the JSON encoder escapes the same characters.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any, TextIO


def _import_structlog_without_rich() -> None:
    """Import structlog with `rich` hidden, when nothing has imported either yet.

    structlog imports rich (and through it pygments) at import time for its optional rich
    tracebacks: about 0.1 s of every worker start (0.3 s on a loaded host), for output that is
    JSON lines in production and a plain console (`configure_logging` names structlog's plain
    traceback, whatever was imported first). A None in
    sys.modules makes `import rich` fail inside structlog only; rich stays importable after it.
    """
    if "structlog" in sys.modules or "rich" in sys.modules:
        return
    sys.modules["rich"] = None  # type: ignore[assignment]
    try:
        import structlog  # noqa: F401, PLC0415
    finally:
        del sys.modules["rich"]


_import_structlog_without_rich()

import structlog  # noqa: E402
from structlog.typing import EventDict, Processor, WrappedLogger  # noqa: E402

from shared.results import SynthesisResult  # noqa: E402
from shared.settings import Settings  # noqa: E402
from shared.settings_env import redact_urls  # noqa: E402
from shared.terminal import shown  # noqa: E402

JOB_CONTEXT_KEYS = ("job_id", "queue", "voice", "worker", "attempt", "tenant")
REDACTED_KEYS = frozenset({"text", "prompt_text", "instruction"})
MULTILINE_KEYS = frozenset({"exception", "stack"})  # a traceback's lines are its own
_HANDLER_NAME = "cosyq"
# Never below INFO, whatever COSYQ_LOG_LEVEL: at DEBUG they print each request's headers
# (botocore: Authorization with the S3 key id, X-Amz-Security-Token, the session token itself).
CREDENTIAL_LOGGERS = ("botocore", "boto3", "s3transfer", "urllib3")


def redact_input_text(_: WrappedLogger, __: str, event_dict: EventDict) -> EventDict:
    """Replace request text fields with their length: text must never reach a log."""
    for key in REDACTED_KEYS & event_dict.keys():
        value = event_dict[key]
        event_dict[key] = f"<{len(value)} chars>" if isinstance(value, str) else "<redacted>"
    return event_dict


def redact_url_credentials(_: WrappedLogger, __: str, event_dict: EventDict) -> EventDict:
    """Mask every URL's password in each value and the traceback: a library's error may
    quote an endpoint with user:password@ (botocore does), a redis one ?password=."""
    for key, value in event_dict.items():
        event_dict[key] = _masked(value)
    return event_dict


def _masked(value: Any) -> Any:
    """`value` with every URL's password masked: text itself, the text in a dict, list or
    tuple at any depth, and any other object as the repr both renderers would print of it
    (an exception passed as a value, say, quoting its endpoint)."""
    if isinstance(value, str):
        return redact_urls(value)
    if value is None or isinstance(value, int | float):
        return value
    if isinstance(value, dict):
        return {_masked(k): _masked(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        masked = [_masked(v) for v in value]
        return tuple(masked) if isinstance(value, tuple) else masked
    return redact_urls(repr(value))


def escape_for_terminal(_: WrappedLogger, __: str, event_dict: EventDict) -> EventDict:
    """The console's last step before rendering: each text value with its terminal controls
    escaped, newlines too; a traceback keeps its newlines (its own lines), nothing else.
    Other values are printed as their repr, which escapes the same characters."""
    for key, value in event_dict.items():
        if isinstance(value, str):
            event_dict[key] = shown(value, one_line=key not in MULTILINE_KEYS)
    return event_dict


def _use_json(settings: Settings, stream: TextIO) -> bool:
    if settings.log_format != "auto":
        return settings.log_format == "json"
    isatty = getattr(stream, "isatty", None)
    return not (callable(isatty) and isatty())


def configure_logging(settings: Settings, *, stream: TextIO | None = None) -> None:
    """Route structlog and stdlib logging to `stream` (stdout by default) at settings.log_level.

    Safe to call again (tests, CLI): the previous cosyq handler is replaced, not duplicated.
    """
    stream = stream if stream is not None else sys.stdout
    shared: list[Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.add_log_level,
        structlog.stdlib.add_logger_name,
        structlog.stdlib.PositionalArgumentsFormatter(),
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        structlog.processors.StackInfoRenderer(),
        redact_input_text,
    ]
    json_lines = _use_json(settings, stream)
    renderer: Processor = (
        structlog.processors.JSONRenderer()
        if json_lines
        else structlog.dev.ConsoleRenderer(
            colors=False, exception_formatter=structlog.dev.plain_traceback
        )
    )
    final: list[Processor] = [
        structlog.stdlib.ProcessorFormatter.remove_processors_meta,
        structlog.processors.format_exc_info,  # the traceback as text, then masked
        redact_url_credentials,
    ]
    if not json_lines:
        final.append(escape_for_terminal)
    structlog.configure(
        processors=[structlog.stdlib.filter_by_level, *shared, _to_formatter],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=False,
    )
    handler = logging.StreamHandler(stream)
    handler.set_name(_HANDLER_NAME)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(foreign_pre_chain=shared, processors=[*final, renderer])
    )
    _install_root_handler(handler, settings.log_level)


_to_formatter = structlog.stdlib.ProcessorFormatter.wrap_for_formatter


def _no_rq_debug(record: logging.LogRecord) -> bool:
    """RQ's records below INFO are dropped, whatever level its `work()` set on its loggers."""
    return record.levelno >= logging.INFO or record.name.split(".", 1)[0] != "rq"


def _install_root_handler(handler: logging.Handler, level: str) -> None:
    handler.addFilter(_no_rq_debug)
    root = logging.getLogger()
    for old in [h for h in root.handlers if h.get_name() == _HANDLER_NAME]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
    for name in CREDENTIAL_LOGGERS:
        logging.getLogger(name).setLevel(max(logging.INFO, root.level))
    for name in ("rq", "rq.worker", "rq.queue", "rq.job"):
        # Drop handlers rq may have installed before us, and let records reach the root.
        logger = logging.getLogger(name)
        for own in list(logger.handlers):
            logger.removeHandler(own)
        logger.propagate = True
        logger.setLevel(logging.NOTSET)  # the root's level rules (rq's work() may set its own)


def get_logger(name: str) -> Any:
    """A structlog logger named like a stdlib one (`get_logger(__name__)`)."""
    return structlog.stdlib.get_logger(name)


def bind_job_context(
    *,
    job_id: str,
    queue: str | None = None,
    voice: str | None = None,
    worker: str | None = None,
    attempt: int | None = None,
    tenant: str | None = None,
) -> None:
    """Bind the current job's identity to every log line until `clear_job_context`."""
    clear_job_context()
    values: dict[str, Any] = {"job_id": job_id, "queue": queue, "voice": voice}
    values.update(worker=worker, attempt=attempt, tenant=tenant)
    structlog.contextvars.bind_contextvars(**{k: v for k, v in values.items() if v is not None})


def clear_job_context() -> None:
    structlog.contextvars.unbind_contextvars(*JOB_CONTEXT_KEYS)


@contextmanager
def job_context(**values: Any) -> Iterator[None]:
    """`with job_context(job_id=..., queue=...):` binds for the block and always clears."""
    bind_job_context(**values)
    try:
        yield
    finally:
        clear_job_context()


def log_synthesis_finished(
    logger: Any,
    result: SynthesisResult,
    *,
    text_chars: int,
    extra: Mapping[str, Any] | None = None,
) -> None:
    """The one canonical per-job line: lengths, audio seconds, RTF and stage timings."""
    logger.info(
        "synthesis_finished",
        text_chars=text_chars,
        audio_s=round(result.duration_s, 3),
        rtf=round(result.rtf, 4),
        speech_tokens=result.speech_tokens,
        format=result.format,
        sample_rate=result.sample_rate,
        bytes=result.bytes,
        uri=result.uri,
        **{k: round(v, 4) for k, v in result.timings.model_dump().items() if v is not None},
        **(extra or {}),
    )
