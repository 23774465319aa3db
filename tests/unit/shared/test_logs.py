"""Logging: JSON lines off a TTY, console on one, stdlib and rq loggers through the same path."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator

import pytest
from rq.logutils import setup_loghandlers

from shared.logs import (
    configure_logging,
    get_logger,
    job_context,
    log_synthesis_finished,
)
from shared.results import ModelInfo, StageTimings, SynthesisResult
from shared.settings import load_settings


class TtyStream(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture(autouse=True)
def restore_root_logging() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


def lines(stream: io.StringIO) -> list[dict[str, object]]:
    return [json.loads(line) for line in stream.getvalue().splitlines()]


def test_json_lines_when_not_a_tty() -> None:
    stream = io.StringIO()
    configure_logging(load_settings(env_file=None), stream=stream)
    get_logger("cosyq.test").info("worker_ready", load_s=1.25)
    (line,) = lines(stream)
    assert line["event"] == "worker_ready" and line["load_s"] == 1.25
    assert line["level"] == "info" and line["logger"] == "cosyq.test"
    assert str(line["timestamp"]).endswith("Z")


def test_console_on_a_tty_and_json_when_forced() -> None:
    stream = TtyStream()
    configure_logging(load_settings(env_file=None), stream=stream)
    get_logger("t").info("hello", n=1)
    output = stream.getvalue()
    assert "hello" in output and "n=1" in output and not output.startswith("{")
    forced = TtyStream()
    configure_logging(load_settings(env_file=None, log_format="json"), stream=forced)
    get_logger("t").info("hello")
    assert lines(forced)[0]["event"] == "hello"


def test_stdlib_and_rq_loggers_share_the_processors() -> None:
    stream = io.StringIO()
    configure_logging(load_settings(env_file=None), stream=stream)
    setup_loghandlers("INFO")  # what rq's worker does on start: must add nothing of its own
    assert not logging.getLogger("rq.worker").handlers
    with job_context(job_id="j1", queue="cosyq-default", worker="w1"):
        logging.getLogger("rq.worker").info("%s: %s", "cosyq-default", "job started")
        logging.getLogger("botocore").warning("retrying")
    logging.getLogger("rq.worker").info("after")
    first, second, third = lines(stream)
    assert first["event"] == "cosyq-default: job started" and first["logger"] == "rq.worker"
    assert (first["job_id"], first["queue"], first["worker"]) == ("j1", "cosyq-default", "w1")
    assert second["level"] == "warning" and second["job_id"] == "j1"
    assert "job_id" not in third  # the context was cleared


def test_level_filters_both_kinds_of_logger() -> None:
    stream = io.StringIO()
    configure_logging(load_settings(env_file=None, log_level="warning"), stream=stream)
    get_logger("t").info("quiet")
    logging.getLogger("rq.worker").info("quiet too")
    get_logger("t").warning("loud")
    assert [line["event"] for line in lines(stream)] == ["loud"]


def test_reconfiguring_does_not_duplicate_lines() -> None:
    stream = io.StringIO()
    settings = load_settings(env_file=None)
    configure_logging(settings, stream=stream)
    configure_logging(settings, stream=stream)
    logging.getLogger("x").warning("once")
    assert len(lines(stream)) == 1


def test_input_text_never_reaches_the_log() -> None:
    stream = io.StringIO()
    configure_logging(load_settings(env_file=None), stream=stream)
    get_logger("t").info("oops", text="the secret sentence", prompt_text="also secret")
    logging.getLogger("y").info("oops", extra={})
    line = lines(stream)[0]
    assert "secret" not in stream.getvalue()
    assert line["text"] == "<19 chars>" and line["prompt_text"] == "<11 chars>"


def test_exceptions_are_rendered_in_json() -> None:
    stream = io.StringIO()
    configure_logging(load_settings(env_file=None), stream=stream)
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        get_logger("t").exception("job_failed")
    line = lines(stream)[0]
    assert "RuntimeError: boom" in str(line["exception"])


@pytest.mark.parametrize("stream", [io.StringIO(), TtyStream()], ids=["json", "console"])
def test_no_url_credentials_in_a_line_or_its_traceback(stream: io.StringIO) -> None:
    """A library's error may quote an endpoint with user:password@, in a value or a traceback."""
    configure_logging(load_settings(env_file=None), stream=stream)
    endpoint = "http://minio:log-pass-2W@10.0.0.5:9000/bucket"
    get_logger("t").warning("storage_failed", error=f"could not reach {endpoint}")
    logging.getLogger("botocore.t").warning("retrying %s", endpoint)
    try:
        try:
            raise ConnectionError(f"Could not connect to the endpoint URL: {endpoint!r}")
        except ConnectionError as e:
            raise RuntimeError("put failed") from e
    except RuntimeError:
        get_logger("t").exception("job_failed")
    assert "log-pass-2W" not in stream.getvalue(), stream.getvalue()
    assert stream.getvalue().count("minio:***@10.0.0.5:9000") == 3


