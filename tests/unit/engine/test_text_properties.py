"""Whatever text the request gate lets through, the text front end either turns into token ids
or refuses with InvalidRequestError (nothing speakable): never a library error."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from shared.errors import InvalidRequestError
from shared.jobs import RequestLimits, validate_request
from workers.engine.text_frontend import TextFrontend
from workers.model.directory import QWEN_DIR
from workers.model.tokenizer import load_text_tokenizer

any_char = st.characters(codec=None, exclude_categories=())  # surrogates included
texts = st.one_of(
    st.text(any_char, min_size=1, max_size=60),
    st.sampled_from(["\ud800 hello", "$4.50 on 2024-01-02", "<|en|>hi", "12:30 3.14 100%", "。"]),
)


@pytest.fixture(scope="module")
def frontend(tiny_model_dir: Path) -> TextFrontend:
    return TextFrontend(load_text_tokenizer(tiny_model_dir / QWEN_DIR))


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(text=texts)
@example(text="0+")  # wetext asserts on it: found by this test
def test_gated_text_becomes_tokens_or_a_rejection(frontend: TextFrontend, text: str) -> None:
    try:
        request = validate_request(
            {"text": text, "prompt_audio": "file:///p.wav", "prompt_text": text},
            RequestLimits(),
        )
    except InvalidRequestError:
        return
    assert request.prompt_text is not None
    try:
        pieces = frontend.pieces(request.text, language=request.language)
    except InvalidRequestError as e:
        assert str(e).startswith("text: ")
    else:
        assert pieces and all(piece.ids for piece in pieces)
    for encode, field in (
        (frontend.prompt_text_ids, "prompt_text: "),
        (frontend.instruction_ids, "instruction: "),
    ):
        try:
            assert isinstance(encode(request.prompt_text), list)
        except InvalidRequestError as e:
            assert str(e).startswith(field)
