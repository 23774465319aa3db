"""How the command line and the OpenAI route ask for a text read as written: `cosyq say
--markup plain`, a document file named .txt (plain text by its name), `markup` in an OpenAI
speech request. Each request they make passes the contract's gate as plain."""

from __future__ import annotations

from pathlib import Path

import pytest

from producer.cli import build_parser
from producer.commands.documents import document_request
from producer.commands.submit import say_request
from producer.http.speech import job_payload, parse_speech
from shared.documents import DocumentLimits, validate_document
from shared.errors import InvalidRequestError
from shared.jobs import RequestLimits, validate_request

TEXT = "A List<String> and <b>bold</b>, then <|user|> here."


def test_say_sends_markup_plain_when_asked_and_auto_otherwise() -> None:
    args = build_parser().parse_args(["say", TEXT, "--markup", "plain"])
    request = validate_request(say_request(args), RequestLimits())
    assert (request.markup, request.text) == ("plain", TEXT)
    args = build_parser().parse_args(["say", TEXT])
    assert say_request(args)["markup"] == "auto"
    with pytest.raises(InvalidRequestError, match='send markup "plain"'):
        validate_request(say_request(args), RequestLimits())


@pytest.mark.parametrize(
    ("name", "given", "markup"),
    [
        ("notes.txt", None, "plain"),
        ("NOTES.TXT", None, "plain"),
        ("notes.txt", "auto", "auto"),  # --markup overrides the name
        ("book.md", None, "markdown"),
        ("speech.ssml", None, "ssml"),
        ("notes", None, "auto"),
    ],
)
def test_a_document_file_is_read_by_its_name_unless_markup_is_given(
    tmp_path: Path, name: str, given: str | None, markup: str
) -> None:
    source = tmp_path / name
    source.write_text(TEXT, encoding="utf-8")
    argv = ["document", "submit", str(source), *(["--markup", given] if given else [])]
    request = document_request(build_parser().parse_args(argv))
    assert request["markup"] == markup
    if markup == "plain":  # a .txt of code-like prose goes in, its brackets as words
        plan = validate_document(request, DocumentLimits())
        assert [s.plain for s in plan.segments] == [
            "A List< String> and < b>bold< /b>, then < |user|> here."
        ]


def test_openai_speech_passes_markup_to_the_job() -> None:
    body = {"model": "tts-1", "input": TEXT, "markup": "plain"}
    request = validate_request(job_payload(parse_speech(body)), RequestLimits())
    assert (request.markup, request.text) == ("plain", TEXT)
    unmarked = job_payload(parse_speech({"model": "tts-1", "input": "Hi."}))
    assert validate_request(unmarked, RequestLimits()).markup == "auto"