def test_synthesis_finished_line() -> None:
    stream = io.StringIO()
    configure_logging(load_settings(env_file=None), stream=stream)
    result = SynthesisResult(
        job_id="j1",
        uri="file:///tmp/j1.wav",
        bytes=100,
        sha256="0" * 64,
        format="wav",
        sample_rate=24000,
        duration_s=2.0,
        timings=StageTimings(llm_s=0.5, flow_s=0.25, total_s=1.0),
        rtf=0.5,
        model=ModelInfo(name="cosyq-tiny", checkpoint_hash="abc"),
        backend="torch",
        device="cpu",
        worker_name="w1",
        worker_pid=123,
        attempt=1,
    )
    log_synthesis_finished(get_logger("t"), result, text_chars=42)
    line = lines(stream)[0]
    assert line["event"] == "synthesis_finished"
    assert (line["text_chars"], line["audio_s"], line["rtf"], line["llm_s"]) == (42, 2.0, 0.5, 0.5)


@pytest.mark.parametrize("stream", [io.StringIO(), TtyStream()], ids=["json", "console"])
def test_no_url_credentials_in_a_nested_value_or_an_object(stream: io.StringIO) -> None:
    """A URL inside a dict or list value, or an exception passed as a value, is masked too;
    numbers and the shape of a dict or list are kept."""
    configure_logging(load_settings(env_file=None), stream=stream)
    endpoint = "redis://:nest-pass-7Q@10.0.0.6:6379/0"
    get_logger("t").warning(
        "redis_unavailable",
        targets={"primary": endpoint, "replicas": [endpoint, ("sentinel", endpoint)]},
        error=ConnectionError(f"Error connecting to {endpoint}"),
        tries=3,
    )
    output = stream.getvalue()
    assert "nest-pass-7Q" not in output, output
    assert output.count(":***@10.0.0.6:6379") == 4
    if not isinstance(stream, TtyStream):
        (line,) = lines(stream)
        assert line["tries"] == 3
        assert line["targets"]["replicas"][1] == ["sentinel", "redis://:***@10.0.0.6:6379/0"]


HOSTILE = "\x1b]52;c;cHduZWQ\x1b\\\x1b[2J\x9b2J\u202eab\x07"  # clipboard, clear, C1 CSI, bidi, BEL


@pytest.mark.parametrize("stream", [io.StringIO(), TtyStream()], ids=["json", "console"])
def test_terminal_controls_in_a_value_or_traceback_are_escaped(stream: io.StringIO) -> None:
    """A receiver's answer, a path, an error message: what a tenant chose never reaches the
    reader's terminal as a control; on the console a value's newline starts no forged line."""
    configure_logging(load_settings(env_file=None), stream=stream)
    get_logger("t").warning("webhook_dead", reason=HOSTILE, path="/x\n2026 [info] forged")
    logging.getLogger("uvicorn.error").warning("bad %s", HOSTILE)
    try:
        raise ValueError(HOSTILE)
    except ValueError:
        get_logger("t").exception("job_failed")
    output = stream.getvalue()
    for control in ("\x1b", "\x9b", "\u202e", "\x07"):
        assert control not in output
    assert not any(line.startswith("2026 [info] forged") for line in output.splitlines())
    if isinstance(stream, TtyStream):
        assert output.count("\\u001b]52;c;cHduZWQ\\u001b") == 3  # value, message, traceback
        assert output.count("Traceback (most recent call last):\n") == 1  # its lines kept
